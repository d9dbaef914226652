"""Reporting: bootstrap intervals (``intervals``), what a protocol tells its scorecard (``conditions``), one run's
scorecard (``scorecard``), the combined scorecard (``combined``), and rescoring a file (``rescore``)."""
