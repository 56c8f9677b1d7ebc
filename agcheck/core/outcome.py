"""What the engine's paths tell the orchestration: outcomes and logged decisions.

A path decides that a check passed, or leaves it undecided with a reason for the reference
engine, which then decides and writes torch's message.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

__all__ = ["EngineEvent", "Outcome", "PASSED", "undecided", "UserErrors"]


@dataclass(frozen=True)
class EngineEvent:
    """One decision of the engine, logged for reports and tests.

    Attributes
    ----------
    path : str
        ``"plan"``, ``"numerical"``, ``"vjp"``, ``"forward"``, ``"compressed"``,
        ``"coloured"``, ``"exact"`` or ``"failure"``.
    decision : str
        ``"engine"`` / ``"reference"`` (plan); ``"batched"`` / ``"looped"`` / ``"by samples"``
        (numerical, vjp); ``"coloured"`` / ``"column by column"`` / ``"corrected"`` (vjp);
        ``"passed"`` / ``"declined"`` / ``"disagreement"`` (forward, compressed, coloured,
        exact); ``"confirmed"`` / ``"unconfirmed"`` (failure).
    subject : int or None
        The input position (numerical) or checked-input index.
    detail : str
        Why, where a reason is needed (a confirmed failure: the output index; an input left
        to the loop: each batched form rejected and why).
    via : str
        How a batched input is evaluated: ``"stacked"`` (copies along fn's own first
        dimension, one plain call), ``"vmap"`` or ``"functional"`` (vmap with in-place
        writes made out-of-place).
    figures : dict
        Counts and sizes the decision was taken on (``"loop_calls"``, ``"rows_per_batch"``,
        ``"columns_per_batch"``, ``"samples"``; for a confirmed failure ``"exact_rows"`` and
        ``"exact_columns"``), never seconds.
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

    ``analytical``: ``{output position: (column ranges, rows)}``, per checked input a NumPy
    ``(output numel, input numel)`` array, exact (one VJP per column, reentrancy checked) in
    those ranges. ``whole`` marks a mismatch the engine confirmed: the run's rows and
    ``analytical`` then cover the whole Jacobians, exact where torch's message prints them;
    ``inexact`` says some other entries came from batched evaluations or VJPs."""

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
    """Errors raised by plain calls of the user's function or backward during one check:
    they propagate as torch's would, not sending the check to the reference engine (which
    might not meet them again)."""

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
