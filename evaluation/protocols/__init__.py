"""The protocols: LongBench, the streaming protocol and its tasks (LoCoMo, the synthetic families), the eviction
lab (``traces``) and the section-7 probe."""
