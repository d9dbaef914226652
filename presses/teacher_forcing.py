"""A causal LM's teacher-forced correctness and its confidence proxy, and what a press needs to read them.

Row t is correct when the model's top-1 prediction at t equals the token at t + 1; its confidence is the
probability the model gives that prediction, known with row t's logits and without any gold token. A press
scoring inside another press's hooks (``DecodingPress``, ``ComposedPress``, ...) sees neither the token ids nor
the logits, so ``Transcript`` records them, per absolute position, from hooks on the decoder stack and its final
norm.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import nn
from transformers import PreTrainedModel

from presses.attention import host_values
from presses.model_hooks import WrapperBound, hooks_suspended, input_ids_of, language_model
from presses.smoother import Confirmation

LOGIT_CHUNK_SIZE = 512
Head = Callable[[torch.Tensor], torch.Tensor]  # hidden states -> logits: the LM head, or logits as they are
CORRECTNESS_MODES = ("teacher_forced", "confidence", "uniform", "random")
FROM_PREDICTIONS = ("teacher_forced", "confidence", "random")  # the modes whose weights a ``Transcript`` records


def checked_correctness(correctness: str | torch.Tensor | Sequence[float]) -> str | torch.Tensor:
    """A correctness mode, or per-position weights as a (batch, length) float32 tensor."""
    if isinstance(correctness, str):
        if correctness not in CORRECTNESS_MODES:
            raise ValueError(
                f"correctness must be one of {CORRECTNESS_MODES} or a sequence of per-position weights, "
                f"got {correctness!r}"
            )
        return correctness
    weights = torch.as_tensor(correctness, dtype=torch.float32)
    if weights.ndim not in (1, 2) or not torch.isfinite(weights).all() or (weights < 0).any():
        raise ValueError(
            "per-position correctness weights must be finite, non-negative, of shape (length,) or "
            f"(batch, length); got shape {tuple(weights.shape)}"
        )
    return weights if weights.ndim == 2 else weights.unsqueeze(0)


@torch.no_grad()
def top1_predictions(lm_head: Head, hidden_states: torch.Tensor, chunk_size: int = LOGIT_CHUNK_SIZE) -> torch.Tensor:
    """The argmax of the logits of every row of ``hidden_states`` (batch, length, hidden), computed
    ``chunk_size`` rows at a time so that a (length x vocabulary) matrix is never held. Shape (batch, length)."""
    return torch.cat(
        [
            lm_head(hidden_states[:, start : start + chunk_size]).argmax(-1)
            for start in range(0, hidden_states.shape[1], chunk_size)
        ],
        dim=1,
    )


@torch.no_grad()
def top1_confidence(
    lm_head: Head, hidden_states: torch.Tensor, chunk_size: int = LOGIT_CHUNK_SIZE
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-1 predictions of ``top1_predictions`` and their probabilities, the max of the softmax of each
    row's logits in float32 (1 / sum of exp(logit - top)), from the same chunked pass, in place on each chunk's
    logits: (batch, length) ids and (batch, length) float32."""
    ids, probabilities = [], []
    for start in range(0, hidden_states.shape[1], chunk_size):
        logits = lm_head(hidden_states[:, start : start + chunk_size]).float()
        index = logits.argmax(-1)  # as ``top1_predictions`` breaks ties: the float32 copy holds the same values
        ids.append(index)
        probabilities.append(logits.sub_(logits.gather(-1, index[..., None])).exp_().sum(-1).reciprocal())
    return torch.cat(ids, dim=1), torch.cat(probabilities, dim=1)


