"""Streaming a text through the model with a press holding the cache at a budget, as TOVA's and StreamingLLM's
papers evaluate: the first token alone, then each token (or each chunk of ``chunk`` tokens) in one forward, the
press evicting down to the budget after every forward, and every token after the first scored.

Each press streams as KVPress's ``DecodingPress(base_press=press, compression_interval=1, target_size=budget)``,
whose hook compresses each layer's cache after that layer's attention in every forward after the first. A press is
streamed only where its one-row (or one-chunk) decoding score is its rule: H2O (KVPress's
``ObservedAttentionPress``, which inside ``DecodingPress`` would see one row per step) streams as its accumulated
attention, ``RMMPress(correctness="uniform")`` with no lag (its exact equal, following the cache with its
smoother); a press that scores from a window of the newest queries streams only in chunks at least that window;
anything else is refused by name.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import kvpress as k
import torch
from kvpress.presses.base_press import BasePress
from kvpress.presses.scorer_press import ScorerPress
from transformers import DynamicCache, PreTrainedModel

from evaluation.catalogue.needs import needs
from evaluation.catalogue.registry import SHARED
from evaluation.catalogue.resolved import ResolvedPress
from evaluation.errors import EvaluationError
from presses.harness import OrderedScorerPress, RMMPress, kept_indices

H2O_RULE = "rmm(correctness='uniform')"  # H2O's accumulated attention, streamed (docs/perplexity.md)
ROUNDING_TIES = 8 * torch.finfo(torch.float32).eps  # relative: float32 scores this close tie (docs/perplexity.md)


def base_press(resolved: ResolvedPress, chunk: int) -> tuple[BasePress, str]:
    """The press a spec streams as, inside ``DecodingPress``, and its name when that is not the spec's own press
    ("" otherwise).

    Raises
    ------
    EvaluationError
        One line naming the press, for a press whose rule this protocol cannot stream in this form.
    """
    press = resolved.build()
    if type(press) is k.ObservedAttentionPress:
        return RMMPress(correctness="uniform"), H2O_RULE
    read = needs(press)
    where = f"press spec {resolved.label!r}"
    if read.path != SHARED or not isinstance(press, (ScorerPress, k.AdaKVPress)):
        raise EvaluationError(
            f"{where}: the perplexity protocol streams a press as KVPress's DecodingPress around it, which takes a "
            "scorer press (or AdaKVPress of one) on its own: give that press, not a decoding or own-prefill press"
        )
    if read.reads_weights:
        raise EvaluationError(f"{where} reads the attention weights of a whole prefill, which a stream never has")
    if read.rows is None and not isinstance(press, RMMPress):
        raise EvaluationError(
            f"{where} scores from every query row of a prefill; streamed it would see only the newest "
            f"{'token' if chunk == 1 else f'{chunk} tokens'}, which is not its rule"
        )
    if read.rows is not None and 1 < read.rows >= chunk:  # the newest query alone streams in any form
        raise EvaluationError(
            f"{where} scores from its {read.rows} newest queries and KVPress asks for more rows than that: stream it "
            f"in chunks of more (--chunk {read.rows + 1})"
        )
    return (press if isinstance(press, OrderedScorerPress) else InPositionOrder(press=press)), ""


@dataclass
class InPositionOrder(OrderedScorerPress):
    """KVPress's scorer ``press`` with its kept entries left in position order (``OrderedScorerPress``): KVPress's
    ``ScorerPress`` stores them in score order, which a stream that evicts at every step turns into an order no
    position rule can read (StreamingLLM's sinks and window are slots 0-3 and the newest slots; SnapKV pools over
    neighbouring slots). Ties evict the lower position, and scores within float32 rounding of each other
    (``ROUNDING_TIES``) tie: a token repeated in the text has one layer-0 key norm (its key is rotated to each
    position), which KNorm's float32 scores round up to an ulp apart, and differently in forwards over different
    numbers of rows."""

    press: ScorerPress | None = None

    def post_init_from_model(self, model: PreTrainedModel) -> None:
        super().post_init_from_model(model)
        self.press.post_init_from_model(model)

    def score(self, *args, **kwargs) -> torch.Tensor:
        self.press.compression_ratio = self.compression_ratio  # what DecodingPress set for this step
        return self.press.score(*args, **kwargs)

    def select(self, scores: torch.Tensor, n_kept: int) -> torch.Tensor:
        return kept_indices(scores, n_kept, tolerance=ROUNDING_TIES)


def decoding_press(press: BasePress, budget: int) -> k.DecodingPress:
    """``press`` evicting to ``budget`` tokens after every forward, from that forward's rows (its buffer holds one
    forward's hidden states)."""
    return k.DecodingPress(base_press=press, compression_interval=1, target_size=budget, hidden_states_buffer_size=1)


def pieces(length: int, chunk: int) -> list[tuple[int, int]]:
    """The (start, end) of each forward: the first token alone (a prefill, which ``DecodingPress`` leaves alone),
    then ``chunk`` tokens at a time, the last chunk taking the remainder (so no chunk is shorter than ``chunk``
    when ``length - 1`` holds one)."""
    starts = list(range(1, length, chunk))
    if len(starts) > 1 and length - starts[-1] < chunk:
        starts.pop()
    return [(0, 1)] + [(start, end) for start, end in zip(starts, [*starts[1:], length], strict=True)]


@torch.no_grad()
def streamed_nll(
    model: PreTrainedModel,
    token_ids: torch.Tensor,
    press: BasePress | None,
    chunk: int,
    on_forward: Callable[[], None] = lambda: None,
) -> torch.Tensor:
    """The negative log-likelihood (nats, float32) of every token after the first of each row of ``token_ids``
    (batch, length), streamed ``chunk`` tokens per forward under ``press`` (None: the full cache): (batch,
    length - 1); ``on_forward`` is called after each forward. Positions are the tokens' own, whatever the cache
    holds."""
    ids = token_ids.to(model.device)
    batch, length = ids.shape
    cache = DynamicCache()
    scored = []
    with press(model) if press is not None else nullcontext():
        for start, end in pieces(length, chunk):
            positions = torch.arange(start, end, device=model.device)[None]
            logits = model(input_ids=ids[:, start:end], past_key_values=cache, position_ids=positions).logits
            targets = ids[:, start + 1 : end + 1]
            predicted = logits[:, : targets.shape[1]].float()
            nll = torch.nn.functional.cross_entropy(predicted.flatten(0, 1), targets.flatten(), reduction="none")
            scored.append(nll.view(batch, -1))
            on_forward()
    return torch.cat(scored, dim=1)
