"""The protocols the project ships, each registered as this module imports its module: the command line's
subcommands and the combined scorecard's benchmarks."""

from __future__ import annotations

from evaluation.protocols.kvpress.protocol import KVPRESS
from evaluation.protocols.locomo.task import LOCOMO
from evaluation.protocols.longbench.protocol import LONGBENCH
from evaluation.protocols.perplexity.protocol import PERPLEXITY
from evaluation.protocols.probe.protocol import PROBES
from evaluation.protocols.protocol import Protocol, registered
from evaluation.protocols.ruler.protocol import NEEDLE, RULER
from evaluation.protocols.synthetic.task import SYNTHETIC_TASKS
from evaluation.protocols.traces.protocol import TRACES

# the subcommands' order
SHIPPED = (
    LONGBENCH.name,
    LOCOMO.name,
    *SYNTHETIC_TASKS,
    TRACES.name,
    PROBES.name,
    PERPLEXITY.name,
    RULER.name,
    NEEDLE.name,
    KVPRESS.name,
)


def protocols() -> dict[str, Protocol]:
    """Every registered protocol, by name: the project's, in ``SHIPPED`` order, then any other module's."""
    known = registered()
    return {name: known[name] for name in SHIPPED} | known
