"""Filling in a failure report from a failed check: the failing Jacobian blocks
(:func:`attach_jacobian_failure`), then backend, options and diagnoses, and the summary
appended to the exception message (:func:`complete_report`).

The only part of :mod:`agcheck.report` that knows the checks' machinery: it converts the
backend's arrays to NumPy and builds, for each block, the ``resample`` callable through
which diagnosis recomputes numerical rows with other steps (by
:func:`agcheck.core.jacobian.numerical_rows_at`, the check's own finite differences).
Nothing here runs on the passing path.
"""
from __future__ import annotations

import weakref

import numpy as np

from agcheck.core.jacobian import numerical_rows_at, outputs_at_input
from agcheck.core.stencil import Stencil
from agcheck.report.diagnosis import diagnose
from agcheck.report.errors import GradcheckError, complex_part
from agcheck.report.model import JacobianBlock
from agcheck.report.values import FLOAT32_SAMPLE, float32_valued

__all__ = ["attach_jacobian_failure", "complete_report"]

#: the one-sided differences diagnosis asks for (``side="right"`` / ``"left"``)
ONE_SIDED = {
    "right": Stencil("right", (0, 1), (-1.0, 1.0), 0.5),
    "left": Stencil("left", (-1, 0), (-1.0, 1.0), 0.5),
}

#: report -> {block index: resample}, from attach_jacobian_failure until complete_report
#: (they hold ``fn`` and its inputs, released once the report is complete)
_resamplers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
#: report -> {(fn, args, position) identities: fn's outputs at the points evaluated}: the
#: blocks of one input (other outputs, the two parts of a complex one) share their points
_evaluated: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
#: points are shared only where fn's outputs hold at most this many elements in all: a
#: diagnosis evaluates at most 2 blocks x 4 rows x 12 moves + 1 points (about 50 MB here)
SHARED_OUTPUT_ELEMENTS = 32768


def attach_jacobian_failure(error: GradcheckError, run, analytical, numerical, *, output: int, input: int,
                            complex_indices, test_imag: bool, forward: bool, where=None, projection=None) -> None:
    """Record the failing block of a Jacobian comparison in ``error.report``.

    ``run`` is the gradcheck run (backend, options, stencil); ``where`` is
    ``(fn, args, position, outputs, output_position)`` for recomputing numerical entries
    with other steps during diagnosis. Never raises: a problem becomes a note.
    """
    rep = error.report
    try:
        be, opts = run.be, run.opts
        kw = dict(mode="forward" if forward else "reverse", fast=projection is not None,
                  part=complex_part(output, input, complex_indices, test_imag, forward),
                  atol=float(opts.atol), rtol=float(opts.rtol))
        if where is not None:
            fn, args, position, outputs, output_position = where
            x, out = args[position], outputs[output_position]
            double = bool(be.is_double_precision(x))
            kw.update(input_shape=tuple(int(s) for s in x.shape), output_shape=tuple(int(s) for s in out.shape),
                      input_dtype=be.dtype_name(x), input_double=double,
                      output_float32_valued=double and _float32_valued(be, out), output_scale=_largest(be, out),
                      eps=float(run.eps_for(x)))
            shared = None
            if sum(be.numel(o) for o in outputs if be.is_array(o)) <= SHARED_OUTPUT_ELEMENTS:
                key = (id(fn), position, tuple(id(a) for a in args))
                shared = _evaluated.setdefault(rep, {}).setdefault(key, {})
            resample = _resampler(run, fn, args, position, output_position, shared, out)
        if projection is not None:
            kw["projection"] = {k: _to_scalar(be, v) for k, v in projection.items()}
        block = JacobianBlock.from_arrays(be.to_numpy(numerical), be.to_numpy(analytical),
                                          output=output, input=input, **kw)
        if where is not None:
            _resamplers.setdefault(rep, {})[len(rep.blocks)] = resample
        rep.blocks.append(block)
    except Exception as ex:  # the report must never hide the failure itself
        rep.notes.append(f"could not record the Jacobian blocks: {type(ex).__name__}: {ex}")


