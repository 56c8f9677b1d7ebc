"""What the engine's paths tell the orchestration: typed outcomes and log events.

An engine path either decides that a check passed, or leaves it undecided with a reason
(the reference engine then decides, and writes torch's message). What each path chose on
the way (batched or looped, passed or declined, and why) is logged as
:class:`EngineEvent` records, for reports and tests; nothing is communicated through text.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

__all__ = ["EngineEvent", "Outcome", "PASSED", "undecided", "UserErrors"]


@dataclass(frozen=True)
class EngineEvent:
    """One decision of the engine.

    Attributes
    ----------
    path : str
        ``"numerical"`` (how an input is moved), ``"vjp"`` (how analytical columns are
        computed), ``"compressed"`` or ``"coloured"`` (the compressed-difference paths),
        ``"failure"`` (a mismatch decided from the engine's rows).
    decision : str
        ``"batched"`` / ``"looped"`` (numerical, vjp), ``"repriced"`` (numerical, vjp: a
        batch that did not pay against the loop's price from the probe or the first
        columns, the loop priced again and found dearer, so that batching goes on),
        ``"remeasured"`` (numerical: a batch whose rows cost far more than the probe's
        one-row batch, measured once more before the loop takes over),
        ``"shared"`` (numerical: the real parts' pass over complex outputs took the
        imaginary parts' evaluations, ``figures["served"]`` of them), ``"coloured"`` /
        ``"column by column"`` (vjp's second pass), ``"passed"`` / ``"declined"`` /
        ``"disagreement"`` (compressed, coloured), ``"confirmed"`` / ``"unconfirmed"``
        (failure).
    subject : int or None
        The input position (numerical) or checked-input index the event is about.
    detail : str
        Why, when the decision needs a reason (for a confirmed failure, the output index;
        for an input the probe left to the loop, each batched form left out or rejected
        and why, e.g. ``"vmap: ...; stacked: raised RuntimeError"``).
    via : str
        How a batched input is evaluated: ``"stacked"`` (copies laid end to end along
        fn's own first dimension, one plain call), ``"vmap"`` (the framework's
        vectorising map) or ``"functional"`` (that map of fn with its in-place writes
        made out-of-place, where the plain map raised).
    figures : dict
        The measurements the decision was taken on, in seconds: ``"loop_row"`` (one
        element's rows computed one at a time), ``"stacked_probe"``, ``"vmap_probe"`` or
        ``"functional_probe"`` (the probe's batch of one row's two points, in the form chosen),
        ``"probe_row"`` (that batch's seconds, per row),
        ``"batched_row"`` (a row of the batch that decided), ``"loop_column"`` /
        ``"batched_column"`` (one VJP, alone or in a batch); for a confirmed failure,
        counts: ``"exact_rows"`` and
        ``"exact_columns"`` of the failing block computed as the reference engine does.
    """

    path: str
    decision: str
    subject: int | None = None
    detail: str = ""
    via: str = field(default="", compare=False)
    figures: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Outcome:
    """A path's result: ``passed``, or undecided with ``reason``.

    The numerical rows an undecided path computed exactly as the reference engine
    computes them are in the run's rows (:mod:`agcheck.core.numerical_rows`), where the
    reference engine takes them. ``analytical`` carries analytical Jacobians already
    computed one VJP per column and checked for reentrancy: ``{output position: (column
    ranges, rows)}``, ``rows`` a NumPy array ``(output numel, input numel)`` per checked
    input, exact in the listed column ranges (output elements).

    ``whole`` marks a mismatch the engine confirmed (:mod:`~agcheck.engine.failure`):
    then the run's rows and ``analytical`` cover the whole Jacobians, computed as the
    reference engine computes them where its message prints them and where the failure
    was confirmed, and the reference engine takes every row; ``inexact`` says that some
    of their other entries came from batched evaluations or batched VJPs (the report then
    says so)."""

    passed: bool
    reason: str = ""
    analytical: dict | None = field(default=None, repr=False, compare=False)
    whole: bool = False
    inexact: bool = False

    def __bool__(self) -> bool:
        return self.passed


PASSED = Outcome(True)


def undecided(reason: str, analytical: dict | None = None, whole: bool = False, inexact: bool = False) -> Outcome:
    """The outcome of a path that could not decide (the reference engine will)."""
    return Outcome(False, reason, analytical, whole, inexact)


class UserErrors:
    """The errors raised by plain (unbatched) calls of the user's function or backward
    during one check: they propagate as the user's own, as torch's would, instead of
    sending the check to the reference engine (which might not meet them again)."""

    def __init__(self):
        self._seen: list[BaseException] = []

    def call(self, fn: Callable, *args, **kwargs):
        """``fn(*args, **kwargs)``, remembering what it raises."""
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            self._seen.append(e)
            raise

    def remember(self, exc: BaseException) -> None:
        """Count ``exc``, raised by a plain call made without :meth:`call`, among them."""
        self._seen.append(exc)

    def __contains__(self, exc: BaseException) -> bool:
        return any(exc is seen for seen in self._seen)
