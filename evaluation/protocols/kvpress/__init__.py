"""Single-turn examples in KVPress's evaluation columns: the format, its prompt, and the ``kvpress`` protocol."""
