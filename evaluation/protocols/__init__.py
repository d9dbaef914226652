"""The protocols: the base class and registry (``protocol``), the one run loop (``loop``), option types
(``options``); LongBench, the streaming protocol and its tasks (LoCoMo, the synthetic families), the eviction lab
(``traces``) and the section-7 probe."""
