"""The one rule for errors (``evaluation.errors.press_cell``) in every protocol: a press's error is its cell's
failure, stored with its reason; the full-cache cell's error, an out-of-memory, a device error or a refusal for
memory stops the run (exit 2, finished rows kept, nothing stored for the cell), and a rerun resumes it; every cell
leaves the model's attention implementation as it found it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from kvpress import KnormPress

import evaluation.engine.decoding as decoding
from evaluation.errors import EvaluationError, MemoryRefusal, PressCannotRun, press_cell
from tests.test_locomo_protocol import data_file, locomo  # noqa: F401
from tests.test_locomo_protocol import model_dir as chat_model_dir  # noqa: F401
from tests.test_longbench_protocol import data_dir, longbench, model_dir  # noqa: F401


class AssertingKnorm(KnormPress):
    """KNorm whose score asserts, as KVPress's DuoAttention asserts on a missing checkpoint: served by the shared
    prefill, so the assertion is raised by its hook on the stored inputs."""

    def score(self, *args, **kwargs) -> torch.Tensor:
        raise AssertionError("no attention patterns for this model: the press cannot run")


class OwnPrefillAsserting(AssertingKnorm):
    """The same, behind a context manager of its own: it re-prefills under itself (``generate``)."""

    def __call__(self, model):
        return super().__call__(model)


ASSERTING = "tests.test_cell_errors:AssertingKnorm"
OWN_PREFILL = "tests.test_cell_errors:OwnPrefillAsserting"


def rows_of(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "error", [ValueError("too short"), AssertionError("no checkpoint"), RuntimeError("caches of different lengths")]
)
def test_a_press_error_is_the_cells_failure_with_its_reason(error):
    with pytest.raises(PressCannotRun, match=f"KnormPress: {error}") as raised, press_cell(KnormPress()):
        raise error
    assert raised.value.__cause__ is error
    with pytest.raises(PressCannotRun, match="pyramidkv: bad ratio"), press_cell("pyramidkv"):  # before it is built
        raise ValueError("bad ratio")


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory"),
        MemoryError(),
        torch.AcceleratorError("CUDA error: an illegal memory access was encountered"),
        RuntimeError("CUDA error: device-side assert triggered"),
        MemoryRefusal("eager attention needs more"),
        EvaluationError("bad input"),
    ],
)
def test_the_machines_errors_and_the_harness_own_pass_through(error):
    with pytest.raises(type(error)), press_cell(KnormPress()):
        raise error


def test_an_error_in_the_full_cache_cell_stops_the_run_and_the_rerun_resumes(
    model_dir,  # noqa: F811
    data_dir,  # noqa: F811
    tmp_path,
    monkeypatch,
    capsys,
):
    """A ValueError of the model's forward in the full-cache cell (per-cell path) is no failed row: exit 2, the
    message names the unit; the rows finished before stay, and the same command, once the cause is gone, finishes."""
    output, generate, calls = tmp_path / "run", decoding.generate, []

    def failing_on_the_second_full_cell(model, context, question, press, *args, **kwargs):
        calls.append(press)
        if press is None and sum(p is None for p in calls) == 2:
            raise ValueError("the model met an input it cannot take")
        return generate(model, context, question, press, *args, **kwargs)

    import evaluation.engine.serving as serving

    monkeypatch.setattr(serving, "generate", failing_on_the_second_full_cell)
    arguments = ("--path", "per-cell", "--presses", "full", "knorm")
    assert longbench(model_dir, data_dir, output, *arguments) == 2
    message = capsys.readouterr().err
    assert "the run stopped in" in message and "ValueError: the model met an input" in message
    first = rows_of(output)
    assert first and not any(row.get("error") for row in first), "no failed cell is recorded"
    monkeypatch.setattr(serving, "generate", generate)
    assert longbench(model_dir, data_dir, output, *arguments) == 0
    assert rows_of(output)[: len(first)] == first and not any(row.get("error") for row in rows_of(output))


def test_a_runtime_error_of_the_forward_over_a_press_cache_is_a_failed_cell(
    model_dir,  # noqa: F811
    data_dir,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """PyramidKV on the per-cell path: the question's forward over the cache it left raises a RuntimeError (as
    KVPress's pipeline does on SmolLM2, whose layers then hold caches of different lengths): its cells fail with
    that reason, and the run finishes every other cell."""
    appended = decoding.appended_question

    def uneven(model, cache, question_ids, position, first_logits):
        if len({layer.keys.shape[2] for layer in cache.layers}) > 1:
            raise RuntimeError("The size of tensor a (40) must match the size of tensor b (48) at dimension 3")
        return appended(model, cache, question_ids, position, first_logits)

    monkeypatch.setattr(decoding, "appended_question", uneven)
    output = tmp_path / "run"
    assert longbench(model_dir, data_dir, output, "--path", "per-cell", "--presses", "full", "pyramidkv") == 0
    rows = rows_of(output)
    failed = [row for row in rows if row.get("error")]
    assert failed and {row["press"] for row in failed} == {"pyramidkv"}
    assert all(row["error"].startswith("PyramidKVPress: The size of tensor a") for row in failed)
    assert all(row["score"] is not None for row in rows if row["press"] == "full")


def test_an_eager_cell_without_the_memory_stops_the_run_and_is_not_stored(
    model_dir,  # noqa: F811
    data_dir,  # noqa: F811
    tmp_path,
    monkeypatch,
    capsys,
):
    """H2O's eager prefill on a machine without the memory: refused before it runs, the run stops (exit 2) and no
    row is stored for the cell; the same command on a machine with the memory runs it."""
    import psutil

    memory = psutil.virtual_memory
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("Memory", (), {"available": 10_000})())
    output, arguments = tmp_path / "run", ("--path", "per-cell", "--presses", "full", "h2o")
    assert longbench(model_dir, data_dir, output, *arguments) == 2
    message = capsys.readouterr().err
    assert "MemoryRefusal: eager attention over" in message and "the same command resumes" in message
    assert {row["press"] for row in rows_of(output)} == {"full"}, "nothing is stored for the refused cell"
    monkeypatch.setattr(psutil, "virtual_memory", memory)
    assert longbench(model_dir, data_dir, output, *arguments) == 0
    h2o = [row for row in rows_of(output) if row["press"] == "h2o"]
    assert h2o and not any(row.get("error") for row in h2o)


def test_free_memory_counts_what_the_caching_allocator_holds_unused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (1_000, 80_000))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 5_000)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 3_000)
    assert decoding.free_memory(torch.device("cuda", 0)) == 1_000 + 2_000


class LiveBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """The peak bytes held at once by the storages of tensors of at least ``size`` elements made inside the block
    (a storage counted once, however many tensors view it, until the last of them is freed)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size, self.live, self.peak = size, 0, 0
        self.holders: dict[int, int] = {}  # storage address -> tensors alive on it

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        import weakref

        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(tensor, torch.Tensor) and tensor.numel() >= self.size:
                storage = tensor.untyped_storage()
                address = storage.data_ptr()
                if address not in self.holders:
                    self.live += storage.nbytes()
                    self.peak = max(self.peak, self.live)
                self.holders[address] = self.holders.get(address, 0) + 1
                weakref.finalize(tensor, self._release, address, storage.nbytes())
        return out

    def _release(self, address: int, nbytes: int) -> None:
        self.holders[address] -= 1
        if not self.holders[address]:
            del self.holders[address]
            self.live -= nbytes


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_eager_estimate_covers_the_peak_of_a_layers_weights(dtype):
    """One eager layer over 64 tokens, its (heads x length x length) tensors alive at once measured: the refusal's
    estimate (heads x length^2 x ``eager_bytes_per_weight``) is their peak (bf16: 10 bytes, its float32 copy made
    before the softmax; float32: 8)."""
    from tests.helpers import tiny_model

    model = tiny_model("llama", "eager").to(dtype)
    length, heads = 64, model.config.num_attention_heads
    ids = torch.randint(3, 200, (1, length))
    layer = model.model.layers[0]
    hidden = model.model.embed_tokens(ids)
    rotary = model.model.rotary_emb(hidden, torch.arange(length)[None])
    mask = torch.full((length, length), float("-inf"), dtype=dtype).triu(1)[None, None]
    with torch.no_grad(), LiveBytes(heads * length * length) as measured:
        layer.self_attn(hidden_states=hidden, position_embeddings=rotary, attention_mask=mask)
    estimate = heads * length * length * decoding.eager_bytes_per_weight(dtype)
    assert measured.peak == estimate, (measured.peak, estimate)


