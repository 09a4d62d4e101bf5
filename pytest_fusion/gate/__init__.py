"""The performance gate: a stored entry as the gate sees it and whether it can judge a run, the verdict from
measured and stored speedups, the accuracy-drift rule and the cold-start rule. May import the folders above
it (machine/ to measure/).

Modules, lowest first (each imports only those before it): ``comparable``, ``rule``, ``drift``,
``cold_start``.
"""
