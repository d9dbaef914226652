"""Reporting: bootstrap intervals (``intervals``), what a protocol tells its scorecard (``conditions``), one run's
scorecard (``scorecard``), the combined scorecard (``combined``), and rescoring a file (``rescore``)."""

DEFAULT_RESAMPLES = 10_000  # bootstrap resamples of every interval, unless a scorecard is asked for others
DEFAULT_SEED = 0
