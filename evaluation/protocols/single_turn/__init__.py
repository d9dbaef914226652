"""What single-turn protocols share (LongBench, RULER, needle-in-a-haystack, KVPress's datasets): the cells of one
example, each a press at a budget over one prompt."""
