"""The pytest layer: option types, the run's one configuration object, hook specs, what a run says while it
runs (long waits, re-measures, replays, a line per bench case in a terminal), a process that died inside
a kernel call named with its case, the config tier's budget, rotation and summary, what a bench run leaves
behind, the replay of a timing-only gate failure in a fresh process, cold and warm starts timed in fresh
processes, the bench session, one bench case timed for a test, the ``fusion`` fixture, a check case run
again under compute-sanitizer, the marker's items and the ``--fusion-explore`` items, pytest-benchmark
kept quiet in runs that do not use it, the hooks (the entry point, :mod:`pytest_fusion.plugin.hookimpls`),
and the ``prune`` command of ``python3 -m pytest_fusion.baselines`` (it collects the tests). May import
every folder; nothing imports it but pytest and that command.

Modules, lowest first (each imports only those before it): ``option_types``, ``config``, ``hookspecs``,
``progress``, ``crash_report``, ``config_tier``, ``outputs``, ``replay``, ``cold_start``, ``bench_session``,
``bench_item``, ``fixture``, ``sanitize``, ``items``, ``explore_items``, ``quiet_benchmark``, ``hookimpls``,
``prune``.
"""
