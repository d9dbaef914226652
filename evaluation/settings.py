"""Each setting of a run declared once: a field of its configuration (a dataclass) that ``setting`` gives its
command-line option. From those fields come a subcommand's options (``add_options``: flag, type and range check,
default, help; a ``--config`` file's keys are the same options'), the configuration of parsed options
(``configured``), the run record (the configuration's fields, by name) and the option values that rebuild a
recorded run (``option_values``, which ``reproduce`` passes back through the options' own checks).

A field's metadata also says what its value defines (``DEFINES``): how each row is computed (``SCORES``: a resumed
run repeats it, and runs pooled in one scorecard share it) or which examples a run holds (``SAMPLE``: a resumed run
repeats it, pooled runs may differ).
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import Field, dataclass, field, fields, is_dataclass
from functools import partial
from typing import Any, get_type_hints

DEFINES = "defines_results"  # a field's metadata key: what the field's value defines (SCORES or SAMPLE)
SCORES = "scores"  # how each row is computed: a resumed run repeats it, and runs pooled in one scorecard share it
SAMPLE = "sample"  # which examples, on what: a resumed run repeats it, pooled runs may differ
DEFINING = {DEFINES: SCORES}  # ``field(metadata=DEFINING)``
SAMPLED = {DEFINES: SAMPLE}  # ``field(metadata=SAMPLED)``
OPTION = "option"  # a field's metadata key: its command line (``Option``)


@dataclass(frozen=True)
class Argument:
    """One command-line option: its flag and what ``argparse``'s ``add_argument`` takes besides. A ``help`` that is a
    function makes the help of the default a protocol gives (``add_options``'s ``defaults``)."""

    flag: str
    arguments: Mapping[str, Any]

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


@dataclass(frozen=True)
class Option:
    """A setting's command line: its options; ``read``, the field's value of the parsed options (default: the one
    option's value), and ``written``, the option values of a recorded value (default: the value, under the one
    option's name)."""

    options: tuple[Argument, ...]
    read: Callable[[argparse.Namespace], object] | None = None
    written: Callable[[Any], dict] | None = None

    def value(self, args: argparse.Namespace) -> object:
        return self.read(args) if self.read else getattr(args, self.options[0].dest)

    def values_of(self, recorded: object) -> dict:
        return self.written(recorded) if self.written else {self.options[0].dest: recorded}


def setting(
    flag: str,
    *,
    defines: str | None = None,
    read: Callable[[argparse.Namespace], object] | None = None,
    written: Callable[[Any], dict] | None = None,
    **arguments: Any,
) -> Any:
    """A configuration field with its option ``flag`` (``arguments`` as ``add_argument`` takes them): the field's
    default is the option's where the declaration gives one (a switch's is false) and the field is the option's
    value (no ``read``); else the field has none."""
    return declared(Option((Argument(flag, arguments),), read, written), defines)


def declared(option: Option, defines: str | None = None) -> Any:
    """The field of ``option`` (``setting``'s, or one of several options)."""
    metadata = {OPTION: option, **({DEFINES: defines} if defines else {})}
    only = option.options[0].arguments if option.read is None and len(option.options) == 1 else {}
    if "default" not in only and only.get("action") != "store_true":
        return field(metadata=metadata)
    default = only.get("default", False)
    if isinstance(default, (list, dict)):
        return field(default_factory=partial(copy.copy, default), metadata=metadata)
    return field(default=default, metadata=metadata)


def option_of(item: Field) -> Option | None:
    return item.metadata.get(OPTION)


def in_option_order(config_type: type) -> Iterator[Field]:
    """The fields of ``config_type`` in the order their options stand: each class's own fields in their order, the
    class's before those it inherits (a protocol's own options before those its family shares)."""
    every = {item.name: item for item in fields(config_type)}
    seen: set[str] = set()
    for cls in config_type.__mro__:
        for name in vars(cls).get("__annotations__", {}):
            if name in every and name not in seen:
                seen.add(name)
                yield every[name]


def nested_type(config_type: type, item: Field) -> type | None:
    """The settings class a field holds (a dataclass of options of its own), else None."""
    kind = get_type_hints(config_type).get(item.name)
    return kind if isinstance(kind, type) and is_dataclass(kind) else None


def add_options(
    parser: argparse.ArgumentParser, config_type: type, defaults: Mapping[str, object] | None = None
) -> None:
    """The options of ``config_type``'s settings, nested settings' included, in option order; ``defaults``: the
    defaults a protocol gives, by option name."""
    for item in in_option_order(config_type):
        option, nested = option_of(item), nested_type(config_type, item)
        if nested is not None and option is None:
            add_options(parser, nested, defaults)
        for argument in option.options if option else ():
            given = dict(argument.arguments)
            if defaults and argument.dest in defaults:
                given["default"] = defaults[argument.dest]
            if callable(given.get("help")):
                given["help"] = given["help"](given.get("default"))
            parser.add_argument(argument.flag, **given)


def configured(config_type: type, args: argparse.Namespace, **given: object) -> Any:
    """The configuration of parsed options: ``given`` values first, then each field's option, a nested settings
    class through its own options, and a field without an option of its own the shared option of its name
    (``--presses``, ``--allow-import``)."""
    values: dict[str, object] = {}
    for item in fields(config_type):
        option, nested = option_of(item), nested_type(config_type, item)
        if item.name in given:
            values[item.name] = given[item.name]
        elif option is not None:
            values[item.name] = option.value(args)
        elif nested is not None:
            values[item.name] = configured(nested, args)
        elif hasattr(args, item.name):
            values[item.name] = getattr(args, item.name)
    return config_type(**values)


def option_values(config_type: type, recorded: Mapping[str, object]) -> dict:
    """The option values (by option name) of the settings a run recorded (``recorded``, by field name; a nested
    settings class's as a mapping of its own), for each field of ``config_type`` the record holds."""
    values: dict = {}
    for item in fields(config_type):
        if item.name not in recorded:
            continue
        option, nested = option_of(item), nested_type(config_type, item)
        if option is not None:
            values |= option.values_of(recorded[item.name])
        elif nested is not None and isinstance(recorded[item.name], Mapping):
            values |= option_values(nested, recorded[item.name])  # type: ignore[arg-type]
    return values
