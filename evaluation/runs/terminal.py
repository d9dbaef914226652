"""What the output goes to: a terminal that redraws progress bars, or a log that takes one line per step."""

from __future__ import annotations

import sys


def interactive() -> bool:
    """Whether progress bars have a terminal to redraw; elsewhere (CI, a log file) one line per unit is written."""
    return sys.stderr.isatty()


def quiet_libraries() -> None:
    """Without a terminal, no weight-loading or download bars (a log would hold thousands of redraws)."""
    if not interactive():
        import datasets
        import huggingface_hub.utils
        import transformers

        transformers.utils.logging.disable_progress_bar()
        huggingface_hub.utils.disable_progress_bars()
        datasets.disable_progress_bars()
