"""What a protocol is, and the registry of protocols.

A ``Protocol`` owns everything that differs between LongBench, each streamed task, the eviction lab and the
probe: its typed configuration, whose fields declare its settings and their command-line options
(``evaluation.settings``: the options, the configuration of parsed options and the option values of a recorded run
come from them), its plan without a model (``dry_run``), its units of work and the settings its run records
(``plan``), the key of its rows (``row_key``) and its scorecard (``benchmark``, ``write_scorecard``). Everything they
share, the run record, the result store, the backend, resume, the scorecard's call and the finish, is one loop:
``evaluation.protocols.loop``.

A protocol module defines its protocol and calls ``register``; ``evaluation.protocols.shipped`` imports the modules
the project ships, so the command line builds one subcommand per registered protocol and the combined scorecard
finds a run's benchmark by the name its run.json records. A protocol's work (``Implementation``), which imports the
model stack, registers itself with ``implement`` as its module is imported (``evaluation.protocols.shipped_work``).
A configuration marks the settings that define its results in its fields' metadata (``DEFINES``), and a resumed
run must repeat them.
"""

from __future__ import annotations

import argparse
from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import ClassVar, Generic, TypeVar, get_args, get_type_hints

from typing_extensions import NotRequired, TypedDict

from evaluation.reporting.conditions import Benchmark
from evaluation.reporting.rescoring import Rescoring
from evaluation.runs.backends import Unit, Work
from evaluation.runs.models import ModelSettings
from evaluation.settings import DEFINES, SAMPLE, SCORES, add_options, configured, option_values

REFERENCE = "h2o"  # the press every other press is compared with, in every scorecard
# the model's field: what each key of its record defines (a scorecard pools the runs of one model name apart)
MODEL_DEFINING = {
    DEFINES: {"model": SAMPLE, "dtype": SCORES, "attn_implementation": SCORES, "device": SAMPLE, "threads": SAMPLE}
}


def results_defining(config: object) -> dict[str, str]:
    """The recorded settings that define ``config``'s results, in field order (nested settings included), each with
    what it defines (``SCORES`` or ``SAMPLE``)."""
    keys: dict[str, str] = {}
    for item in fields(config):  # type: ignore[arg-type]
        marked = item.metadata.get(DEFINES)
        value = getattr(config, item.name)
        if isinstance(marked, str):
            keys[item.name] = marked
        elif marked:
            keys |= marked
        elif is_dataclass(value) and not isinstance(value, (type, ModelSettings)):
            keys |= results_defining(value)
    return keys


def scores_settings(config_type: type) -> list[str]:
    """The settings of a configuration class that define how each row is computed (``SCORES``), its nested settings
    classes' included: what a run.json names ``pooled_settings``, for one written before it named them."""
    hints = get_type_hints(config_type)
    keys: list[str] = []
    for item in fields(config_type):
        marked = item.metadata.get(DEFINES)
        if isinstance(marked, dict):
            keys += [key for key, defines in marked.items() if defines == SCORES]
        elif marked == SCORES:
            keys.append(item.name)
        elif marked is None and is_dataclass(hints.get(item.name)):
            keys += scores_settings(hints[item.name])
    return keys


def recorded(config: object) -> dict:
    """``config`` as run.json records it: flat, a nested settings object's fields beside the configuration's own."""
    record: dict = {}
    for name, value in asdict(config).items():  # type: ignore[call-overload]
        nested = getattr(config, name)
        if is_dataclass(nested) and not isinstance(nested, ModelSettings):
            record.update(value)
        else:
            record[name] = value
    return record


class Row(TypedDict):
    """What every protocol's row holds for its scorecard: the press (its spec), the budget (its key and its label)
    and the score, None for a failed cell, whose ``error`` says why. A protocol's own row adds what identifies its
    example and what it measured."""

    press: str
    budget: str
    budget_label: str
    score: float | None
    error: NotRequired[str]


LIKELIHOOD = ("answer_nll", "answer_tokens")  # a row's gold answer likelihood, as LongBench and streamed rows hold it


def lacks(row: Row | None, fields: tuple[str, ...]) -> bool:
    """A stored row of a cell that ran (not a failed one) without some of ``fields``: older code's, which a resumed
    run completes without running the cell again."""
    return row is not None and not row.get("error") and any(field not in row for field in fields)


@dataclass(frozen=True)
class Plan:
    """What a run does once its settings are checked and its data read: its units, the work of one unit, and what
    its run.json records beside the configuration (``settings``: data fingerprints, each press's path...)."""

    units: list[Unit]
    work: Work
    settings: dict = field(default_factory=dict)
    sample: tuple[str, ...] = ()  # keys of ``settings`` that define which examples a run holds (a data fingerprint)
    summary: str = ""  # the plan in one line for its progress: units x cells, tokens to decode


C = TypeVar("C")


