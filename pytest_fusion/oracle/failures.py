"""The oracle's failure kinds, and how their messages read.

Every failure is a :class:`FusionFailure` (an ``AssertionError``, so pytest reports it as a test
failure) whose subclass names the way the kernel failed and whose message starts
``[pytest-fusion] <kind>: <headline>``, followed by the case (its fields, repro, autotune config)
and the details (:class:`FailureMessages`).
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import Any, Sequence, TypeVar

from pytest_fusion.machine.devices import interpreter_active


class FusionFailure(AssertionError):
    """A fused-kernel check failed. ``kind`` says which way; the message has every detail.

    Attributes:
        case: the drawn case that failed (a :class:`pytest_fusion.oracle.tensors.Case`), or None
            where the inputs were given (``check_inputs``, ``fusion.check``).
        repro: the command line that replays it (``python3 -m pytest <node id> --fusion-repro=...``;
            for ``fusion.check``, ``python3 -m pytest <node id>``), or None where there is none
            (plain API without a ``repro``).
    """

    kind = "failure"
    case: Any = None
    repro: str | None = None


class KernelMismatch(FusionFailure):
    """The kernel's values are outside the error budget, or NaN/inf are misplaced."""

    kind = "mismatch"


class EagerMismatch(FusionFailure):
    """The spec asks for eager parity (``eager_parity=True``) and the kernel's output differs
    bitwise from eager's in the test dtype (:mod:`pytest_fusion.oracle.parity`)."""

    kind = "eager parity"


class GradientMismatch(FusionFailure):
    """The spec asks for backward checks (``backward=True``) and the kernel's gradient of an input
    is outside the error budget against golden's, has misplaced NaN/inf, or is missing or of the
    wrong shape or dtype (:mod:`pytest_fusion.oracle.backward`); the message names the input."""

    kind = "gradient mismatch"


class KernelCrash(FusionFailure):
    """The kernel raised instead of returning."""

    kind = "crash"


class BadOutput(FusionFailure):
    """The kernel returned the wrong number of outputs, or the wrong shape or dtype."""

    kind = "bad output"


class InputMutated(FusionFailure):
    """The kernel wrote into one of its inputs."""

    kind = "input mutated"


class SavedTensorMutated(FusionFailure):
    """A backward wrote into the forward's output or into a tensor the forward saved for it (the
    latter allowed by the spec's ``retain_graph=False``)."""

    kind = "saved tensor mutated"


class Nondeterministic(FusionFailure):
    """Two runs on the same inputs differ bitwise, and the spec asks for determinism."""

    kind = "nondeterministic"


class OutOfBoundsWrite(FusionFailure):
    """The kernel wrote outside a tensor: into a guard band or a layout gap of an input, or into
    the guard band after a tensor it allocated."""

    kind = "out-of-bounds write"


class OutputAliased(FusionFailure):
    """An output of the second call shares memory with an output of the first: a buffer reused
    across calls, so the second call overwrote the first result."""

    kind = "aliased output"


class NondeterministicFailure(FusionFailure):
    """A case failed, and the same case run again passed: the failure depends on something
    outside the case (timing, state left by earlier calls, uninitialised memory)."""

    kind = "nondeterministic failure"


class ReferenceFailed(FusionFailure):
    """The reference itself raised: the test, not the kernel, is broken."""

    kind = "reference raised"


class NondeterminismWarning(UserWarning):
    """Two runs of the kernel on the same inputs differ bitwise."""


class OutputViewWarning(UserWarning):
    """An output is a view into a larger buffer the kernel allocated (the marker's
    ``output_views=True`` declares that intended)."""


Failure = TypeVar("Failure", bound=FusionFailure)


@dataclasses.dataclass(frozen=True)
class FailureMessages:
    """Builds one case's failures: ``[pytest-fusion] <kind>: <headline>``, then the case's
    ``footer`` (its fields, repro, autotune config), then the detail; empty parts are left out."""

    footer: str = ""
    case: Any = None
    repro: str | None = None

    def __call__(self, cls: type[Failure], headline: str, detail: str = "") -> Failure:
        """A ``cls`` carrying the message, and :attr:`FusionFailure.case` and ``repro``, to raise."""
        text = f"[pytest-fusion] {cls.kind}: {headline}"
        failure = cls("\n".join(part for part in (text, self.footer, detail) if part))
        failure.case, failure.repro = self.case, self.repro
        return failure


def tensor_layout(
    name: str, layout: str, shape: Sequence[int], strides: Sequence[int], offset: int
) -> str:
    """How one input lies in memory, as a failure names it:
    ``x: transposed (shape 3x5, strides (1, 3), offset 0)``.

    Args:
        name: the input's name (a marker's ``inputs`` key, or ``input<i>`` for given tensors).
        layout: its layout's name (``spec.LAYOUTS``, or ``strided`` for a given tensor none fits).
        shape: its sizes (``()`` for a 0-d tensor).
        strides: its strides, in elements, as ``Tensor.stride()`` gives them.
        offset: its storage offset in elements (for a drawn input, from the start of its buffer,
            the guard band before it left out: ``oracle.tensors.layout_geometry``).
    """
    dims = "x".join(str(d) for d in shape) if len(shape) else "()"
    return f"{name}: {layout} (shape {dims}, strides {tuple(strides)}, offset {offset})"


def layouts_field(described: Sequence[str]) -> str:
    """The ``layouts`` field of a failure's case: one input a line (:func:`tensor_layout`), each
    under the first."""
    return "  layouts  " + ("\n           ".join(described) if described else "(no tensor inputs)")


_PACKAGE_DIR = __file__.rsplit("/", 1)[0]


def user_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` without pytest-fusion's own frames: what the user's code did."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_PACKAGE_DIR)]
    lines = traceback.format_list(frames) + traceback.format_exception_only(type(exc), exc)
    return "  traceback (pytest-fusion frames omitted):\n" + "".join(lines).rstrip()


def interpreter_hint(exc: BaseException) -> str:
    """A hint for a crash that comes from the Triton interpreter itself, not from the kernel: the
    interpreter of Triton 3.6 converts a loop bound to int in a way numpy >= 2.4 refuses
    (triton-lang/triton#9171, fixed in later Triton releases)."""
    if "only 0-dimensional arrays can be converted to Python scalars" in str(exc) and interpreter_active():
        return (
            "\n  hint: this Triton's interpreter does not work with numpy >= 2.4 (triton-lang/triton#9171);"
            " install numpy<2.4 or a newer Triton to run this kernel interpreted"
        )
    return ""
