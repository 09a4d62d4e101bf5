"""The Triton kernels, one module per kernel family with its launch wrapper: ``linear_act``
(linear + bias + activation), ``gated_mlp`` (the gate and up projections in one kernel, ``gated_act``),
``int8_linear``, ``norms``, ``rotary`` and ``softmax`` (each with its eager reference beside it);
``eager`` holds the eager references of the linear and gated kernels and of the MLPs built on them,
``validate`` the argument checks the wrappers share, ``dispatch`` the call path linear_act and
gated_act share (the config forced or picked, the launch of the pointer or the TMA kernel). May
import ``gemm`` and ``tuning.pick`` (the config a call runs) and pytest_fusion's plain core; never
``models`` or ``tuning.tuner``.
"""
