"""The streaming multi-turn protocol, for any dataset registered as a ``StreamTask``: the history grows session by
session and turn by turn, and before every question it is re-compressed to each budget with each press's own code.
``config`` (the settings), ``task`` (what a dataset contributes), ``protocol`` (a task as a registered protocol),
``work`` (its plan, dry run and scorecard), ``conversation`` (one conversation streamed through every cell),
``placements`` (where the questions go). LoCoMo (``evaluation.protocols.locomo``) and the synthetic families
(``evaluation.protocols.synthetic``) are tasks registered with it."""