def test_a_press_that_asserts_in_a_stream_is_a_failed_cell_and_the_conversation_goes_on(
    chat_model_dir,  # noqa: F811
    data_file,  # noqa: F811
    tmp_path,
):
    """As DuoAttention's AssertionError about its checkpoint: on the shared prefill and on its own prefill, each
    question's cell fails with the press's reason; the other presses answer every question."""
    output = tmp_path / "stream"
    presses = ("--presses", "full", "knorm", ASSERTING, OWN_PREFILL, "--allow-import")
    assert locomo(chat_model_dir, data_file, output, *presses) == 0
    rows = rows_of(output)
    for press in (ASSERTING, OWN_PREFILL):
        failed = [row for row in rows if row["press"] == press]
        assert failed and all(
            row["error"].startswith(f"{press.split(':')[1]}: no attention patterns") for row in failed
        )
    answered = [row for row in rows if row["press"] in ("full", "knorm")]
    assert answered and all("prediction" in row and not row.get("error") for row in answered)


def test_every_cell_restores_the_models_attention(monkeypatch):
    """An eager press's per-cell run, finished or refused, leaves the model on its own attention (a later stream in
    the same process once ran AdaKV under eager attention and failed)."""
    from evaluation.catalogue.budgets import Budget, Cell
    from evaluation.catalogue.resolved import resolve_press
    from evaluation.protocols.longbench.cells import case_of
    from evaluation.protocols.longbench.config import LongBenchConfig
    from evaluation.protocols.longbench.data import Example, TaskConfig
    from evaluation.protocols.single_turn.cells import run_cells
    from evaluation.runs.models import ModelSettings
    from tests.helpers import CHAT_TEMPLATE, byte_tokenizer, tiny_model

    model, tokenizer = tiny_model("llama", "sdpa", vocab_size=260), byte_tokenizer(CHAT_TEMPLATE)
    config = LongBenchConfig(
        model=ModelSettings(),
        tasks=["hotpotqa"],
        presses=["h2o"],
        budgets=[],
        n=None,
        output=Path("-"),
        path="per-cell",
    )
    task = TaskConfig("{context}\nQuestion: {input}\nAnswer:", 4)
    example = Example("hotpotqa", "0", "Which word?", "amber river stone " * 20, ["amber"], None)
    case = case_of(example, task, tokenizer, 200, False)
    cells = [Cell(resolve_press("h2o"), Budget("ratio", 0.5))]
    [row] = run_cells(model, tokenizer, config, case, cells)
    assert row["attn_implementation"] == "eager" and not row.get("error")
    assert model.config._attn_implementation == "sdpa"
    monkeypatch.setattr(decoding, "free_memory", lambda device: 0)
    with pytest.raises(MemoryRefusal):
        list(run_cells(model, tokenizer, config, case, cells))
    assert model.config._attn_implementation == "sdpa"


