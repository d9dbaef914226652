"""The official scoring rules of the benchmarks, re-implemented from their published description."""
