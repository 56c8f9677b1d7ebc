"""``agcheck.gradcheck``: which checks run, in which order, on which pieces of ``fn``."""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Callable

from agcheck.engine import batched as engine
from agcheck.core import jacobian as jac
from agcheck.backends.registry import get_backend, infer_backend
from agcheck.checks import batched, grad_output_scaling, no_differentiable_outputs, undefined_grads
from agcheck.options import GradcheckOptions
from agcheck.progress import Progress
from agcheck.core.stencil import auto_eps, get_stencil
from agcheck.report import (FAST_FAIL_SLOW_OK, FAST_MODE_NOTE, GradcheckError, attach_jacobian_failure, complete_report,
                     jacobian_mismatch_message)
from agcheck.core.wirtinger import input_part, output_part, split_inputs

__all__ = ["gradcheck", "OutputTypeError", "CostWarning"]


def _non_finite_note(be, numerical, analytical) -> str:
    """Say so when NaN or Inf, not a wrong formula, makes the Jacobians differ."""
    notes = [name for name, j in (("numerical", numerical), ("analytical", analytical))
             if be.numel(j) and not be.all_finite(j)]
    if not notes:
        return ""
    hint = (
        "fn is not finite (or overflows) within eps of this input: move the input away from "
        "poles and domain edges, or reduce eps"
        if "numerical" in notes
        else "the backward produces NaN/Inf here"
    )
    return f"Note: the {' and '.join(notes)} Jacobian contains NaN or Inf ({hint}).\n"


#: a slow-mode failure report holds at most this many failing (output, input) blocks
MAX_REPORTED_BLOCKS = 16

#: slow-mode checks with at least this many Jacobian entries warn with their size
COSTLY_JACOBIAN_ENTRIES = 250_000_000


class CostWarning(UserWarning):
    """A check about to run is very large (a slow-mode check of a big function)."""


class OutputTypeError(TypeError, AttributeError):
    """``fn`` returned something that is not an array (or a tuple/list of arrays).

    Also an ``AttributeError``, the type torch raises in this case.
    """