@torch.no_grad()
def teacher_forced_correctness(
    lm_head: nn.Module,
    hidden_states: torch.Tensor,
    input_ids: torch.Tensor,
    chunk_size: int = LOGIT_CHUNK_SIZE,
) -> torch.Tensor:
    """1.0 where the top-1 prediction at row t equals token t + 1, else 0.0; the last row, whose next token is
    unknown, weighs 1.0. ``hidden_states`` (batch, length, hidden) are the decoder's final (normed) outputs.
    Returns shape (batch, length)."""
    predicted = top1_predictions(lm_head, hidden_states[:, :-1], chunk_size)
    input_ids = input_ids.to(predicted.device)  # under a device map the head and the embeddings may differ
    correct = torch.ones(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    correct[:, :-1] = (predicted == input_ids[:, 1:]).float()
    return correct


def shared_run(kwargs: dict, length: int) -> list[int] | None:
    """The positions of a decoder stack's ``length`` input rows on the host, when every sequence has them and they
    run consecutively without padding; else None."""
    padding = kwargs.get("attention_mask")
    if padding is not None and not bool(padding.all()):
        return None
    positions, cache_position = kwargs.get("position_ids"), kwargs.get("cache_position")
    if positions is not None:
        rows = host_values(positions)
        host = rows[0]
        if any(row != host for row in rows[1:]):
            return None
    elif cache_position is not None:
        host = host_values(cache_position)
    else:
        cache = kwargs.get("past_key_values")
        start = cache.get_seq_length() if cache is not None else 0
        host = list(range(start, start + length))
    return host if host == list(range(host[0], host[0] + len(host))) else None


def forward_positions(kwargs: dict, length: int, device: torch.device) -> torch.Tensor:
    """Absolute positions (batch or 1, length) of a decoder stack's input rows."""
    positions = kwargs.get("position_ids")
    if positions is not None:
        return positions
    cache_position = kwargs.get("cache_position")
    if cache_position is not None:
        return cache_position[None]
    cache = kwargs.get("past_key_values")
    start = cache.get_seq_length() if cache is not None else 0
    return torch.arange(start, start + length, device=device)[None]


class Spans:
    """A set of positions as sorted, disjoint, non-adjacent half-open ranges [start, stop)."""

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int]] = []

    def add(self, start: int, stop: int) -> None:
        merged = []
        for first, last in self.ranges:
            if last < start or first > stop:
                merged.append((first, last))
            else:
                start, stop = min(start, first), max(stop, last)
        self.ranges = sorted([*merged, (start, stop)])

    def cut(self, length: int) -> None:
        """Keep the positions below ``length``."""
        self.ranges = [(first, min(last, length)) for first, last in self.ranges if first < length]

    def covers(self, start: int, stop: int) -> bool:
        return any(first <= start and stop <= last for first, last in self.ranges)


class Wanted(NamedTuple):
    """Rows of a forward in progress whose predictions are due: the head, their positions (batch, length), their
    hidden states, the first sequence's positions on the host (None: unknown) and the norm's whole output (the
    head's input when the forward computes every row's logits)."""

    lm_head: nn.Module
    positions: torch.Tensor
    hidden: torch.Tensor
    host: list[int] | None
    norm_output: torch.Tensor


def _as_given(logits: torch.Tensor) -> torch.Tensor:
    return logits


