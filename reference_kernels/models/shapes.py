"""Catalog of real model MLP shapes (public model configs) and bench-case builders.

Hidden and intermediate sizes are ``hidden_size`` and ``intermediate_size`` of each model's
published config (GPT-2: n_embd and 4 x n_embd). Tokens M in :data:`TOKENS` span decode (1, 16)
to prefill (8192).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

TOKENS = (1, 16, 128, 1024, 8192)
"""Token counts M timed for each model: decode of 1 and 16 sequences, then prefill sizes."""

BENCH_DTYPES = ("bfloat16", "float16")
"""Dtypes the bench cases are timed in (the dtypes these models are served in)."""


@dataclasses.dataclass(frozen=True)
class MLPShape:
    """One model's MLP block.

    Attributes:
        model: display name; ``slug`` is its bench-case prefix.
        hidden: H, the model width (K of the up projections, N of the down projection).
        intermediate: I, the MLP width (N of the up projections, K of the down projection).
        kind: ``"plain"`` (Linear-act-Linear) or ``"gated"`` (act(gate) * up, then down).
        activation: the kernels' activation name (``gelu``, ``gelu_tanh``, ``silu``).
        bias: whether the projections have biases.
        tokens: the M values benchmarked.
    """

    model: str
    slug: str
    hidden: int
    intermediate: int
    kind: str
    activation: str
    bias: bool
    tokens: tuple[int, ...] = TOKENS


CATALOG: tuple[MLPShape, ...] = (
    MLPShape("all-MiniLM-L6-v2", "minilm", 384, 1536, "plain", "gelu", True),
    MLPShape("GPT-2 small", "gpt2", 768, 3072, "plain", "gelu_tanh", True),
    # The seed blog's GeGLU MLP: batch 64 x sequence 128 = 8192 tokens, one shape only.
    MLPShape("seed blog GeGLU", "seed-geglu", 768, 3072, "gated", "gelu_tanh", False, (8192,)),
    MLPShape("Gemma-2B", "gemma-2b", 2048, 16384, "gated", "gelu_tanh", False),
    MLPShape("Llama-3-8B / Mistral-7B", "llama3-8b", 4096, 14336, "gated", "silu", False),
    MLPShape("Qwen2.5-7B", "qwen2.5-7b", 3584, 18944, "gated", "silu", False),
    MLPShape("Llama-3-70B", "llama3-70b", 8192, 28672, "gated", "silu", False),
)

SEED_GEGLU = CATALOG[2]
"""The seed blog GeGLU MLP: M = 8192, 768 -> 3072, bf16, gelu tanh, no bias."""


def select(
    *, kind: str | None = None, activation: str | None = None, bias: bool | None = None
) -> tuple[MLPShape, ...]:
    """Catalog entries matching every filter given (None matches all).

    Raises:
        ValueError: ``kind`` other than "plain" / "gated", or a filter that matches nothing.
    """
    if kind not in (None, "plain", "gated"):
        raise ValueError(f"kind must be 'plain' or 'gated', got {kind!r}")
    out = tuple(
        s
        for s in CATALOG
        if (kind is None or s.kind == kind)
        and (activation is None or s.activation == activation)
        and (bias is None or s.bias == bias)
    )
    if not out:
        raise ValueError(f"no catalog shape has kind={kind!r}, activation={activation!r}, bias={bias!r}")
    return out


def bench_cases(shapes: Iterable[MLPShape], dtypes: Sequence[str] = BENCH_DTYPES) -> dict[str, dict]:
    """Marker ``bench=`` cases, one per model and token count, named ``<slug>-M<tokens>``:
    dims M = tokens, K = hidden, N = intermediate. The same dims serve an up projection
    (x (M, K) -> (M, N)) and a whole MLP (K -> N -> K)."""
    return {
        f"{s.slug}-M{m}": dict(M=m, K=s.hidden, N=s.intermediate, dtypes=tuple(dtypes))
        for s in shapes
        for m in s.tokens
    }


def up_flops(M: int, K: int, N: int) -> int:
    """FLOPs of one M x K x N GEMM (2 per multiply-add); the epilogue is not counted."""
    return 2 * M * K * N


def gated_flops(M: int, K: int, N: int) -> int:
    """FLOPs of the gate and up GEMMs together."""
    return 4 * M * K * N


def mlp_flops(M: int, K: int, N: int) -> int:
    """FLOPs of a Linear-act-Linear MLP, hidden K, intermediate N: two M x K x N GEMMs."""
    return 4 * M * K * N


def gated_mlp_flops(M: int, K: int, N: int) -> int:
    """FLOPs of a gated MLP, hidden K, intermediate N: three M x K x N GEMMs."""
    return 6 * M * K * N
