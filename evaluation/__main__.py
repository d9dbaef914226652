import sys
from importlib.util import find_spec

HARNESS_MODULES = (
    "gguf",
    "tqdm",
    "rouge",
    "rapidfuzz",
    "nltk",
    "matplotlib",
    "yaml",
    "pandas",
    "psutil",
    "typing_extensions",
)

missing = [name for name in HARNESS_MODULES if find_spec(name) is None]
if missing:
    sys.exit(
        f"error: the evaluation harness needs {', '.join(missing)}: install its extra, "
        "pip install -e '.[eval]' in the checkout (make setup does)"
    )

from evaluation.runs.numerics import runtime_environment  # noqa: E402

runtime_environment()  # before torch loads its OpenMP and MKL runtimes

from evaluation.cli.main import main  # noqa: E402

sys.exit(main())
