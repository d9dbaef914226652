"""The press catalogue: what a spec is (``specs``), the press classes and what each declares of itself
(``registry``), what a press reads of a prefill (``needs``), a spec resolved once for a run (``resolved``), and
budgets (``budgets``)."""
