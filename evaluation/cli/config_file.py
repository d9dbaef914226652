"""``--config FILE.yaml``: option values from a file, read as data and checked by each flag's own type.

Each key is an option's name, with underscores or dashes (``max_history_tokens``, ``attn-implementation``);
KVPress's evaluation keys are read as ``evaluation.cli.kvpress_keys`` maps them (its ``evaluate_config.yaml``
runs as is). Each value goes through its flag's type, range and choices, item by item:
a scalar where a list goes is a one-element list (a spec string is one spec, whatever it reads like), a list where
one value goes is refused, a switch takes a real boolean, ``null`` leaves the default. Settings are layered as
the defaults < the file < the command line: a value the command line gives wins. Consent is never read from a file:
``allow_import`` (``--allow-import``, which runs the module a spec imports) and ``committed`` (``--committed``,
which lets a run write under results/) are refused there. Each mistake is a one-line
``EvaluationError`` naming the file and, for an unknown key, the nearest option.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import sys
from pathlib import Path

import yaml

from evaluation.cli.kvpress_keys import ALIASES, translated
from evaluation.errors import EvaluationError

MAX_CONFIG_BYTES = 1 << 20
COMMAND_LINE_ONLY = {
    "allow_import": "importing a press's module runs its code, which only the user may allow",
    "committed": "only the Makefile's committed targets write the committed runs under results/",
}


class DuplicateKey(yaml.YAMLError):
    """A mapping of the file gives one key twice."""


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping giving one key twice (``n: 1`` then ``n: 7``), which it would
    read as the last value."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        lines: dict[tuple[str, str], int] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                key, line = (key_node.tag, key_node.value), key_node.start_mark.line + 1
                if key in lines:
                    raise DuplicateKey(f"the key {key_node.value!r} is given twice (lines {lines[key]} and {line})")
                lines[key] = line
        return super().construct_mapping(node, deep=deep)


def with_config(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv``; values from its ``--config`` file sit between the defaults and the command line."""
    args = parser.parse_args(argv)
    path = getattr(args, "config", None)
    if path is None:
        return args
    subparser = subcommand(parser, args.command)
    given = given_on_command_line(parser, args.command, argv)
    for dest, value in file_values(subparser, read(path), path, args.command).items():
        if dest not in given:
            setattr(args, dest, value)
    return args


def subcommand(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    subparsers = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    return subparsers.choices[command]


def given_on_command_line(parser: argparse.ArgumentParser, command: str, argv: list[str]) -> set[str]:
    """The options ``argv`` sets itself: parsed by a copy of the parser whose defaults are all left unset."""
    unset = copy.deepcopy(parser)
    for action in subcommand(unset, command)._actions:
        action.default = argparse.SUPPRESS
    return set(vars(unset.parse_args(argv)))


def read(path: Path) -> dict:
    """The file's mapping of option names to values: YAML without tags (safe), each key given once."""
    if path.exists() and not path.is_file():
        raise EvaluationError(f"--config {path}: not a file (a folder, a pipe or a device): give a YAML file")
    try:
        if path.is_file() and path.stat().st_size > MAX_CONFIG_BYTES:
            raise EvaluationError(
                f"--config {path}: {path.stat().st_size} bytes, over the {MAX_CONFIG_BYTES} a file of option values "
                "may hold: give a shorter one"
            )
        values = yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader) or {}
    except UnicodeDecodeError as error:
        raise EvaluationError(f"--config {path}: not UTF-8 (byte {error.start}): save it as UTF-8") from None
    except DuplicateKey as error:
        raise EvaluationError(f"--config {path}: {error}: give each option once") from None
    except (OSError, yaml.YAMLError) as error:
        raise EvaluationError(f"--config {path}: not a readable YAML file ({reason(error)})") from error
    if not isinstance(values, dict):
        raise EvaluationError(f"--config {path}: a mapping of option names to values, not {type(values).__name__}")
    return values


def reason(error: OSError | yaml.YAMLError) -> str:
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        return f"{error.problem}, line {error.problem_mark.line + 1}"
    return str(error).splitlines()[0]


def file_values(subparser: argparse.ArgumentParser, values: dict, path: Path, command: str) -> dict[str, object]:
    """Each option ``values`` sets (by its destination), checked and converted as its flag converts the
    command line's text; options set to null are left out. KVPress's keys are translated first, each note printed
    on one line."""
    left_out = ("help", "config", *COMMAND_LINE_ONLY)
    options = {a.dest: a for a in subparser._actions if a.option_strings and a.dest not in left_out}
    values, notes = translated(values, command, set(options), path)
    for note in notes:
        print(note, file=sys.stderr)
    keys: dict[str, object] = {}
    converted: dict[str, object] = {}
    for key, value in values.items():
        dest = ALIASES.get(str(key), str(key).replace("-", "_"))
        if dest in COMMAND_LINE_ONLY:
            raise EvaluationError(
                f"--config {path}: {key!r} is not taken from a file ({COMMAND_LINE_ONLY[dest]}): give "
                f"--{dest.replace('_', '-')} on the command line"
            )
        if dest not in options:
            raise EvaluationError(f"--config {path}: unknown key {key!r}{nearest(str(key), options)}")
        if dest in keys:
            raise EvaluationError(
                f"--config {path}: {keys[dest]!r} and {key!r} both set {options[dest].option_strings[-1]}"
            )
        keys[dest] = key
        if value is not None:
            try:
                converted[dest] = option_value(options[dest], str(key), value)
            except (argparse.ArgumentError, ValueError) as error:
                raise EvaluationError(f"--config {path}: {error}") from None
    return converted


def option_value(action: argparse.Action, key: str, value: object) -> object:
    """What ``action`` stores for ``value``: a switch's constant for true, its default for false; else each item
    through the flag's type and choices, one value or a list as its ``nargs`` says. A value of the wrong shape is
    a ``ValueError``, an item the flag refuses an ``argparse.ArgumentError``."""
    if action.nargs == 0:
        if not isinstance(value, bool):
            raise ValueError(f"{key} is true or false, not {value!r}")
        return action.const if value else action.default
    one = action.nargs is None
    if one and isinstance(value, list):
        raise ValueError(f"{key} takes one value, not a list")
    items = value if isinstance(value, list) else [value]
    if any(item is None or isinstance(item, (dict, list, bool)) for item in items):
        raise ValueError(f"{key} takes {'a value' if one else 'values'} like {action.option_strings[-1]}")
    if action.nargs == "+" and not items:
        raise argparse.ArgumentError(action, "expected at least one argument")
    checked = [item_value(action, str(item)) for item in items]
    return checked[0] if one else checked


def item_value(action: argparse.Action, text: str) -> object:
    """``text`` through the flag's type and choices, with argparse's own messages."""
    try:
        value = text if action.type is None else action.type(text)
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentError(action, str(error)) from None
    except (TypeError, ValueError):
        name = getattr(action.type, "__name__", repr(action.type))
        raise argparse.ArgumentError(action, f"invalid {name} value: {text!r}") from None
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(repr, action.choices))
        raise argparse.ArgumentError(action, f"invalid choice: {value!r} (choose from {choices})")
    return value


def nearest(key: str, options: dict[str, argparse.Action]) -> str:
    names = {dest: action.option_strings[-1] for dest, action in options.items()}
    names |= {alias: names[dest] for alias, dest in ALIASES.items() if dest in names}
    close = difflib.get_close_matches(key.replace("-", "_"), list(names), n=1, cutoff=0.5)
    return (
        f"; did you mean {names[close[0]]}?" if close else f"; the options are {', '.join(sorted(set(names.values())))}"
    )
