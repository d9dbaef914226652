"""The budget rule of a press that never evicts its newest positions (RMM's provisional buffer, a recent window):
a budget must hold them and one position more."""

from __future__ import annotations


def protected_refusal(press: str, parameter: str, count: int, kept: int) -> str:
    """Why ``press``, which never evicts its ``count`` newest positions (its ``parameter``), cannot keep ``kept``
    positions ("" when it can)."""
    if count < kept:
        return ""
    return (
        f"{press}({parameter}={count}) never evicts its {count} newest positions, but the budget keeps only {kept}: "
        f"use a {parameter} below {kept} or keep more positions"
    )
