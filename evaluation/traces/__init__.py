"""The eviction lab: attention traces of a real model, policies replayed on them against Belady, and the
paper's controlled model of delayed utility."""
