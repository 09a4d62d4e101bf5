"""``python3 -m reference_kernels.tune``: the tuner's command, kept at this name for the docs and
scripts that run it; the tuner itself is :mod:`reference_kernels.tuning.tuner` (its docstring says
what a run does)."""

from reference_kernels.tuning.tuner.cli import main

if __name__ == "__main__":
    main()
