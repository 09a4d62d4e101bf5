"""Benchmark core, usable without pytest: timers (``timing``), speedup statistics (``stats``),
providers (``providers``), device peaks (``peaks``) and the
record that crosses pytest-xdist (``record``). Importing this package imports neither torch nor
pytest; the modules that need torch import it when called."""
