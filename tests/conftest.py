"""Shared fixtures: tiny random models, the offline SmolLM2, real texts from the shared data."""

from __future__ import annotations

import json
from collections.abc import Callable

from evaluation.runs.numerics import runtime_environment

runtime_environment()  # as python -m evaluation sets it, before torch loads its OpenMP and MKL runtimes

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import PreTrainedModel  # noqa: E402

from tests.helpers import SHARED_DATA, tiny_model  # noqa: E402


@pytest.fixture(params=["llama", "qwen2"])
def arch(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def eager_model(arch: str) -> PreTrainedModel:
    return tiny_model(arch, "eager")


@pytest.fixture
def sdpa_model(arch: str) -> PreTrainedModel:
    return tiny_model(arch, "sdpa")


@pytest.fixture
def token_ids() -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(3, 256, (1, 96), generator=generator)


@pytest.fixture
def no_shared_data(tmp_path, monkeypatch):
    """No shared data: no ``KVET_SHARED_DATA``, and a checkout with no ``shared/data`` inside or beside it."""
    monkeypatch.delenv("KVET_SHARED_DATA", raising=False)
    monkeypatch.setattr("evaluation.runs.data_location.CHECKOUT", tmp_path / "checkout")


@pytest.fixture(scope="session")
def smollm2() -> Callable[[str], tuple[PreTrainedModel, object]]:
    """Loader of the offline SmolLM2 by attention implementation, each loaded once per session."""
    from evaluation.runs.models import load_model

    loaded: dict[str, tuple[PreTrainedModel, object]] = {}

    def get(attn_implementation: str = "sdpa") -> tuple[PreTrainedModel, object]:
        if attn_implementation not in loaded:
            loaded[attn_implementation] = load_model("smollm2-135m", attn_implementation=attn_implementation)
        return loaded[attn_implementation]

    return get


@pytest.fixture(scope="session")
def multi_news_contexts() -> list[str]:
    path = SHARED_DATA / "longbench" / "multi_news.jsonl"
    if not path.exists():
        pytest.fail(
            f"{path} is missing: tests read the shared LongBench data (set KVET_SHARED_DATA, or put shared/data "
            "inside or beside the checkout)"
        )
    with path.open() as handle:
        return [json.loads(line)["context"] for line in handle]


@pytest.fixture(scope="session")
def real_text_ids(smollm2, multi_news_contexts) -> torch.Tensor:
    """The first 1,024 SmolLM2 tokens of the second multi_news context (1,762 tokens long)."""
    _, tokenizer = smollm2()
    return tokenizer(multi_news_contexts[1], return_tensors="pt").input_ids[:, :1024]
