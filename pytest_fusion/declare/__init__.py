"""What a kernel author declares: the spec's data types and policy defaults, the argument validators, the
declared inputs (dims, shapes, layouts, dtypes, bounds, mutates, tiles) and the ``fused_kernel`` marker's
signature. May import machine/.

Modules, lowest first (each imports only those before it): ``spec``, ``arguments``, ``inputs``,
``marker``.
"""
