"""Which tile config a kernel call runs, and the tool that decides it offline: ``cache`` (the
per-machine tuning cache: its directory, fingerprint and files), ``pick`` (the committed table,
then the cache, then tuning at run time: what the kernels call), ``tables/`` (the committed tuned
tables, ``<device>.json``: data the tuner writes) and ``tuner`` (``python3 -m
reference_kernels.tune``: checks every config, times the candidates at the real shapes and writes a
table). ``cache`` and ``pick`` may import ``gemm`` and pytest_fusion's plain core only, since the
kernels import them; ``tuner`` sits above every other folder and may import any of them.
"""
