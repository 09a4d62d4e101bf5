"""The demo, ``python3 -m pytest_fusion demo``: the main job on shipped kernels with no code written.
It copies :mod:`pytest_fusion.demo.test_demo` into a temporary directory and runs pytest on it there,
in steps: the property checks, a planted bug caught, a bench saved into a baseline, a planted slower
kernel failing the gate. It drives pytest in subprocesses and imports no other folder.

Modules, lowest first (each imports only those before it): ``test_demo``, ``run``.
"""