def _copied(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` in float32, copied (``top1_confidence`` works in place), once whatever their dtype."""
    return logits.clone() if logits.dtype == torch.float32 else logits.float()


class Transcript(WrapperBound):
    """Token ids, top-1 predictions and (when ``confident``) their probabilities by absolute position, for the
    sequence a wrapped press is compressing.

    ``attach`` hooks the decoder stack (its input ids), its final norm (the rows whose predictions are wanted) and
    the LM head: the predictions are the argmax of the forward's own logits where the head ran on the norm's whole
    output, else, at the end of that forward, of one more pass of the head over those rows (no second pass over the
    vocabulary in a forward that computes every row's logits). The hooks live as long as the wrapper
    press that runs ``owner``: once its attention hooks are removed (the wrapper's context exits), the transcript's
    own hooks are removed with them. A forward supersedes everything recorded from its first position on (a new
    sequence, a cache cropped for the next question).
    ``confirm`` reads teacher-forced correctness, ``confident_weights`` the probabilities (``confirmation`` picks).
    """

    def __init__(self) -> None:
        super().__init__()
        self.tokens = torch.empty(0, 0, dtype=torch.long)  # (batch, positions); -1 unknown
        self.predictions = torch.empty(0, 0, dtype=torch.long)
        self.probabilities = torch.empty(0, 0, dtype=torch.float32)  # recorded only when ``confident``
        self.confident = False
        self.rows: slice | None = None  # the batch rows recorded (None: all)
        self._wanted: Wanted | None = None
        self._in_model = False  # inside the causal LM's forward, whose head runs after the stack
        # on the host: the positions where every sequence's token and prediction are recorded; None once the host
        # cannot tell (padding, or sequences at different positions): the device is asked then
        self.extent: tuple[Spans, Spans] | None = (Spans(), Spans())
        self._last_host: list[int] | None = None

    def attach(self, model: PreTrainedModel, owner: object, confident: bool = False, rows: slice | None = None) -> None:
        """Record what ``model`` runs from now on; ``rows``: the batch rows that are this press's sequences, in a
        forward whose batch holds others' too (None: every row)."""
        self.detach()
        self.confident, self.rows, self._in_model = confident, rows, False
        stack = language_model(model)
        lm_head = model.get_output_embeddings()
        self.handles = [
            stack.register_forward_pre_hook(lambda m, a, k: self._record_ids(model, owner, a, k), with_kwargs=True),
            stack.norm.register_forward_hook(lambda m, a, out: self._record_predictions(lm_head, out)),
            stack.register_forward_hook(lambda m, a, out: None if self._in_model else self._predict_wanted()),
        ]
        if lm_head is not None and model is not stack:
            self.handles += [
                model.register_forward_pre_hook(lambda m, a: setattr(self, "_in_model", True)),
                lm_head.register_forward_hook(lambda m, a, out: self._record_logits(a[0], out)),
                model.register_forward_hook(lambda m, a, out: self._end_of_model_forward()),
            ]

    def clear(self) -> None:
        self._wanted = None
        self._truncate(0)
        self.extent = (Spans(), Spans())

    def _end_of_model_forward(self) -> None:
        self._in_model = False
        self._predict_wanted()

    def _truncate(self, length: int) -> None:
        """Forget everything recorded at position ``length`` and later."""
        tables = (self.tokens, self.predictions, self.probabilities)
        self.tokens, self.predictions, self.probabilities = (table[:, :length] for table in tables)
        if self.extent is not None:
            for spans in self.extent:
                spans.cut(length)

    def _extend(self, which: int, host: list[int] | None) -> None:
        """The host record after a write at ``host`` (consecutive positions, None: unknown) of tokens (``which``
        0) or predictions (1)."""
        if self.extent is not None and host is None:
            self.extent = None
        elif self.extent is not None:
            self.extent[which].add(host[0], host[-1] + 1)

    def _record_ids(self, model: PreTrainedModel, owner: object, args: tuple, kwargs: dict) -> None:
        self._predict_wanted()  # the last forward's, before this one supersedes anything
        if not self._bind_to_wrapper(model, owner):
            return
        ids = input_ids_of(args, kwargs)
        if ids is None:
            return
        if self.rows is not None:
            kwargs = {key: _rows_of(value, self.rows, ids.shape[0]) for key, value in kwargs.items()}
            ids = ids[self.rows]
        positions = forward_positions(kwargs, ids.shape[1], ids.device).expand(ids.shape[0], -1)
        padding = kwargs.get("attention_mask")
        if padding is not None and padding.ndim == 2 and padding.shape == ids.shape:
            positions = positions.masked_fill(padding == 0, -1)  # no padding token is recorded
        host = shared_run(kwargs, ids.shape[1])
        if host is None:
            first = max(int(positions.max(-1).values.min()) - ids.shape[1] + 1, 0)  # this forward supersedes from here
        else:
            first = max(host[-1] - ids.shape[1] + 1, 0)
        if ids.shape[0] != self.tokens.shape[0]:  # another batch: the tables start afresh
            self.extent = (Spans(), Spans())
        self._truncate(first)
        self.tokens = _write(self.tokens, positions, ids, None if host is None else host[-1] + 1)
        self._extend(0, host)
        self._last_positions, self._last_host = positions, host
        self._call = {"input_ids": ids, **{key: kwargs.get(key) for key in ("attention_mask", "position_ids")}}

    def _record_predictions(self, lm_head: nn.Module, output: torch.Tensor) -> None:
        positions, full = getattr(self, "_last_positions", None), output
        output = output if self.rows is None else output[self.rows]
        if positions is None or positions.shape[1] != output.shape[1]:
            return
        host = self._last_host
        if self.extent is not None and host is not None:
            if self.extent[1].covers(host[0], host[-1] + 1):
                return  # a pre-pass already predicted these rows
        elif bool((_read(self.predictions, positions) >= 0).all()):
            return
        self._wanted = Wanted(lm_head, positions.clone(), output, host, full)

    def _record_logits(self, hidden: torch.Tensor, logits: torch.Tensor) -> None:
        """The wanted rows' predictions from the forward's own logits, when the head ran on the norm's whole output
        (not under ``logits_to_keep``, nor on anything else)."""
        wanted = self._wanted
        if wanted is None or hidden.shape != wanted.norm_output.shape:
            return
        if hidden.data_ptr() != wanted.norm_output.data_ptr():
            return
        self._wanted = None
        head = _copied if self.confident else _as_given  # top1_confidence works in place on what it is given
        self._write_predictions(head, wanted.positions, logits if self.rows is None else logits[self.rows], wanted.host)

    def _predict_wanted(self) -> None:
        """The wanted rows' predictions from one pass of the head, if no forward's logits gave them."""
        wanted, self._wanted = self._wanted, None
        if wanted is not None:
            self._write_predictions(wanted.lm_head, wanted.positions, wanted.hidden, wanted.host)

    def _write_predictions(
        self, lm_head: Head, positions: torch.Tensor, hidden: torch.Tensor, host: list[int] | None = None
    ) -> None:
        """Record the predictions of the rows of ``hidden`` (and, when ``confident``, their probabilities, from the
        same pass over the vocabulary) at ``positions`` (batch, length); ``host``: the first sequence's positions on
        the host, if known."""
        size = None if host is None else host[-1] + 1
        if self.confident:
            predicted, probabilities = top1_confidence(lm_head, hidden)
            self.probabilities = _write(self.probabilities, positions, probabilities, size)
        else:
            predicted = top1_predictions(lm_head, hidden)
        self.predictions = _write(self.predictions, positions, predicted, size)
        self._extend(1, host)

    def store(self, model: PreTrainedModel, ids: torch.Tensor, hidden: torch.Tensor) -> None:
        """Record a replay's ids (batch, n) at positions 0..n-1 and the predictions of its final hidden states."""
        positions = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[0], -1)
        self.tokens = _write(self.tokens, positions, ids, ids.shape[1])
        self._extend(0, list(range(ids.shape[1])))
        self._write_predictions(model.get_output_embeddings(), positions, hidden, list(range(ids.shape[1])))

    def confirm(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per (batch, position) at ``positions`` (batch, k): 1.0 where the prediction at p equals the token at
        p + 1, else 0.0; and whether that is settled: both are known, or no token was recorded at p (padding,
        which no weight changes: 1.0)."""
        predicted, following = _read(self.predictions, positions), _read(self.tokens, positions + 1)
        recorded = _read(self.tokens, positions) >= 0
        correct = torch.where(recorded, (predicted == following).float(), 1.0)
        return correct, ~recorded | ((predicted >= 0) & (following >= 0))

    def correctness_table(self, length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per sequence, over positions 0..length-1: ``confirm``'s correctness and whether it is settled, and whether
        a token was recorded there (a row whose weight is its correctness): (batch, length) each."""
        positions = torch.arange(length, device=self.tokens.device).expand(self.tokens.shape[0], -1)
        correct, settled = self.confirm(positions)
        return correct, settled, _read(self.tokens, positions) >= 0

    def confident_weights(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per (batch, position) at ``positions`` (batch, k): the probability of the top-1 prediction at p; and
        whether it is settled: known (with p's logits, no later token needed), or no token was recorded at p
        (padding: 1.0)."""
        probability, recorded = _read(self.probabilities, positions), _read(self.tokens, positions) >= 0
        return torch.where(recorded, probability, 1.0), ~recorded | (probability >= 0)

    def confirmation(self, correctness: str | torch.Tensor) -> Confirmation:
        """How the weights of ``correctness`` are read: ``confident_weights`` for confidence, else ``confirm``."""
        return self.confident_weights if isinstance(correctness, str) and correctness == "confidence" else self.confirm

    def knows_tokens(self, positions: torch.Tensor) -> bool:
        """Whether any token at ``positions`` was recorded (none: the model ran on embeddings, or unseen)."""
        return bool((_read(self.tokens, positions) >= 0).any())

    def settled_at(self, position: int, correctness: str | torch.Tensor) -> bool | None:
        """Whether the weight at ``position`` of every sequence is settled (as ``confirmation`` tells), from the
        host record; None when the host does not know."""
        if self.extent is None:
            return None
        tokens, predictions = self.extent
        if not tokens.covers(position, position + 1):
            return True  # no token recorded there: nothing to confirm
        if isinstance(correctness, str) and correctness == "confidence":
            return predictions.covers(position, position + 1)
        return predictions.covers(position, position + 1) and tokens.covers(position + 1, position + 2)

    def weights(
        self, positions: torch.Tensor, correctness: str = "teacher_forced", held: list[int] | None = None
    ) -> tuple[torch.Tensor, list[int]] | None:
        """The weight of each row at ``positions`` (batch, n_rows) under ``correctness`` (teacher-forced or
        confidence), and which rows' weights are provisional (their indices): a row whose prediction (or, teacher
        forced, next token) is not known yet counts as correct until known. None when no token there was recorded.
        ``held``: the first sequence's positions on the host: with the host record, nothing waits for the device."""
        if held is None or self.extent is None:
            if not self.knows_tokens(positions):
                return None
            correct, settled = self.confirmation(correctness)(positions)
            return torch.where(settled, correct, 1.0), torch.nonzero(~settled.all(0))[:, 0].tolist()
        if not any(self.extent[0].covers(position, position + 1) for position in held):
            return None
        correct, settled = self.confirmation(correctness)(positions)
        unsettled = [row for row, position in enumerate(held) if not self.settled_at(position, correctness)]
        return torch.where(settled, correct, 1.0), unsettled

    @torch.no_grad()
    def predict(
        self, model: PreTrainedModel | None, positions: torch.Tensor, correctness: str = "teacher_forced"
    ) -> None:
        """The predictions of the rows at ``positions``, the forward in progress (inside another press's hooks,
        before its logits exist), from one extra run of that forward without its cache and with every hook
        suspended; unless every weight of ``correctness`` there is settled already (teacher forced, the last
        row's waits for the next token anyway)."""
        call = getattr(self, "_call", None)
        if model is None or call is None or call["input_ids"].shape[1] != positions.shape[1]:
            return
        rows = positions if correctness == "confidence" else positions[:, :-1]
        if bool(self.confirmation(correctness)(rows)[1].all()):
            return
        with hooks_suspended(model):
            hidden = language_model(model)(**call, use_cache=False)[0][:, -positions.shape[1] :]
        self._write_predictions(model.get_output_embeddings(), positions, hidden)


def _rows_of(value: object, rows: slice, batch: int) -> object:
    """``value`` at the batch ``rows`` when it is a tensor of two axes or more (not ``cache_position``) with a row
    per sequence of the batch; else as it is."""
    if isinstance(value, torch.Tensor) and value.ndim > 1 and value.shape[0] == batch > 1:
        return value[rows]
    return value


def _write(table: torch.Tensor, positions: torch.Tensor, values: torch.Tensor, size: int | None = None) -> torch.Tensor:
    """``table`` (batch, n) with ``values`` written at ``positions`` (batch, k), grown with -1 as needed; negative
    positions (padding, under position ids counted from each sequence's first token) are skipped. The table stays on
    the device of the positions (the ids'; under a device map the predictions come from another device). ``size``:
    the newest position + 1, when the host knows it."""
    batch, size = positions.shape[0], int(positions.max()) + 1 if size is None else size
    values = values.to(positions.device, table.dtype)
    if table.shape[0] != batch or table.shape[1] < size or table.device != positions.device:
        grown = torch.full((batch, max(size, table.shape[1])), -1, dtype=table.dtype, device=positions.device)
        if table.shape[0] == batch:
            grown[:, : table.shape[1]] = table.to(positions.device)
        table = grown
    spill = torch.cat([table, table.new_full((batch, 1), -1)], dim=1)
    spill.scatter_(1, torch.where(positions >= 0, positions, table.shape[1]), values)
    return spill[:, :-1].contiguous()


def _read(table: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``table`` at ``positions`` (batch, k), on the positions' device; -1 beyond what was written."""
    if table.shape[0] != positions.shape[0] or table.shape[1] == 0:
        return torch.full(positions.shape, -1, dtype=table.dtype, device=positions.device)
    table = table.to(positions.device)
    inside = (positions >= 0) & (positions < table.shape[1])
    return torch.where(inside, table.gather(1, positions.clamp(0, table.shape[1] - 1)), -1)
