"""``--config FILE.yaml``: option values from a file, validated by the same parser as the command line.

Each key is an option's name, with underscores or dashes (``max_history_tokens``, ``attn-implementation``);
KVPress's evaluation keys are accepted where they mean the same (``press_name`` for ``presses``,
``compression_ratio`` for ``ratios``). Each value becomes the option's own command-line arguments and goes
through its flag's type and range check: a scalar where a list goes is a one-element list (a spec string is one
spec), a switch takes a real boolean, ``null`` leaves the default. The command line, parsed after the file,
overrides it. Each mistake is a one-line ``EvaluationError`` naming the file and, for an unknown key, the
nearest option.
"""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path

from evaluation.errors import EvaluationError

ALIASES = {"press_name": "presses", "compression_ratio": "ratios"}  # KVPress's evaluate.py config keys


def with_config(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv``; values from its ``--config`` file sit between the defaults and the command line."""
    args = parser.parse_args(argv)
    path = getattr(args, "config", None)
    if path is None:
        return args
    subparser = parser._subparsers._group_actions[0].choices[args.command]
    from_file = file_arguments(subparser, read(path), path)
    try:
        parser.exit_on_error = subparser.exit_on_error = False
        parser.parse_args([args.command, *from_file])
    except argparse.ArgumentError as error:
        raise EvaluationError(f"--config {path}: {error}") from None
    finally:
        parser.exit_on_error = subparser.exit_on_error = True
    at = argv.index(args.command) + 1
    return parser.parse_args([*argv[:at], *from_file, *argv[at:]])


def read(path: Path) -> dict:
    import yaml

    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as error:
        raise EvaluationError(f"--config {path}: not a readable YAML file ({error})".splitlines()[0]) from error
    if not isinstance(values, dict):
        raise EvaluationError(f"--config {path}: a mapping of option names to values, not {type(values).__name__}")
    return values


def file_arguments(subparser: argparse.ArgumentParser, values: dict, path: Path) -> list[str]:
    """The command-line arguments that say what ``values`` say."""
    options = {a.dest: a for a in subparser._actions if a.option_strings and a.dest not in ("help", "config")}
    arguments: list[str] = []
    given: dict[str, object] = {}
    for key, value in values.items():
        dest = ALIASES.get(str(key), str(key).replace("-", "_"))
        if dest not in options:
            raise EvaluationError(f"--config {path}: unknown key {key!r}{nearest(str(key), options)}")
        if dest in given:
            raise EvaluationError(
                f"--config {path}: {given[dest]!r} and {key!r} both set {options[dest].option_strings[-1]}"
            )
        given[dest] = key
        action, flag = options[dest], options[dest].option_strings[-1]
        if value is None:
            continue
        if action.nargs == 0:
            if not isinstance(value, bool):
                raise EvaluationError(f"--config {path}: {key} is true or false, not {value!r}")
            arguments += [flag] if value else []
            continue
        items = value if isinstance(value, list) else [value]
        if action.nargs is None and isinstance(value, list):
            raise EvaluationError(f"--config {path}: {key} takes one value, not a list")
        if any(isinstance(item, (dict, list, bool)) for item in items):
            raise EvaluationError(f"--config {path}: {key} takes {'values' if action.nargs else 'a value'} like {flag}")
        arguments += [f"{flag}={items[0]}"] if action.nargs is None else [flag, *map(str, items)]
    return arguments


def nearest(key: str, options: dict[str, argparse.Action]) -> str:
    names = {dest: action.option_strings[-1] for dest, action in options.items()}
    names |= {alias: names[dest] for alias, dest in ALIASES.items() if dest in names}
    close = difflib.get_close_matches(key.replace("-", "_"), list(names), n=1, cutoff=0.5)
    return f"; did you mean {names[close[0]]}?" if close else f"; the options are {', '.join(sorted(names.values()))}"
