"""Runs and storage: the model a run loads (``models``), where its data lives (``data_location``), the reader of
its JSON rows, data and results alike (``json_rows``), its record (``record``), its result store (``store``), the
backends that run its units (``backends``) and progress."""
