"""KVPress presses for test-time KV-cache eviction research: TOVA and RMM."""

from presses.rmm_press import RMMPress
from presses.tova_press import TOVAPress

__all__ = ["RMMPress", "TOVAPress"]
