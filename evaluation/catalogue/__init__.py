"""The press catalogue: what a spec is (``specs``), the press classes and what each declares of itself
(``registry``), the types and ranges of their parameters (``parameters``, ``ranges``), what a press reads of a
prefill (``needs``), a spec resolved once for a run (``resolved``), and budgets (``budgets``)."""