def test_a_scorer_that_fails_in_the_probe_is_its_failed_rows_and_the_others_rank(tmp_path, monkeypatch):
    """The probe's rule is the same: TOVA's scores raising gives its rows at every k the reason, score None; every
    other scorer ranks as before."""
    from evaluation.engine.history import History
    from evaluation.protocols.probe.facts import probes
    from evaluation.protocols.probe.protocol import SCORERS, ProbeConfig
    from evaluation.protocols.probe.work import probe_rows
    from evaluation.runs.models import ModelSettings
    from presses import TOVAPress
    from tests.helpers import byte_tokenizer, tiny_model

    model, tokenizer = tiny_model("llama", "sdpa", vocab_size=260), byte_tokenizer()
    probe, config = (
        probes(5, 1)[0],
        ProbeConfig(model=ModelSettings(), seed=5, probes=1, reasoning=True, output=tmp_path, max_new_tokens=6),
    )
    before = probe_rows((model, tokenizer), probe, config)
    scores = History.scores

    def failing_for_tova(self, press):
        if isinstance(press, TOVAPress):
            raise RuntimeError("TOVA met a layer it cannot read")
        return scores(self, press)

    monkeypatch.setattr(History, "scores", failing_for_tova)
    rows = probe_rows((model, tokenizer), probe, config)
    assert [row["press"] for row in rows] == [name for name in SCORERS for _ in range(2)]
    failed = [row for row in rows if row.get("error")]
    assert {row["press"] for row in failed} == {"tova"} and len(failed) == 2
    assert all(row["error"] == "TOVAPress: TOVA met a layer it cannot read" and row["score"] is None for row in failed)
    assert [row for row in rows if row["press"] != "tova"] == [row for row in before if row["press"] != "tova"]