def gradcheck(fn: Callable, inputs, *, backend=None,
              eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True, nondet_tol=0.0,
              check_undefined_grad=True, check_grad_dtypes=False, check_batched_grad=False,
              check_batched_forward_grad=False, check_forward_ad=False, check_backward_ad=True,
              fast_mode=False, masked=None, engine="auto", memory_budget=None, stencil="central",
              progress=False, **backend_options) -> bool:
    """Check analytical derivatives of ``fn`` against finite differences.

    Same keywords, defaults, verdicts and messages as ``torch.autograd.gradcheck``.

    Parameters
    ----------
    fn : callable
        Takes the members of ``inputs`` as positional arguments and returns an array or
        a tuple (or list) of arrays.
    inputs : array or tuple
        The arguments of ``fn``. Arrays that take part in the check are those the backend
        marks (torch: floating or complex tensors with ``requires_grad=True``); other
        members are passed through unchanged.
    backend : str or Backend, optional
        ``"torch"``, ... By default inferred from the arrays in ``inputs``.
    eps : float or "auto"
        Finite-difference step. ``"auto"`` (beyond torch) picks, per input, the step that
        balances truncation and rounding error for its precision and the stencil
        (``machine_eps ** (1/3)`` for central, ``** (1/5)`` for five-point differences).
    atol, rtol : float
        Tolerances: ``|analytical - numerical| <= atol + rtol * |numerical|``.
    raise_exception : bool
        Raise :class:`GradcheckError` on a failed check (else return ``False``).
    nondet_tol : float
        Tolerance for run-to-run differences of the backward (reentrancy).
    check_undefined_grad : bool
        Check that undefined output gradients (and input tangents) act as zeros.
    check_grad_dtypes : bool
        Check the dtypes of the computed gradients.
    check_batched_grad, check_batched_forward_grad : bool
        Check vmapped (batched) reverse / forward derivatives against unbatched ones.
    check_forward_ad, check_backward_ad : bool
        Check forward-mode / reverse-mode derivatives.
    fast_mode : bool
        Compare random projections ``v^T J u`` instead of full Jacobians.
    masked : bool or None
        For sparse inputs: compare only the specified elements.
    engine : {"auto", "batched", "reference"}
        Beyond torch. ``"batched"`` computes slow-mode Jacobians in batches (many
        evaluations per call, compared chunk by chunk) wherever that pays and hands any
        failure to the reference engine, so verdicts and messages are the reference's.
        ``"auto"`` (default) first tries compressed differences: where each output
        element depends on at most one element of each input (elementwise, broadcast,
        indexing), every entry from ``O(log n)`` evaluations; where the analytical
        Jacobian's pattern is banded or blocked, input elements that never meet are
        moved together. Both are verified over rounds of sign patterns, and anything
        else goes to the batched path (see docs/performance.md). ``"reference"`` runs
        torch's element-by-element algorithm only.
    memory_budget : int, optional
        Beyond torch. Bytes the batched engine may hold in Jacobians and batches
        (default 1 GiB); it recomputes rather than exceed it.
    stencil : {"central", "five-point"}
        Beyond torch. The finite-difference formula: torch's two-point central
        difference, or the fourth-order five-point stencil (more accurate for the same
        step; the recipe for float32 functions, see docs/accuracy.md).
    progress : bool
        Beyond torch. Show a progress bar (on stderr, when it is a terminal; needs
        ``rich``) while slow-mode Jacobians are computed. Quiet by default.
    **backend_options
        Keywords of the chosen backend (e.g. ``wrt=`` for JAX, ``vjp=``/``jvp=`` for
        NumPy); the torch backend takes none.

    Returns
    -------
    bool
        ``True`` when every check passed; ``False`` on a failure with
        ``raise_exception=False``.

    Raises
    ------
    GradcheckError
        A check failed (a ``RuntimeError``).
    AssertionError, ValueError, RuntimeError, TypeError
        Invalid keyword combinations or inputs, as torch raises them.
    """
    opts = GradcheckOptions(
        eps=eps, atol=atol, rtol=rtol, raise_exception=raise_exception, nondet_tol=nondet_tol,
        check_undefined_grad=check_undefined_grad, check_grad_dtypes=check_grad_dtypes,
        check_batched_grad=check_batched_grad, check_batched_forward_grad=check_batched_forward_grad,
        check_forward_ad=check_forward_ad, check_backward_ad=check_backward_ad,
        fast_mode=fast_mode, masked=masked, engine=engine, memory_budget=memory_budget,
        stencil=stencil, progress=progress,
    )
    return run_gradcheck(fn, inputs, opts, backend, **backend_options)