def _float32_valued(be, out):
    """Whether a backend array is in less than double precision (bfloat16 included, which
    NumPy cannot hold), or :func:`~agcheck.report.values.float32_valued` on its first
    elements (``None`` where they cannot be read: a sparse output, say)."""
    try:
        if not be.is_double_precision(out):
            return True
        return float32_valued(be.to_numpy(be.flatten(out)[:FLOAT32_SAMPLE]))
    except Exception:  # noqa: BLE001 - a hint for the diagnosis, never a reason to lose the block
        return None


def _largest(be, out):
    """The largest |entry| of a backend array, or ``None`` where it cannot be read."""
    try:
        a = np.abs(np.asarray(be.to_numpy(out)))
        return float(a.max()) if a.size else None
    except Exception:  # noqa: BLE001 - a hint for the diagnosis, never a reason to lose the block
        return None


def _to_scalar(be, v):
    if isinstance(v, (int, float, complex)):
        return v
    a = np.asarray(be.to_numpy(v))
    return a.item() if a.size == 1 else a


def _resampler(run, fn, args, position, output_position, shared=None, checked=None):
    """Rows of the block's numerical Jacobian for each ``(eps, side)`` asked for, with the
    check's stencil (``side="central"``) or a one-sided difference, each as
    ``(len(rows), output.numel)``; the points they share are evaluated once, and those
    in ``shared`` (kept for the other blocks of the input) not again.

    Its ``values()`` gives the block's output at the unmoved input as the check computed
    it (``checked``, converted only when asked), and ``unmoved()`` that output twice, as
    NumPy arrays: as the check computed it and from a call of ``fn`` now (the probes' own
    call at that point where ``shared`` kept it); where there is ``shared``,
    ``evaluated_rows()`` gives the input elements whose moved points it holds."""
    def resample(steps, rows):
        found = numerical_rows_at(run.be, fn, args, position, output_position, rows,
                                  [(eps, run.stencil if side == "central" else ONE_SIDED[side]) for eps, side in steps],
                                  evaluated=shared)
        return [np.stack([np.asarray(run.be.to_numpy(row)).reshape(-1) for row in step]) for step in found]

    def unmoved():
        again = outputs_at_input(run.be, fn, args, position, evaluated=shared)[output_position]
        return np.asarray(run.be.to_numpy(checked)), np.asarray(run.be.to_numpy(again))

    def values():
        return np.asarray(run.be.to_numpy(checked))

    def input_values():
        return np.asarray(run.be.to_numpy(args[position])).reshape(-1)

    resample.unmoved = unmoved
    resample.values = values
    resample.input_values = input_values
    if shared is not None:
        resample.evaluated_rows = lambda: {element for element, _ in shared if element is not None}
    return resample


def complete_report(error: GradcheckError, backend=None, options=None) -> None:
    """Fill in backend, options and diagnoses, and append the summary to the message.

    Called once, after a failure, while the caller's state is still guarded (diagnosis
    may evaluate ``fn`` a few more times). Never raises.
    """
    rep = getattr(error, "report", None)
    if rep is None or rep.completed:
        return
    try:
        rep.backend = getattr(backend, "name", backend)
        if options is not None:
            rep.options = options.as_dict() if hasattr(options, "as_dict") else dict(options)
        try:
            rep.diagnoses = diagnose(rep, _resamplers.get(rep))
        except Exception as ex:
            rep.notes.append(f"diagnosis failed: {type(ex).__name__}: {ex}")
        rep.completed = True
        summary = rep.summary()
        if error.args and isinstance(error.args[0], str):
            error.args = (error.args[0].rstrip("\n") + "\n\n" + summary,) + tuple(error.args[1:])
    except Exception as ex:
        rep.notes.append(f"report incomplete: {type(ex).__name__}: {ex}")
    finally:
        _resamplers.pop(rep, None)  # release fn and its inputs
        _evaluated.pop(rep, None)