class Implementation(ABC, Generic[C]):
    """A protocol's work, which imports the model stack: what a run or a dry run of its configuration does. Its
    module registers it (``implement``) as it is imported."""

    @abstractmethod
    def dry_run(self, protocol: Protocol[C], config: C) -> str:
        """The work a run would do and what it would fetch, without a model, the network or a file written."""

    @abstractmethod
    def plan(self, protocol: Protocol[C], config: C) -> Plan:
        """Check the settings, read the data, and return the units: everything a run does before the model."""

    @abstractmethod
    def write_scorecard(self, protocol: Protocol[C], config: C, rows: list[dict]) -> None:
        """The scorecard of ``rows`` under the run's folder."""

    def steps(self, protocol: Protocol[C], config: C, unit: Unit) -> list[frozenset]:
        """``Protocol.steps``: one group where only the whole unit is (its cells run together)."""
        return [unit.keys]


class Protocol(ABC, Generic[C]):
    """One protocol: see the module's docstring. ``presses`` are the default press specs (None: the protocol
    takes none); ``record_defaults`` stand for settings an older run.json did not record, ``row_defaults`` for
    fields an older row did not; its rows are a ``Row`` of its own (a ``TypedDict``), one JSON line each.

    What a protocol declares (its configuration with its options, row key and benchmark) is light to import, so the
    command line lists every protocol at once; its work (``dry_run``, ``plan``, ``write_scorecard``) is its
    ``Implementation``, registered by the module that defines it, which a run or a dry run imports
    (``evaluation.protocols.shipped_work``). A protocol that does not care for that split defines those methods in
    its own class.
    """

    name: str
    help: str
    description: str
    benchmark: Benchmark
    presses: tuple[str, ...] | None = None
    rescoring: Rescoring | None = None  # how ``python -m evaluation score`` rescores its predictions; None: it does not
    reference: ClassVar[str] = REFERENCE
    likelihood: ClassVar[tuple[str, ...]] = ()  # a row's answer likelihood fields, completed on resume (``lacks``)
    row_defaults: ClassVar[dict[str, object]] = {}  # a row field added later: what a row without it stands for

    def config_type(self) -> type:
        """The protocol's configuration class: the ``C`` of its ``Protocol[C]``."""
        return get_args(type(self).__orig_bases__[0])[0]  # type: ignore[attr-defined]

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        """The protocol's own options, its configuration's (the shared ones, model, presses, output, backend, are
        added for it)."""
        add_options(parser, self.config_type())

    def configure(self, args: argparse.Namespace, model: ModelSettings, output: Path) -> C:
        """The typed configuration of parsed options."""
        return configured(self.config_type(), args, model=model, output=output)

    @abstractmethod
    def row_key(self, row: Row) -> Hashable:
        """What identifies a row: a resumed run skips the cells whose key the store holds."""

    @property
    def implementation(self) -> Implementation[C]:
        """The protocol's work, as its module registered it."""
        for kind in type(self).__mro__:
            if kind in _IMPLEMENTATIONS:
                return _IMPLEMENTATIONS[kind]
        raise LookupError(f"protocol {self.name!r} has no implementation: import the module that implements it")

    def dry_run(self, config: C) -> str:
        """The work a run would do and what it would fetch, without a model, the network or a file written."""
        return self.implementation.dry_run(self, config)

    def plan(self, config: C) -> Plan:
        """Check the settings, read the data, and return the units: everything a run does before the model."""
        return self.implementation.plan(self, config)

    def write_scorecard(self, config: C, rows: list[dict]) -> None:
        """The scorecard of ``rows`` under the run's folder."""
        self.implementation.write_scorecard(self, config, rows)

    def options_of(self, settings: dict) -> dict:
        """The option values (by destination) that configure a run with the recorded ``settings`` (run.json's
        ``config``): each recorded setting of a field with an option of another name or form through that field's
        declaration, a setting an older run did not record at its ``record_defaults``, and the rest (the model's,
        the presses) as recorded. ``evaluation.cli.reproduce`` checks the configuration they rebuild against every
        recorded setting."""
        return {**settings, **option_values(self.config_type(), {**self.record_defaults(), **settings})}

    def steps(self, config: C, unit: Unit) -> list[frozenset]:
        """The keys of ``unit`` in the order its work stores them, grouped so that the work can stop after any group
        with the rows so far equal to the whole unit's (a streamed question's cells, decoded as one batch); one
        group where only the whole unit is (its cells run together). A reproduced sample may be a prefix of
        them."""
        return self.implementation.steps(self, config, unit)

    def record_defaults(self) -> dict:
        return ModelSettings().record()

    def scores_settings(self) -> list[str]:
        """The settings runs pooled in one scorecard must share: its configuration's ``SCORES`` fields."""
        return scores_settings(self.config_type())


_REGISTRY: dict[str, Protocol] = {}
_IMPLEMENTATIONS: dict[type, Implementation] = {}


def register(protocol: Protocol) -> Protocol:
    _REGISTRY[protocol.name] = protocol
    return protocol


def implement(protocol: type[Protocol], implementation: Implementation) -> None:
    """Register ``implementation`` as the work of every protocol of the class ``protocol``."""
    _IMPLEMENTATIONS[protocol] = implementation


def registered() -> dict[str, Protocol]:
    """Every protocol registered so far, by name, in the order registered."""
    return dict(_REGISTRY)
