"""What a press reads from the network when it is applied to a model, per press class, and where it is known not to
exist for a model: a dry run names it, a real run refuses such a press before the model loads.

KVPress's presses fetch these in ``post_init_from_model``, named after the model's hub id (its ``name_or_path``):
a press built for a model the files do not cover fails only once the model has loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import kvpress as k
from kvpress.presses.base_press import BasePress
from kvpress.presses.duo_attention_press import PATTERNS_DICT
from kvpress.presses.lukv_press import BUDGET_CURVE_URLS

from presses.harness import every_press


def _covered(press: BasePress, model: str) -> str:
    return ""


@dataclass(frozen=True)
class Download:
    """What a press class fetches (``what``, in words, of a press), and why it cannot for a model (``missing``:
    "" when the files may exist)."""

    what: Callable[[BasePress], str]
    missing: Callable[[BasePress, str], str] = _covered


def _duo_what(press: k.DuoAttentionPress) -> str:
    if press.on_the_fly_scoring:
        return "the kmfoda/booksum dataset from the hub, to score the heads on the fly"
    return "DuoAttention's head patterns for the model from github.com/mit-han-lab/duo-attention"


def _duo_missing(press: k.DuoAttentionPress, model: str) -> str:
    if press.on_the_fly_scoring or model in PATTERNS_DICT:
        return ""
    return (
        f"DuoAttention has head patterns for {len(PATTERNS_DICT)} hub models only, not {model}: use "
        "duo_attention(on_the_fly_scoring=True)"
    )


def _lukv_missing(press: k.LUKVPress, model: str) -> str:
    if (model, type(press.press).__name__) in BUDGET_CURVE_URLS:
        return ""
    return f"LU-KV has budget curves for {sorted({m for m, _ in BUDGET_CURVE_URLS})} only, not {model} with this scorer"


def _stats_what(press: k.ExpectedAttentionStatsPress) -> str:
    return "" if press.stats_folder is not None else "query statistics for the model from the hub"


DOWNLOADS: dict[type, Download] = {
    k.DuoAttentionPress: Download(_duo_what, _duo_missing),
    k.QFilterPress: Download(lambda press: "the model's Q-filters from the hub (nthngdy/<model>_qfilt)"),
    k.KVzapPress: Download(lambda press: f"KVzap's {press.model_type} scorer from the hub (nvidia/KVzap-*-<model>)"),
    k.FastKVzipPress: Download(lambda press: "Fast-KVzip's gates for the model from the hub (Jang-Hyun/Fast-KVzip)"),
    k.LUKVPress: Download(lambda press: "LU-KV's budget curve for the model and its scorer", _lukv_missing),
    k.RestoreKVPress: Download(lambda press: "RestoreKV's embeddings and adapter from the hub (higokri/RestoreKV-*)"),
    k.ExpectedAttentionStatsPress: Download(_stats_what),
}


def fetched(press: BasePress | None) -> tuple[str, ...]:
    """What ``press`` (and every press it holds) fetches when it is applied to a model, in words."""
    held = every_press(press) if press is not None else []
    found = (DOWNLOADS[type(p)].what(p) for p in held if type(p) in DOWNLOADS)
    return tuple(dict.fromkeys(what for what in found if what))


def missing(press: BasePress | None, model: str) -> str:
    """Why ``press`` cannot get what it fetches for ``model`` ("" when it may)."""
    held = every_press(press) if press is not None else []
    reasons = (DOWNLOADS[type(p)].missing(p, model) for p in held if type(p) in DOWNLOADS)
    return next((reason for reason in reasons if reason), "")
