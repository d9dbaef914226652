"""The engine every protocol shares: one uncompressed prefill (``history``), every press's own hook run on what
it stored (``hooks``), the rows a turn's forward keeps for it (``fused_rows``)."""
