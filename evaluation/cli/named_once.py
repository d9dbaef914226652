"""What a run is asked to run, each once: a press, task, text, conversation, length or depth named twice (on the
command line, in a ``--config`` file, or both) runs once, with a note. Press specs arrive canonical
(``evaluation.catalogue.specs``), so two spellings of one press are one name here."""

from __future__ import annotations

import argparse
import sys

NAMED = {
    "presses": "--presses",
    "tasks": "--tasks",
    "texts": "--texts",
    "text_file": "--text-file",
    "conversations": "--conversations",
    "lengths": "--lengths",
    "depths": "--depths",
}


def named_once(args: argparse.Namespace) -> None:
    """Each list of names in ``args`` without repeats, in the order first given; a note on stderr for each that had
    some."""
    for dest, flag in NAMED.items():
        values = getattr(args, dest, None)
        if not isinstance(values, list):
            continue
        once = list(dict.fromkeys(values))
        if len(once) < len(values):
            twice = [str(value) for value in once if values.count(value) > 1]
            print(f"note: {flag} names {', '.join(twice)} more than once: each runs once", file=sys.stderr)
            setattr(args, dest, once)
