"""Runs and storage: the model a run loads (``models``), where its data lives (``data_location``), its record
(``record``), its result store (``store``), the backends that run its units (``backends``) and progress."""
