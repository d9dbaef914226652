"""What a run's floats depend on besides its inputs and settings: fixed where torch lets a run fix it, recorded where
it does not (``docs/reliability.md``, "Numerics").

A float32 reduction that a kernel splits among its intra-op threads sums in an order set by their number, so a
likelihood computed with 1 thread and with 2 differs in its last bits, and a stream of a thousand forwards carries
that on (docs/reliability.md: up to 2.4e-7 nats on a text's mean NLL, 1.9e-6 on a window of positions, in the
committed perplexity cell). torch's own default count is the cores the process may use, which ``OMP_NUM_THREADS``,
a CPU affinity or a Ray worker's share changes without a trace. So a run fixes its count (``--threads``, default this
machine's cores), records it in run.json as a setting, and every process that computes its rows (the local one, each
Ray worker, a reproduction) sets it before the model loads. With the count fixed, the machine's load changed only
the time: the same bits idle and beside a load of 1 to 7 (docs/reliability.md).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

CUBLAS_WORKSPACE = ":4096:8"  # what cuBLAS needs for deterministic products (torch's reproducibility notes)
# read by the OpenMP and MKL runtimes when torch loads them, so set before torch is imported (``python -m evaluation``
# does); an environment that sets one keeps its value. The dynamic settings let a runtime use fewer threads than asked
# (Intel's conditions for reproducible MKL results set both false); a passive wait frees a core at once instead of
# spinning on it, which on a loaded machine made a 2-thread stream 17 times slower and changed no bit (docs)
RUNTIME = {"OMP_DYNAMIC": "FALSE", "MKL_DYNAMIC": "FALSE", "OMP_WAIT_POLICY": "PASSIVE"}


def runtime_environment() -> None:
    """``RUNTIME`` where the environment does not say otherwise; effective only before torch is imported."""
    for name, value in RUNTIME.items():
        os.environ.setdefault(name, value)


def machine_threads() -> int:
    """The cores this process may use (its CPU affinity): what torch would take by default, and ``--threads``'s
    default."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity on this platform (macOS)
        return max(1, os.cpu_count() or 1)


def fix_numerics(threads: int) -> None:
    """Fix this process's numerics for a run: ``threads`` intra-op threads, and torch's deterministic kernels where
    it has them (a kernel without one warns instead of failing its cell; cuBLAS gets the workspace its deterministic
    products need, set before CUDA starts)."""
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False  # a cost on every allocation, no change to a sum
    torch.backends.cudnn.benchmark = False  # cuDNN's autotuner picks kernels by timing, so by the machine's load
    torch.backends.cudnn.deterministic = True


def cpu_capability() -> str:
    """The instruction set of the CPU kernels torch dispatches to on this machine (AVX2, AVX512, ...)."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


def numerics_record(device: str) -> dict:
    """What this process's floats depend on, as a run's session records it: threads, torch's build (its BLAS, oneDNN
    and parallel backend), the CPU (and its instruction set torch uses) and the accelerator."""
    import torch

    built = torch.__config__.show()
    record: dict = {
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "torch": torch.__version__,
        "blas": build_line(built, ("Math Kernel Library", "OpenBLAS", "BLAS_INFO=")),
        "onednn": build_line(built, ("MKL-DNN", "oneDNN")),
        "parallel": build_line(torch.__config__.parallel_info(), ("ATen parallel backend",)),
        "cpu": cpu_name(),
        "cpu_capability": cpu_capability(),
        "device": device,
        "runtime": {name: os.environ.get(name) for name in RUNTIME},
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        try:
            record["gpu"] = torch.cuda.get_device_name(torch.device(device))
        except (RuntimeError, AssertionError):  # a Ray driver without the workers' GPU
            record["gpu"] = None
        record.update(cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
    return record


def build_line(text: str, marks: tuple[str, ...]) -> str:
    """The first line of torch's build description holding one of ``marks``, stripped ("" when none does)."""
    found = (line.strip(" -\t") for line in text.splitlines() if any(mark in line for mark in marks))
    return next(found, "")[:200]


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
