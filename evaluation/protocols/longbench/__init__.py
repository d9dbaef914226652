"""The LongBench v1 single-turn protocol: the protocol (``protocol``), its work (``work``), its cells
(``cells``), data and prompts."""
