"""``agcheck.gradgradcheck``: check second (and higher) derivatives.

The backend builds "the VJP of ``fn``" as a differentiable function of the inputs and the
output cotangents; that function is then checked by the ordinary gradcheck machinery.
"""
from __future__ import annotations

import time
from dataclasses import fields
from typing import Any, Callable, Literal

from agcheck.backends.base import Backend
from agcheck.core.numpy_rng import numpy_rng_preserved
from agcheck.core.problem import check_output_types, resolve_problem
from agcheck.errors import GradOutputsError, OutputTypeError
from agcheck.gradcheck import (GRADCHECK_KEYWORDS, all_checks, checking, prepared_run, refuse_misspelt,
                               takes_torchs_func)
from agcheck.options import GradcheckOptions, GradgradcheckOptions

__all__ = ["gradgradcheck"]

#: gradgradcheck's own keywords, for naming a misspelt one
GRADGRADCHECK_KEYWORDS = (*GRADCHECK_KEYWORDS, "grad_outputs", "order",
                          *(f.name for f in fields(GradgradcheckOptions)))

#: seed of the private generator that draws random grad_outputs
GRAD_OUTPUTS_SEED = 11235


@takes_torchs_func
def gradgradcheck(fn: Callable[..., Any], inputs: Any, grad_outputs: Any = None, *,
                  backend: str | Backend | None = None, eps: float | Literal["auto"] = 1e-6, atol: float = 1e-5,
                  rtol: float = 1e-3, gen_non_contig_grad_outputs: bool = False, raise_exception: bool = True,
                  nondet_tol: float = 0.0, check_undefined_grad: bool = True, check_grad_dtypes: bool = False,
                  check_batched_grad: bool = False, check_fwd_over_rev: bool = False,
                  check_rev_over_rev: bool = True, fast_mode: bool = False, masked: bool = False, order: int = 2,
                  engine: Literal["auto", "batched", "reference"] = "auto", memory_budget: int | None = None,
                  stencil: Literal["central", "five-point"] = "central", progress: bool = False,
                  fast_tolerance: Literal["torch", "probe"] = "torch", **backend_options: Any) -> bool:
    """Check second derivatives of ``fn`` (gradients of its VJP) by finite differences.

    Same keywords, defaults, verdicts and messages as
    ``torch.autograd.gradgradcheck``, plus ``order`` for higher derivatives.

    Parameters
    ----------
    fn, inputs, backend, eps, atol, rtol, raise_exception, nondet_tol, check_undefined_grad
        As in :func:`agcheck.gradcheck`.
    check_grad_dtypes, check_batched_grad, fast_mode, masked
        As in :func:`agcheck.gradcheck` (``masked`` defaults to ``False`` here, as in torch).
    grad_outputs : array or tuple, optional
        The cotangents of ``fn``'s differentiable outputs; those that take part in the check
        (torch: ``requires_grad=True``) are differentiated with respect to as well. By
        default random values in [-1, 1), requiring grad, from a private generator (the
        global RNG is untouched).
    gen_non_contig_grad_outputs : bool
        Make the random ``grad_outputs`` non-contiguous.
    check_fwd_over_rev, check_rev_over_rev : bool
        Check the derivatives of the VJP in forward mode / reverse mode.
    order : int
        The order of the derivative checked: 2 (the default) checks the derivatives of
        the VJP of ``fn``; ``order=N`` applies the construction ``N - 1`` times, with
        random cotangents at every level (``grad_outputs`` give the first level's).
        ``order=1`` is :func:`agcheck.gradcheck`.
    engine, memory_budget, stencil, progress, fast_tolerance
        Beyond torch, as in :func:`agcheck.gradcheck`; they apply to the check of the VJP.
    **backend_options
        Keywords of the chosen backend, as in :func:`agcheck.gradcheck`. ``fn`` may also
        be given as ``func=``, torch's name for it.

    Returns
    -------
    bool
        ``True`` when every check passed, ``False`` on a failure with
        ``raise_exception=False``.
    """
    refuse_misspelt("gradgradcheck", backend_options, GRADGRADCHECK_KEYWORDS)
    GradgradcheckOptions(
        gen_non_contig_grad_outputs=gen_non_contig_grad_outputs, check_fwd_over_rev=check_fwd_over_rev,
        check_rev_over_rev=check_rev_over_rev, check_undefined_grad=check_undefined_grad,
        check_batched_grad=check_batched_grad,
    )
    if isinstance(order, bool) or not isinstance(order, int) or order < 1:
        raise ValueError(f"order must be an integer >= 1, got {order!r}")
    opts = GradcheckOptions(
        eps=eps, atol=atol, rtol=rtol, raise_exception=raise_exception, nondet_tol=nondet_tol,
        check_undefined_grad=check_undefined_grad, check_grad_dtypes=check_grad_dtypes,
        check_batched_grad=check_batched_grad, check_forward_ad=check_fwd_over_rev,
        check_backward_ad=check_rev_over_rev, fast_mode=fast_mode, masked=masked,
        engine=engine, memory_budget=memory_budget, stencil=stencil, progress=progress,
        fast_tolerance=fast_tolerance,
    )
    extra = {"grad_outputs": grad_outputs, "gen_non_contig_grad_outputs": gen_non_contig_grad_outputs or None,
             "order": order if order != 2 else None}
    subject = {"fn": fn, "inputs": inputs, "call": "gradgradcheck",
               "keywords": {**{k: v for k, v in extra.items() if v is not None}, **backend_options}}
    be, fn, args = resolve_problem(fn, inputs, backend, backend_options)

    taken: dict = {}  # the inputs before fn's first call: the check finds a change that call made
    for level in range(order - 1):
        given = grad_outputs if level == 0 else None
        fn, args = _vjp_problem(be, fn, args, given, gen_non_contig_grad_outputs, level, fast_mode,
                                taken if level == 0 else None)
    run = prepared_run(fn, args, opts, be)
    with checking(run, subject) as verdict:
        all_checks(run, snapshots=taken)
    return verdict.passed


