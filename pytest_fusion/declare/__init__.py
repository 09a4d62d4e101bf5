"""What a kernel author declares: the spec's data types and policy defaults, the sizes a shape may
derive from the dims, the argument validators, the declared inputs (dims, shapes, layouts, dtypes,
bounds, mutates, tiles, multiples) and the ``fused_kernel`` marker's signature. May import machine/.

Modules, lowest first (each imports only those before it): ``spec``, ``sizes``, ``arguments``, ``inputs``,
``marker``.
"""
