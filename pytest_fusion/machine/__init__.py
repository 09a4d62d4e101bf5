"""The machine the tests run on: files replaced atomically, the record of the kernel call a process is in
(for a crash to name it), per-user inter-process locks, and the devices
(environment switches, visible GPUs, xdist worker pinning, device names and slugs). Imports nothing from
pytest_fusion outside this folder; torch is imported where a function needs it.

Modules, lowest first (each imports only those before it): ``atomic``, ``crash_record``, ``locks``,
``devices``.
"""
