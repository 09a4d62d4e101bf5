"""The report files of a bench run's records: terminal table, JSON, Markdown, PNG plots, pytest-benchmark
JSON; and a baseline file's history across git commits (``python3 -m pytest_fusion history``). May import
the folders above it (machine/ to baselines/).

Modules, lowest first (each imports only those before it): ``files``, ``history``.
"""
