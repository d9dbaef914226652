"""The work of the protocols the project ships, each registered (``protocol.implement``) as this module imports
its module: imported where a run or a dry run starts, since it loads the model stack (torch, KVPress)."""

from __future__ import annotations

from evaluation.protocols.kvpress.work import KVPRESS_WORK
from evaluation.protocols.longbench.work import LONGBENCH_WORK
from evaluation.protocols.perplexity.work import PERPLEXITY_WORK
from evaluation.protocols.probe.work import PROBE_WORK
from evaluation.protocols.ruler.needle_work import NEEDLE_WORK
from evaluation.protocols.ruler.work import RULER_WORK
from evaluation.protocols.streaming.work import STREAM_WORK
from evaluation.protocols.traces.work import TRACES_WORK

IMPLEMENTED = (
    LONGBENCH_WORK,
    STREAM_WORK,
    TRACES_WORK,
    PROBE_WORK,
    PERPLEXITY_WORK,
    RULER_WORK,
    NEEDLE_WORK,
    KVPRESS_WORK,
)
