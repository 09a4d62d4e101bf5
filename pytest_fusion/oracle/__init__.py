"""Whether one case is right: its input tensors, the golden, eager and magnitude runs, the error budget,
eager parity, in-place inputs, memory hygiene, the backward checks, a check's device-memory footprint and
its admission, the failure kinds, and the check of one case. May import machine/ and declare/.

Modules, lowest first (each imports only those before it): ``tensors``, ``autotune``, ``failures``,
``budget``, ``parity``, ``golden``, ``inplace``, ``hygiene``, ``backward``, ``memory``, ``case``.
"""
