"""What the kernels meet in real models: ``shapes`` (the catalog of real model MLP shapes and the
bench cases built from it) and ``modules`` (the fused MLP functions and the nn.Modules that stand
in for a model's MLP blocks, :func:`swap_mlps`). May import ``kernels`` and everything it may
import; never ``tuning.tuner``.
"""
