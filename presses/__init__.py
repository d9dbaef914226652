"""KVPress presses for test-time KV-cache eviction research: TOVA and RMM, and H2O's recent window as a wrapper.

Each press is imported when first named, so that a press brings only what its rule needs (``from presses import
TOVAPress`` loads none of RMM's smoother or teacher forcing). The evaluation harness imports what it uses of the
package through ``presses.harness``.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from presses.recent_window_press import RecentWindowPress
    from presses.rmm_press import RMMPress
    from presses.tova_press import TOVAPress

__all__ = ["RMMPress", "RecentWindowPress", "TOVAPress"]
_MODULES = {
    "RMMPress": "presses.rmm_press",
    "RecentWindowPress": "presses.recent_window_press",
    "TOVAPress": "presses.tova_press",
}


def __getattr__(name: str) -> type:
    if name not in _MODULES:
        raise AttributeError(f"module 'presses' has no attribute {name!r}")
    return getattr(import_module(_MODULES[name]), name)
