"""The LongBench v1 single-turn protocol: data, prompts, and the grid runner."""
