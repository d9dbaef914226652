"""The named presses the evaluation protocols compare, and the attention implementation each one needs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvpress import ObservedAttentionPress, ScorerPress, SnapKVPress, StreamingLLMPress
from kvpress import TOVAPress as KVPressTOVAPress

from evaluation.errors import EvaluationError
from presses import RMMPress, TOVAPress

FULL_CACHE = "full"


@dataclass(frozen=True)
class PressSpec:
    """How to build a press by name, and whether it can only work with eager attention weights."""

    build: Callable[[], ScorerPress]
    needs_eager: bool = False


PRESSES: dict[str, PressSpec] = {
    "snapkv": PressSpec(SnapKVPress),
    "h2o": PressSpec(ObservedAttentionPress, needs_eager=True),
    "streaming_llm": PressSpec(StreamingLLMPress),
    "tova-kvpress": PressSpec(KVPressTOVAPress),
    "tova": PressSpec(TOVAPress),
    "rmm": PressSpec(RMMPress),
}
PRESS_NAMES = (FULL_CACHE, *PRESSES)


def check_presses(names: list[str]) -> None:
    unknown = [name for name in names if name not in PRESS_NAMES]
    if unknown:
        raise EvaluationError(f"unknown press(es) {unknown}; known presses: {', '.join(PRESS_NAMES)}")


def make_press(name: str, compression_ratio: float) -> ScorerPress | None:
    """A fresh press at ``compression_ratio``; None for the full cache."""
    if name == FULL_CACHE:
        return None
    press = PRESSES[name].build()
    press.compression_ratio = compression_ratio
    return press


def attn_implementation(name: str) -> str:
    """Eager only where a press cannot work without the attention weights; sdpa otherwise."""
    return "eager" if name in PRESSES and PRESSES[name].needs_eager else "sdpa"
