"""CheckRun: the context one gradcheck hands to its checks and to the engine."""
from __future__ import annotations

from typing import Any, Callable

from agcheck.backends.base import Backend
from agcheck.core.input_guard import InputGuard
from agcheck.core.numerical_rows import NumericalRows
from agcheck.core.outcome import EngineEvent, Outcome, UserErrors
from agcheck.stencil import Stencil, auto_eps, get_stencil
from agcheck.options import GradcheckOptions
from agcheck.progress import Progress

__all__ = ["CheckRun", "DEFAULT_MEMORY_BUDGET"]

#: bytes the engine may hold in Jacobians and batches when ``memory_budget`` is not given
DEFAULT_MEMORY_BUDGET = 1 << 30


class CheckRun:
    """One gradcheck's context: the function, its inputs, the backend, the options, and
    what the check gathers on the way (the engine's decisions, the errors of ``fn``).

    Attributes
    ----------
    fn : callable
        The checked function (watched for in-place writes into its inputs, where the
        check calls the caller's own ``fn``).
    args : tuple
        Its arguments.
    be : Backend
        The backend.
    opts : GradcheckOptions
        The check's keywords.
    checked : list of int
        The positions of the arguments the check differentiates.
    guard : InputGuard or None
        The checked inputs, watched for in-place changes once they are validated.
    engine_log : list of EngineEvent
        What the engine decided on the way.
    engine_fallbacks : list of Outcome
        The undecided outcomes the engine handed back to the reference engine.
    user_errors : UserErrors
        Errors raised by plain calls of ``fn`` or its backward (they propagate as they are).
    """

    def __init__(self, fn: Callable, args: tuple, be: Backend, opts: GradcheckOptions):
        self.fn, self.args, self.be, self.opts = fn, args, be, opts
        self.checked: list[int] = []
        self.guard: InputGuard | None = None
        self.engine_log: list[EngineEvent] = []
        self.engine_fallbacks: list[Outcome] = []
        self.user_errors = UserErrors()
        self.stencil: Stencil = get_stencil(opts.stencil)
        self.progress = Progress(enabled=opts.progress)
        #: the numerical Jacobian rows the check keeps, for every pass that reads them
        self.rows = NumericalRows(be, wanted=opts.check_backward_ad and opts.check_forward_ad and not opts.fast_mode)

    @property
    def memory_budget(self) -> int:
        """Bytes the engine may hold in Jacobians and batches."""
        return self.opts.memory_budget or DEFAULT_MEMORY_BUDGET

    def verify_inputs(self, cause: BaseException | None = None) -> None:
        """Raise :class:`CheckInputError`, the inputs restored, where ``fn`` changed a
        checked input in place at any of its calls (see :mod:`agcheck.core.input_guard`)."""
        if self.guard is not None:
            self.guard.verify(cause=cause)

    def eps_for(self, x: Any) -> float:
        """The finite-difference step for input ``x``."""
        eps = self.opts.eps
        if isinstance(eps, str):  # "auto", the options' only word
            return auto_eps(self.be.machine_epsilon(x), self.stencil)
        return eps

    def numerical_args(self, args: tuple) -> tuple:
        """The arguments the numerical side moves: unless ``masked``, every sparse argument
        is replaced by its dense equivalent (all elements specified), as torch does, so
        that finite differences reach the unspecified elements too. Dense arrays pass
        through unchanged."""
        if self.opts.masked:
            return args
        be = self.be
        return tuple(be.densify(a) if be.is_array(a) else a for a in args)
