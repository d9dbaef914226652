"""What the evaluation harness (``evaluation/``, ``benchmarks/``) uses of this package, and the one module it
imports it from: the presses, and the parts of their rules its engine shares with them (attention rows and their
column sums, teacher forcing, the smoother, the random control, the prefill that keeps each layer's input)."""

from presses.attention import (
    DEFAULT_CHUNK_SIZE,
    attention_implementation,
    attention_rows,
    causal_mask,
    group_mean,
    sliding_window,
)
from presses.budget import protected_refusal
from presses.column_sums import H2O_SUMS, ColumnSumReader, ColumnSums, add_column_sums
from presses.fingerprints import MARK_DIMS
from presses.fused_attention import requesting
from presses.model_hooks import language_model
from presses.ordered_scorer_press import OrderedScorerPress, kept_indices
from presses.prefix import forward_capturing
from presses.random_weights import random_weights
from presses.recent_window_press import RecentWindowPress
from presses.rmm_press import RMMPress
from presses.smoother import Smoother
from presses.teacher_forcing import FROM_PREDICTIONS, teacher_forced_correctness, top1_confidence, top1_predictions
from presses.tova_press import TOVAPress
from presses.wrapped import every_press

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "FROM_PREDICTIONS",
    "H2O_SUMS",
    "MARK_DIMS",
    "ColumnSumReader",
    "ColumnSums",
    "OrderedScorerPress",
    "RMMPress",
    "RecentWindowPress",
    "Smoother",
    "TOVAPress",
    "add_column_sums",
    "attention_implementation",
    "attention_rows",
    "causal_mask",
    "every_press",
    "forward_capturing",
    "group_mean",
    "kept_indices",
    "language_model",
    "protected_refusal",
    "random_weights",
    "requesting",
    "sliding_window",
    "teacher_forced_correctness",
    "top1_confidence",
    "top1_predictions",
]
