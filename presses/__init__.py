"""KVPress presses for test-time KV-cache eviction research: TOVA and RMM, and H2O's recent window as a wrapper."""

from presses.recent_window_press import RecentWindowPress
from presses.rmm_press import RMMPress
from presses.tova_press import TOVAPress

__all__ = ["RMMPress", "RecentWindowPress", "TOVAPress"]
