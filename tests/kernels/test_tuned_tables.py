"""The committed tuned tables name only configs their keys can run: a table made stale by a
changed config list or candidate rule would be ignored at run time with a warning, so the picks
the baselines were timed with would silently stop being used."""

import json

import pytest
import torch

from reference_kernels.gemm import targets
from reference_kernels.gemm.configs import GATED_CONFIGS, LINEAR_CONFIGS, candidates, config_name
from reference_kernels.tuning import pick

TABLES = sorted(pick.TABLE_DIR.glob("*.json"))
KERNELS = {"gated": (GATED_CONFIGS, 2), "linear": (LINEAR_CONFIGS, 1)}


def parse_key(key: str) -> tuple[str, torch.dtype, int, bool]:
    """``(kernel, dtype, M bucket, tma)`` of a table key (pick.table_key's format)."""
    kernel, dtype, m, n, k, path = key.split("/")
    assert m[0] == "M" and n[0] == "N" and k[0] == "K" and path in ("tma", "pointer"), key
    return kernel, getattr(torch, dtype), int(m[1:]), path == "tma"


def test_table_key_round_trips():
    key = pick.table_key("gated", torch.bfloat16, 1000, 4096, 1024, True)
    assert parse_key(key) == ("gated", torch.bfloat16, 1024, True)


@pytest.mark.parametrize("path", TABLES, ids=[p.stem for p in TABLES])
def test_every_pick_is_a_candidate(path):
    data = json.loads(path.read_text())
    # Both committed tables are of sm_90 GPUs; a table of another GPU needs its target here.
    assert any(name in data["meta"]["device"] for name in ("H100", "H200")), data["meta"]["device"]
    assert data["picks"], f"{path.name} has no picks"
    stale = []
    for key, entry in data["picks"].items():
        kernel, dtype, m, tma = parse_key(key)
        configs, weights = KERNELS[kernel]
        names = [config_name(c) for c in candidates(configs, m, dtype.itemsize, weights, tma, targets.HOPPER)]
        if entry["config"] not in names:
            stale.append(f"{key}: {entry['config']}")
    assert not stale, f"{path.name} names configs that are not candidates: " + "; ".join(stale)

