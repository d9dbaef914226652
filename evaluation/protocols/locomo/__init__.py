"""The LoCoMo streaming multi-turn protocol: its data, rendering, and the task registered with the streaming
protocol."""
