"""Undefined output gradients (or tangents) must act as zeros."""
from __future__ import annotations

from agcheck.core.jacobian import random_vectors
from agcheck.errors import GradcheckError
from agcheck.report.messages import UNDEFINED_GRAD_HINT
from agcheck.warn import warn_caller

#: torch's warning, word for word: suites assert on it (e.g. with assertWarnsRegex)
_OPT_OUT = (
    "Backwards compatibility: New undefined gradient support checking "
    "feature is enabled by default, but it may break existing callers "
    "of this function. If this is true for you, you can call this "
    'function with "check_undefined_grad=False" to disable the feature'
)


def check_backward(run, piece) -> None:
    """Back-propagate with all output gradients undefined, then (several outputs) one at a time:
    the backward must give zeros. ``engine="reference"`` evaluates ``fn`` afresh per case, as torch does."""
    be, args, checked, n_outputs = run.be, piece.args, piece.checked, len(piece.diff)
    cases = ["all"]
    if n_outputs > 1:
        cases += [{k} for k in range(n_outputs)]
    for undefined in cases:
        trace = piece.trace
        if run.opts.engine == "reference":
            trace = be.trace(piece.fn, args, checked)  # fn's own errors propagate from here
        try:
            grads = be.vjp_with_undefined_outputs(piece.fn, args, checked, undefined, trace=trace)
        except RuntimeError as e:
            warn_caller(_OPT_OUT)
            raise GradcheckError(
                "Expected backward function to handle undefined output grads. " + UNDEFINED_GRAD_HINT,
                check="undefined_grad",
            ) from e
        for g in grads:
            # on the gradient as it came: torch tests a sparse one undensified, and raises for it
            if g is not None and not bool(be.xp(g).all(g == 0)):
                warn_caller(_OPT_OUT)
                raise GradcheckError(
                    "Expected all input grads to be undefined or zero when all output grads "
                    "are undefined or zero. " + UNDEFINED_GRAD_HINT,
                    check="undefined_grad",
                    details={"undefined_outputs": undefined if undefined == "all" else sorted(undefined),
                             "max_abs_gradient": _max_abs(be, be.to_dense(g))},
                )


def check_forward(run, piece) -> None:
    """An undefined input tangent must give the same output tangents as a zero one."""
    be, fn, args, checked = run.be, piece.fn, piece.args, piece.checked
    inputs = [args[p] for p in checked]
    _, all_u = random_vectors(be, inputs, None)
    tangents = []
    for x, u in zip(inputs, all_u):
        xp = be.xp(u)
        t = xp.reshape(u, tuple(x.shape))
        tangents.append(t if t.dtype == x.dtype else xp.astype(t, x.dtype))
    for i, x in enumerate(inputs):
        with_zero = list(tangents)
        with_zero[i] = be.xp(x).zeros_like(x)
        without = list(tangents)
        without[i] = None
        zero_results = be.jvp(fn, args, checked, with_zero)
        none_results = be.jvp(fn, args, checked, without)
        for k, ((_, t1), (_, t2)) in enumerate(zip(zero_results, none_results)):
            if t1 is None or t2 is None:
                continue
            if not be.allclose(t1, t2, rtol=1e-5, atol=1e-8):
                raise GradcheckError(
                    f"Mismatch in tangent values for output with index: {k} when input {checked[i]} "
                    f"has an undefined tangent value. Got: {t1} but expected: {t2}",
                    check="undefined_tangent",
                )


def _max_abs(be, x) -> float:
    xp = be.xp(x)
    return float(xp.max(xp.abs(x)))
