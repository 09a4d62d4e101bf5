"""The parameters a ``fused_kernel`` test is parametrized into (``plugin/items.py``): their ids,
and kinds the hooks can tell apart."""

import torch

from pytest_fusion import make_spec
from pytest_fusion.declare.spec import BenchCase
from pytest_fusion.plugin.items import BenchItem, CheckItem, ExploreItem


def test_each_item_kind_has_its_id_and_is_no_other_kind():
    spec = make_spec(torch.relu, inputs={"x": ("M",)}, dims={"M": (1, 4)})
    check, explore = CheckItem(spec, "float16"), ExploreItem(spec, "float16")
    bench = BenchItem(spec, BenchCase("decode", {"M": 1}, ("float16",)), "float16")
    assert [check.id, explore.id, bench.id] == ["float16", "explore-float16", "bench-decode-float16"]
    # pytest_pyfunc_call dispatches on isinstance: were one kind the other's subclass, an explore
    # item would run as a check (or the reverse).
    assert not isinstance(explore, CheckItem) and not isinstance(check, ExploreItem)
    assert check != explore  # the same fields, another kind
