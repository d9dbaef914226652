"""The one exception type the command line turns into a clear message (and exit status 2)."""


class EvaluationError(Exception):
    """Bad input or a missing resource: the message says what is wrong and what to do."""
