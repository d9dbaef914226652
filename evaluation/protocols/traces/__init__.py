"""The eviction lab: attention traces of a real model, policies replayed on them against Belady, and the
paper's controlled model of delayed utility."""

DEFAULT_THRESHOLD = 0.01  # a position is requested (used) at step t when it receives at least this attention
H2O_WINDOW = 32  # recent_window(h2o,window=W)'s W: an illustrative recent window, in the spirit of H2O's