def _vjp_problem(be, fn, args, grad_outputs, noncontiguous, level, fast_mode=False, taken=None):
    """The VJP of ``fn`` as a function of ``args + cotangents``, and those arguments; the
    checked inputs' snapshots go into ``taken`` (where given) before ``fn`` is called."""
    evaluated = seconds = None
    if grad_outputs is None:
        clock = time.thread_time  # the forward memo's digest rule compares CPU seconds
        if taken is not None:
            for p in be.checked_positions(args):  # validated first, as gradcheck does
                be.validate_input(p, args[p])
                taken[p] = be.snapshot(args[p])
        with be.preserve_state(args), numpy_rng_preserved():
            began = clock()
            outputs = be.as_tuple(fn(*args))
            seconds = clock() - began
        check_output_types(be, outputs)  # the VJP's first call reuses this forward
        evaluated = (tuple(args), outputs)
        differentiable = [o for o in outputs if be.is_differentiable_output(o)]
        gen = be.generator(differentiable[0] if differentiable else None, GRAD_OUTPUTS_SEED + level)
        cotangents = tuple(be.random_cotangent(o, gen, noncontiguous) for o in differentiable)
    else:
        cotangents = be.as_tuple(grad_outputs)
        if not cotangents:
            raise GradOutputsError("grad_outputs is empty: give one array for each differentiable output of fn, "
                                  "or None to have them drawn at random")
        for k, c in enumerate(cotangents):
            if not be.is_array(c):
                raise OutputTypeError(f"grad_outputs must be arrays, one for each differentiable output of fn, "
                                      f"but grad_outputs[{k}] is {type(c).__name__}: {c!r:.80}")
        fn = _output_types_checked(be, fn)
    input_positions = be.checked_positions(args)
    cotangent_positions = be.checked_positions(cotangents)
    vjp_fn = be.differentiable_vjp(fn, len(args), input_positions, cotangent_positions, evaluated=evaluated,
                                   few_calls=fast_mode, evaluated_seconds=seconds)
    return vjp_fn, tuple(args) + tuple(cotangents)


def _output_types_checked(be, fn):
    """``fn``, raising :class:`~agcheck.errors.OutputTypeError` where it returns anything
    but arrays (where ``grad_outputs`` are given, no call of ``fn`` precedes the VJP's)."""
    def checked(*args):
        out = fn(*args)
        check_output_types(be, be.as_tuple(out))
        return out

    checked.__wrapped__ = fn
    return checked
