"""``python3 -m reference_kernels.tune``: see the package docstring."""

from reference_kernels.tune.cli import main

main()
