"""Attention traces: the per-step attention of a model reading a real text, from one full-cache prefill.

Row t of a layer's trace is the attention of query t over positions 0..t, which is exactly what step t of
decoding with the full cache would see. Rows are averaged over all query heads (one group) or over the query
heads of each KV group, and computed chunk by chunk from queries and keys. Each row also carries its
teacher-forced correctness (is the model's top-1 prediction at t the actual token t + 1? the last row: 1).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from evaluation.errors import EvaluationError
from evaluation.protocols.texts import source_text, text_tokens
from evaluation.runs.files import replaced
from evaluation.runs.models import cache_root
from presses.harness import attention_rows, forward_capturing, group_mean, teacher_forced_correctness


@dataclass
class Trace:
    name: str
    token_ids: list[int]
    correct: torch.Tensor  # (length,) teacher-forced correctness of each row
    layers: list[torch.Tensor]  # per layer (groups, length, length): row t = step t's attention, zero after t

    @property
    def length(self) -> int:
        return len(self.token_ids)


@torch.no_grad()
def record(model: PreTrainedModel, token_ids: list[int], name: str, per_kv_group: bool = False) -> Trace:
    """One full-cache prefill of ``token_ids``; every layer's attention rows and every row's correctness."""
    ids = torch.tensor([token_ids], device=model.device)
    cache = DynamicCache()
    hidden, captured = forward_capturing(model, ids, cache, 0)
    correct = teacher_forced_correctness(model.get_output_embeddings(), hidden, ids)[0].cpu()
    layers = []
    for index, layer in enumerate(model.model.layers):
        layer_input, rotary = captured[index]
        keys = cache.layers[index].keys
        groups = keys.shape[1] if per_kv_group else 1
        rows = torch.zeros(groups, len(token_ids), len(token_ids))
        chunks = attention_rows(layer.self_attn, layer_input, keys, None, {"position_embeddings": rotary}).chunks
        for first, probs in chunks:
            rows[:, first : first + probs.shape[2], : probs.shape[-1]] = group_mean(probs, groups)[0].cpu()
        layers.append(rows)
    return Trace(name, token_ids, correct, layers)


def trace_name(model_name: str, spec: str, length: int, per_kv_group: bool) -> str:
    return f"{Path(model_name).name}_{spec.replace(':', '-')}_{length}_{'kv-groups' if per_kv_group else 'heads'}"


def load_or_record(
    model_loader: Callable[[], tuple[PreTrainedModel, PreTrainedTokenizerBase]],
    model_name: str,
    spec: str,
    length: int,
    per_kv_group: bool,
    data_root: Path,
) -> Trace:
    """The named trace from the cache, else recorded (with ``model_loader()``) and cached; deterministic.

    The cache file is named by a hash of the model's full name, the trace's name and the text itself, so other data
    under the same name is recorded anew."""
    name = trace_name(model_name, spec, length, per_kv_group)
    text = source_text(spec, data_root)
    key = hashlib.sha256(f"{model_name}|{name}|{text}".encode()).hexdigest()[:16]
    path = cache_root() / "traces" / f"{key}.pt"  # named by the hash alone: no user text reaches the path
    if path.is_file():
        try:
            stored = torch.load(path, weights_only=True)
            return Trace(name, stored["token_ids"], stored["correct"], list(stored["layers"]))
        except Exception as error:  # a torn or foreign file: torch raises many kinds
            raise EvaluationError(
                f"the trace cache file {path} is unreadable ({error}): delete it to record again"
            ) from error
    model, tokenizer = model_loader()
    token_ids = text_tokens(tokenizer, text, length, spec)
    trace = record(model, token_ids, name, per_kv_group)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replaced(path) as staging:
        torch.save({"token_ids": trace.token_ids, "correct": trace.correct, "layers": trace.layers}, staging)
    return trace
