"""The command line: ``python -m evaluation SUBCOMMAND`` (``main``) and ``--config`` files (``config_file``)."""