def resolve_problem(fn: Callable, inputs, backend, backend_options: dict):
    """The configured backend, and ``fn`` with its inputs as the core sees them."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if backend is not None:
        be = get_backend(backend, **backend_options)
    else:
        be = infer_backend(inputs, **backend_options)
    fn, args = be.prepare(fn, inputs)
    return be, fn, args


def run_gradcheck(fn: Callable, inputs, opts: GradcheckOptions, backend=None, **backend_options) -> bool:
    """:func:`gradcheck` with its keywords already gathered in ``opts``."""
    be, fn, args = resolve_problem(fn, inputs, backend, backend_options)
    be.check_supported(opts)
    try:
        with be.preserve_state(args), _numpy_rng_preserved():
            try:
                _Run(fn, args, be, opts).all_checks()
            except GradcheckError as e:
                if opts.raise_exception:  # reports are filled in only for a raised failure
                    complete_report(e, be, opts)
                raise
    except GradcheckError as e:
        if opts.raise_exception:
            be.adopt_error(e)  # torch: also torch.autograd.gradcheck.GradcheckError
            raise
        return False
    return True


@contextmanager
def _numpy_rng_preserved():
    import numpy as np

    state = np.random.get_state()
    try:
        yield
    finally:
        np.random.set_state(state)


class _Run:
    """One gradcheck: the function, its inputs, the backend and the options."""

    def __init__(self, fn, args, be, opts: GradcheckOptions):
        self.fn, self.args, self.be, self.opts = fn, args, be, opts
        #: what the batched engine did: (input position, how it was moved) entries, and
        #: the reasons it handed checks back to the reference engine
        self.engine_log: list[tuple] = []
        self.engine_fallbacks: list[str] = []
        self.stencil = get_stencil(opts.stencil)
        self.progress = Progress(enabled=opts.progress)

    def eps_for(self, x) -> float:
        """The finite-difference step for input ``x``."""
        if self.opts.eps == "auto":
            return auto_eps(self.be.machine_epsilon(x), self.stencil)
        return self.opts.eps

    def numerical_args(self, args) -> tuple:
        """The arguments the numerical side moves: unless ``masked``, every sparse argument
        is replaced by its dense equivalent (all elements specified), as torch does, so
        that finite differences reach the unspecified elements too. Dense arrays pass
        through unchanged."""
        if self.opts.masked:
            return args
        be = self.be
        return tuple(be.densify(a) if be.is_array(a) else a for a in args)

    # -- the order of the checks is torch's ---------------------------------------------
    def all_checks(self) -> None:
        try:
            self._all_checks()
        finally:
            self.progress.close()

    def _all_checks(self) -> None:
        be, opts = self.be, self.opts
        self.checked = self._validate_inputs()
        before = [be.snapshot(self.args[p]) for p in self.checked]
        trace = be.trace(self.fn, self.args, self.checked)
        self._assert_inputs_untouched(before)
        diff = self._differentiable(trace.outputs)
        be.validate_outputs([trace.outputs[k] for k in diff])
        if not opts.fast_mode:
            self._warn_if_costly(trace.outputs)

        if opts.check_backward_ad:
            self._reverse_mode(trace, diff)
        if opts.check_forward_ad:
            self._forward_mode(trace)
        if opts.check_batched_forward_grad:
            batched.check_forward(be, self.fn, self.args, self.checked)
        if not opts.check_backward_ad:
            return
        inputs = [self.args[p] for p in self.checked]
        if opts.check_batched_grad:
            for i, k in enumerate(diff):
                batched.check_backward(be, trace, k, i, inputs)
        grad_output_scaling.check(be, trace, diff, inputs, opts.masked)
        if opts.check_undefined_grad:
            undefined_grads.check_backward(be, self.fn, self.args, self.checked, len(diff))

    def _assert_inputs_untouched(self, before) -> None:
        be = self.be
        for p, snap in zip(self.checked, before):
            if not be.unchanged(self.args[p], snap):
                be.restore(self.args[p], snap)
                raise ValueError(
                    f"fn modified input {p} in place. A gradient check moves each input and "
                    "compares results, so fn must leave its inputs unchanged: work on a copy "
                    "(e.g. x = x.clone()) inside fn. The input has been restored."
                )

    def _warn_if_costly(self, outputs) -> None:
        be = self.be
        n_in = sum(be.numel(self.args[p]) for p in self.checked)
        n_out = sum(be.numel(o) for o in outputs if be.is_floating_or_complex(o))
        entries = n_in * n_out
        if entries >= COSTLY_JACOBIAN_ENTRIES:
            warnings.warn(
                f"slow mode compares full Jacobians: {n_in:,} input elements x {n_out:,} output "
                f"elements = {entries:.2e} entries, each estimated by finite differences. This may "
                "take very long; fast_mode=True compares random projections v^T J u instead, at "
                "the cost of a few evaluations and backward passes.",
                CostWarning,
                stacklevel=5,
            )

    def _validate_inputs(self) -> list:
        be = self.be
        checked = be.checked_positions(self.args)
        devices = {}
        for idx in checked:
            devices.setdefault(be.device_name(self.args[idx]), idx)
        if len(devices) > 1:
            listed = ", ".join(f"input {i} on {d}" for d, i in devices.items())
            raise ValueError(
                f"the inputs to differentiate are on different devices ({listed}); "
                "move them to one device before checking"
            )
        for idx in checked:
            x = self.args[idx]
            if not be.is_double_precision(x):
                warnings.warn(
                    f"Input #{idx} requires gradient and is not a double precision floating point "
                    "or complex. Finite differences in lower precision are rarely accurate enough "
                    "for the default tolerances; this check will likely fail.",
                    stacklevel=5,
                )
            be.validate_input(idx, x)
        if not checked:
            raise ValueError(be.no_checked_inputs_message)
        return checked

    def _differentiable(self, outputs) -> list:
        be = self.be
        for k, o in enumerate(outputs):
            if not be.is_array(o):
                raise OutputTypeError(
                    f"fn must return an array or a tuple of arrays, but output {k} is "
                    f"{type(o).__name__}: {o!r:.80}"
                )
        return [k for k, o in enumerate(outputs) if be.is_differentiable_output(o)]

    # -- reverse and forward mode, with the complex split -------------------------------
    def _reverse_mode(self, trace, diff) -> None:
        be = self.be
        outputs = trace.outputs
        complex_outputs = [i for i, k in enumerate(diff) if be.is_complex(outputs[k])]
        if not any(be.is_complex(o) for o in outputs):
            self._compare(self.fn, trace, self.args, self.checked, None, False, forward=False)
            return
        for part in ("imag", "real"):
            piece = output_part(be, self.fn, part)
            piece_trace = be.trace(piece, self.args, self.checked)
            self._compare(piece, piece_trace, self.args, self.checked, complex_outputs,
                          part == "imag", forward=False)

    def _forward_mode(self, trace) -> None:
        be = self.be
        complex_inputs = [k for k, a in enumerate(self.args) if be.is_array(a) and be.is_complex(a)]
        if not complex_inputs:
            self._compare(self.fn, trace, self.args, self.checked, None, False, forward=True)
            if self.opts.check_undefined_grad:
                undefined_grads.check_forward(be, self.fn, self.args, self.checked)
            return
        pieces = []
        for part in ("imag", "real"):
            piece = input_part(be, self.fn, complex_inputs, self.args, part)
            piece_args = split_inputs(be, self.args, complex_inputs, part)
            checked = self.checked
            trace = be.trace(piece, piece_args, checked)
            self._compare(piece, trace, piece_args, checked, complex_inputs, part == "imag", forward=True)
            pieces.append((piece, piece_args, checked))
        if self.opts.check_undefined_grad:
            for piece, piece_args, checked in pieces:
                undefined_grads.check_forward(be, piece, piece_args, checked)

    def _compare(self, fn, trace, args, checked, complex_indices, test_imag, *, forward) -> None:
        if self.opts.fast_mode:
            self._compare_fast(fn, trace, args, checked, complex_indices, test_imag, forward)
        else:
            self._compare_slow(fn, trace, args, checked, complex_indices, test_imag, forward)

    # -- slow mode: full Jacobians ------------------------------------------------------
    def _compare_slow(self, fn, trace, args, checked, complex_indices, test_imag, forward) -> None:
        be, opts = self.be, self.opts
        outputs = trace.outputs
        diff = [k for k, o in enumerate(outputs) if be.is_differentiable_output(o)]
        if not diff:
            no_differentiable_outputs.check_slow(be, fn, args, checked, outputs, self.eps_for, self.stencil)
            return
        self.progress.start(sum(be.numel(args[p]) for p in checked),
                            f"{'forward' if forward else 'reverse'}-mode Jacobians")
        if opts.engine in ("auto", "batched"):
            batched = engine.compare_slow_forward if forward else engine.compare_slow_reverse
            try:
                batched(self, fn, trace, args, checked, diff)
                return
            except Exception as reason:  # the reference engine decides, and explains
                if engine.raised_by_fn(reason):
                    raise
                self.engine_fallbacks.append(f"{type(reason).__name__}: {reason}")
            self.progress.start(sum(be.numel(args[p]) for p in checked), "Jacobians, element by element")
        moved = self.numerical_args(args)
        numerical = [jac.numerical_jacobians(be, fn, moved, p, outputs, self.eps_for(args[p]), self.stencil,
                                             on_element=self.progress.advance)
                     for p in checked]
        inputs = [args[p] for p in checked]
        if forward:
            analytical = jac.analytical_jacobians_forward(
                be, fn, args, checked, check_grad_dtypes=opts.check_grad_dtypes
            )

            def pair(i, j):  # torch pairs the i-th differentiable output with the i-th floating one
                return analytical[j][i]
        else:
            computed = {}

            def pair(i, j):
                if i not in computed:  # a later output's Jacobians only for the report
                    computed[i] = jac.analytical_jacobians_reverse(be, trace, diff[i], inputs, checks=False)
                return computed[i][j]

        for i, k in enumerate(diff):
            if not forward:
                computed[i] = jac.analytical_jacobians_reverse(
                    be, trace, k, inputs, nondet_tol=opts.nondet_tol, check_grad_dtypes=opts.check_grad_dtypes
                )
            for j in range(len(checked)):
                try:
                    self._assert_close(pair(i, j), numerical[j][k], i, j, complex_indices, test_imag, forward,
                                       opts.atol, where=(fn, args, checked[j], outputs, k))
                except GradcheckError as error:
                    self._report_other_blocks(error, pair, numerical, diff, checked, (i, j), complex_indices,
                                              test_imag, forward, where=(fn, args, outputs))
                    raise

    def _report_other_blocks(self, error, pair, numerical, diff, checked, failed, complex_indices, test_imag,
                             forward, where) -> None:
        """Add every other failing (output, input) block of a slow-mode comparison to the
        report of the first one (whose message is torch's). Never raises."""
        be, opts = self.be, self.opts
        fn, args, outputs = where
        try:
            for i, k in enumerate(diff):
                for j in range(len(checked)):
                    if (i, j) == failed:
                        continue
                    if len(error.report.blocks) >= MAX_REPORTED_BLOCKS:
                        error.report.notes.append(f"only the first {MAX_REPORTED_BLOCKS} failing blocks are reported")
                        return
                    a = pair(i, j)
                    n = be.to_device_of(numerical[j][k], a)
                    if be.allclose(a, n, opts.rtol, opts.atol):
                        continue
                    attach_jacobian_failure(error, self, a, n, output=i, input=j, complex_indices=complex_indices,
                                            test_imag=test_imag, forward=forward,
                                            where=(fn, args, checked[j], outputs, k))
        except Exception as ex:  # noqa: BLE001 - the first failure is what is raised
            error.report.notes.append(f"other blocks not compared: {type(ex).__name__}: {ex}")

    def _assert_close(self, a, n, out_idx, in_idx, complex_indices, test_imag, forward, atol,
                      explain: Callable | None = None, where=None) -> None:
        be = self.be
        n = be.to_device_of(n, a)
        if be.allclose(a, n, self.opts.rtol, atol):
            return
        message = jacobian_mismatch_message(a, n, out_idx, in_idx, complex_indices, test_imag, forward)
        message += _non_finite_note(be, n, a)
        blocks, projection = (a, n), None
        if explain is not None:
            message += explain()
            blocks, projection = self.explained_blocks, {"numerical": n, "analytical": a, "atol": atol}
        error = GradcheckError(
            message,
            check="jacobian_forward" if forward else "jacobian",
            details={"output": out_idx, "input": in_idx, "imaginary_part": bool(test_imag)},
        )
        attach_jacobian_failure(error, self, *blocks, output=out_idx, input=in_idx, complex_indices=complex_indices,
                                test_imag=test_imag, forward=forward, where=where, projection=projection)
        raise error

    # -- fast mode: random projections --------------------------------------------------
    def _compare_fast(self, fn, trace, args, checked, complex_indices, test_imag, forward) -> None:
        be, opts = self.be, self.opts
        outputs = trace.outputs
        diff = [k for k, o in enumerate(outputs) if be.is_differentiable_output(o)]
        floats = [k for k, o in enumerate(outputs) if be.is_floating_or_complex(o)]
        inputs = [args[p] for p in checked]
        all_v, all_u = jac.random_vectors(be, inputs, None if forward else [outputs[k] for k in diff])

        numerical = []
        moved = self.numerical_args(args)
        for p, u in zip(checked, all_u):
            jus = jac.numerical_directional(be, fn, moved, p, u, self.eps_for(args[p]), self.stencil)
            float_jus = [jus[k] for k in floats]
            if forward:
                numerical.append(float_jus)
            else:
                # torch pairs the probes of the differentiable outputs with the floating
                # outputs in order; kept for parity
                numerical.append([be.dot(v, ju) for v, ju in zip(all_v, float_jus)])

        if forward:
            analytical = jac.analytical_jvps(be, fn, args, checked, all_u, check_grad_dtypes=opts.check_grad_dtypes)
        else:
            if not diff:
                no_differentiable_outputs.check_fast(be, fn, args, checked, all_u, self.eps_for, self.stencil,
                                                     opts.nondet_tol)
            analytical = []
            for k, v in zip(diff, all_v):
                vjs = jac.analytical_vjps(be, trace, k, v, inputs, nondet_tol=opts.nondet_tol,
                                          check_grad_dtypes=opts.check_grad_dtypes)
                analytical.append([jac.project_reverse(be, vj, u) for vj, u in zip(vjs, all_u)])

        for i, per_input in enumerate(numerical):
            for j, n in enumerate(per_input):
                a = analytical[i][j] if forward else analytical[j][i]
                atol = jac.adjusted_atol(be, opts.atol, all_u[i], None if forward else all_v[j])
                output_position = floats[j] if forward else diff[j]

                def explain(i=i, output_position=output_position):
                    return self._slow_explanation(fn, trace, args, checked, i, output_position, forward)

                self._assert_close(a, n, j, i, complex_indices, test_imag, forward, atol, explain,
                                   where=(fn, args, checked[i], outputs, output_position))

    def _slow_explanation(self, fn, trace, args, checked, input_index, output_position, forward) -> str:
        """The full Jacobians of one failing pair, recomputed for the fast-mode message."""
        be, opts = self.be, self.opts
        pos = checked[input_index]
        numerical = jac.numerical_jacobians(be, fn, args, pos, trace.outputs, self.eps_for(args[pos]),
                                            self.stencil)[output_position]
        if forward:
            floats = [k for k, o in enumerate(trace.outputs) if be.is_floating_or_complex(o)]
            analytical = jac.analytical_jacobians_forward(be, fn, args, [pos])[0][floats.index(output_position)]
        else:
            inputs = [args[p] for p in checked]
            analytical = jac.analytical_jacobians_reverse(be, trace, output_position, inputs, checks=False)[input_index]
        numerical = be.to_device_of(numerical, analytical)
        self.explained_blocks = (analytical, numerical)  # for the failure report
        max_diff = be.max_abs(numerical - analytical) if be.numel(analytical) else 0.0
        text = (
            FAST_MODE_NOTE
            + f"Numerical:\n {numerical}\nAnalytical:\n{analytical}\n\n"
            + f"The max per-element difference (slow mode) is: {max_diff}.\n"
        )
        if be.allclose(analytical, numerical, opts.rtol, opts.atol):
            text += FAST_FAIL_SLOW_OK
        return text
