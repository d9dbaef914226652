"""The press catalogue: what a spec names (``specs``), KVPress's names and how a budget reaches a press
(``registry``), what each press reads of a prefill (``needs``), and budgets (``budgets``)."""
