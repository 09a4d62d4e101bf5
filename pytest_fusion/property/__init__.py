"""The property test over many cases: Hypothesis strategies, the ``--fusion-repro`` payload, running each
drawn example through the oracle (retry, GPU memory), the config tier (a passing search's smallest cases at
each autotune config) and :func:`check_kernel`. May import the folders
above: machine/, declare/, oracle/.

Modules, lowest first (each imports only those before it): ``repro``, ``strategies``, ``examples``,
``config_tier``, ``check``.
"""
