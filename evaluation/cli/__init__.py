"""The command line: ``python -m evaluation SUBCOMMAND``, option types, and ``--config`` files."""
