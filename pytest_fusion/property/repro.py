"""``--fusion-repro``: the one case a failure printed, checked before a tensor is made.

A payload is the JSON a failure prints (``tensors.Case.as_dict``)::

    {"dims": {"M": 17, "K": 1, "N": 63}, "dtype": "float16", "layouts": {"x": "transposed"},
     "seed": 12345, "special": false, "amplitude": 1.0}

:func:`parse` checks its types when the option is read (a bad one is a usage error);
:func:`case_for` checks it against one test's spec (dims inside the declared ranges, known
inputs and layouts, inputs no larger than :data:`MAX_REPRO_ELEMENTS`) and builds the case. Both
raise ValueError with a message naming the field, never a traceback from deeper code. A payload's
keys may come in any order; :func:`dumps` prints one with its dims in the order the test declares
them (``dims={"M": ..., "N": ..., "K": ...}`` prints M, N, K) and :func:`case_for` builds its case so.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from pytest_fusion.declare import sizes
from pytest_fusion.declare.spec import LAYOUTS, SUPPORTED_DTYPES, KernelSpec

if TYPE_CHECKING:
    from pytest_fusion.oracle.tensors import Case

MAX_REPRO_ELEMENTS = 2**30
"""Most input elements (all inputs together) a repro may ask for: 2 GiB in float16. Far above the
largest reference-kernel case (Llama-3-70B gate/up at M = 8192: x, gate and up weights, about
5.4e8 elements, from the shapes catalog), far below a mistyped 1e5 x 1e5 (1e10 elements, which
would allocate gigabytes on the CPU before failing)."""

FIELDS = ("dims", "seed", "layouts", "special", "amplitude", "exact", "dtype")
"""The fields of a payload (``tensors.Case.as_dict``); ``dtype`` is informative: the test's item
decides the dtype."""

SEED_RANGE = (0, 2**63 - 1)
"""Seeds ``torch.Generator.manual_seed`` takes (pytest-fusion draws 32-bit ones, ``strategies.seeds``)."""


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def parse(text: str) -> dict[str, Any]:
    """The payload of ``--fusion-repro``, type-checked.

    Raises:
        ValueError: not JSON, not an object, a missing ``dims`` or ``seed``, an unknown field, or a
            field of the wrong type (``dims``: {symbol: int >= 0}; ``seed``: int in
            :data:`SEED_RANGE`; ``layouts``: {input: layout name}; ``special``, ``exact``: bools;
            ``amplitude``: a finite number > 0; ``dtype``: a supported dtype name).
    """
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"need a JSON object, got {type(data).__name__}")
    missing = [k for k in ("dims", "seed") if k not in data]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}; a repro has dims and seed")
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}; a repro has {', '.join(FIELDS)}")
    dims = data["dims"]
    if not isinstance(dims, dict) or not all(_is_int(v) and v >= 0 for v in dims.values()):
        raise ValueError(f"dims must be an object {{symbol: int >= 0}}, got {dims!r}")
    seed = data["seed"]
    if not _is_int(seed) or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise ValueError(f"seed must be an int in [{SEED_RANGE[0]}, 2**63 - 1], got {seed!r}")
    layouts = data.get("layouts", {})
    if not isinstance(layouts, dict) or not all(isinstance(v, str) for v in layouts.values()):
        raise ValueError(f"layouts must be an object {{input: layout}}, got {layouts!r}")
    bad = sorted(v for v in layouts.values() if v not in LAYOUTS)
    if bad:
        raise ValueError(f"unknown layout(s) {bad}; choose from {', '.join(LAYOUTS)}")
    for name in ("special", "exact"):
        if not isinstance(data.get(name, False), bool):
            raise ValueError(f"{name} must be true or false, got {data[name]!r}")
    amplitude = data.get("amplitude", 1.0)
    if not isinstance(amplitude, (int, float)) or isinstance(amplitude, bool) or not 0 < amplitude < math.inf:
        raise ValueError(f"amplitude must be a finite number > 0, got {amplitude!r}")
    if "dtype" in data and data["dtype"] not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(SUPPORTED_DTYPES)}, got {data['dtype']!r}")
    return data


def _declared_first(values: Mapping[str, Any], declared: Sequence[str]) -> dict[str, Any]:
    """``values`` with the keys of ``declared`` first, in its order, then the others in theirs."""
    return {**{k: values[k] for k in declared if k in values}, **values}


def dumps(payload: Mapping[str, Any], spec: KernelSpec | None = None) -> str:
    """The JSON text of ``payload`` (a ``Case.as_dict``, or a :func:`parse`-d one) as a repro line
    prints it: its fields in the payload's order, its dims in the order ``spec.dims`` declares them
    and its layouts in the order of ``spec.inputs`` (without ``spec``, as given). :func:`parse`
    reads it back whatever order its keys are in."""
    out = dict(payload)
    if spec is not None:
        if isinstance(out.get("dims"), Mapping):
            out["dims"] = _declared_first(out["dims"], list(spec.dims))
        if isinstance(out.get("layouts"), Mapping):
            out["layouts"] = _declared_first(out["layouts"], list(spec.inputs))
    return json.dumps(out)


def input_elements(spec: KernelSpec, dims: Mapping[str, int]) -> int:
    """Elements of all of ``spec``'s inputs at ``dims`` (layouts' padding not counted)."""
    return sum(math.prod(sizes.size(s, dims) for s in t.shape) for t in spec.inputs.values())


def case_for(repro: Mapping[str, Any], spec: KernelSpec, dtype: str) -> Case:
    """The :class:`~pytest_fusion.oracle.tensors.Case` of a :func:`parse`-d payload for ``spec`` in ``dtype``.

    Raises:
        ValueError: a dims symbol missing or not declared, a dim outside its declared
            ``(low, high)`` range or not a multiple of its ``multiple_of``, a layout for an unknown
            input or one the input does not allow, or inputs above :data:`MAX_REPRO_ELEMENTS`
            elements.
    """
    from pytest_fusion.oracle.tensors import Case

    dims = _declared_first(repro["dims"], list(spec.dims))
    missing = sorted(set(spec.dims) - set(dims))
    extra = sorted(set(dims) - set(spec.dims))
    if missing or extra:
        raise ValueError(
            f"dims must give exactly the declared symbols {', '.join(spec.dims)}"
            + (f"; missing {', '.join(missing)}" if missing else "")
            + (f"; not declared {', '.join(extra)}" if extra else "")
        )
    outside = [
        f"{s}={v} (declared {spec.dims[s][0]}..{spec.dims[s][1]})"
        for s, v in dims.items()
        if not spec.dims[s][0] <= v <= spec.dims[s][1]
    ]
    if outside:
        raise ValueError(f"dims outside the declared ranges: {', '.join(outside)}")
    off = [f"{s}={v} (multiple_of {spec.multiple_for(s)})"
           for s, v in dims.items() if v % spec.multiple_for(s)]
    if off:
        raise ValueError(f"dims not multiples as declared: {', '.join(off)}")
    layouts = _declared_first(repro.get("layouts", {}), list(spec.inputs))
    for name, layout in layouts.items():
        if name not in spec.inputs:
            raise ValueError(f"layouts names {name!r}, which is not an input ({', '.join(spec.inputs)})")
        allowed = spec.inputs[name].layouts
        if allowed is not None and layout not in allowed:
            raise ValueError(
                f"layouts[{name!r}] = {layout!r}, which the input does not allow ({', '.join(allowed)})"
            )
    n = input_elements(spec, dims)
    if n > MAX_REPRO_ELEMENTS:
        raise ValueError(
            f"dims {dims} make {n:.3g} input elements, above the cap of {MAX_REPRO_ELEMENTS:.3g} "
            f"(pytest_fusion.property.repro.MAX_REPRO_ELEMENTS); not run"
        )
    return Case(
        dims=dims,
        dtype=dtype,
        layouts=layouts,
        seed=repro["seed"],
        special=bool(repro.get("special", False)),
        amplitude=float(repro.get("amplitude", 1.0)),
        exact=bool(repro.get("exact", False)),
    )
