"""Shared pieces of the GEMM kernels (linear_act, gated_act; int8_linear takes the tile order and
the pointer K loop): ``targets`` (what a GPU gives them: the TMA path, the shared-memory budget;
whether the Triton interpreter runs), ``configs`` (the tile configs and which suit a call),
``epilogue`` (the activations and the tile epilogue: bias, activation, gate product, store),
``schedule`` (which output tile a program computes, how it is stored, the one-tile-per-program
grid), ``pointer_tile`` (the pointer kernel: a tile's offsets, its K loop over pointer loads, the
masked store; written once for both kernels), ``split_tail`` (the K split of the tiles past the
last full wave), ``tma`` (when the TMA path runs, its descriptors and launch plan) and
``tile_loop`` (the TMA kernel: its loop over whole tiles and split tails, written once for both
kernels). May import torch, triton and pytest_fusion's plain core (never
``pytest_fusion.plugin``); nothing else of reference_kernels.
"""
