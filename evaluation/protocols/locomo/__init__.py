"""The LoCoMo streaming multi-turn protocol: data, rendering, the incremental history, and the runner."""
