"""What a wrapper press holds: KVPress's wrappers keep their presses in attributes (``press``, ``presses``,
``base_press``, ``prefilling_press``...), dataclass fields or not (``CriticalKVPress`` is a plain class)."""

from __future__ import annotations

from kvpress.presses.base_press import BasePress


def inner_presses(press: BasePress) -> list[BasePress]:
    """The presses ``press`` holds directly."""
    found = []
    for value in vars(press).values():
        items = value if isinstance(value, (list, tuple)) else [value]
        found += [item for item in items if isinstance(item, BasePress)]
    return found


def every_press(press: BasePress) -> list[BasePress]:
    """The press and every press it holds, depth first."""
    return [press] + [inner for held in inner_presses(press) for inner in every_press(held)]
