"""Synthetic streamed task families, generated offline from a seed and run by the streaming protocol
(``evaluation.protocols.streaming``): ``reuse`` (endogenous reuse, with matched controls) and ``multiquery`` (one long
shared context, several questions)."""
