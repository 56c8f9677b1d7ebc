"""The optional protocol of the engine's faster paths (see :mod:`agcheck.backends.base`)."""
from __future__ import annotations

from typing import Callable, Sequence

from agcheck.backends.base import Trace, UnsupportedError

__all__ = ["BatchedForms"]


class BatchedForms:
    """The optional protocol of the engine's faster paths: ``fn`` evaluated for many moved
    inputs, and many JVPs, in one call each.

    A backend that implements it inherits this class beside :class:`Backend` and lists the
    forms it has (:data:`BATCHED_FORMS`) in :attr:`Backend.capabilities`; the engine asks
    :meth:`Backend.supports` before each. Without it (or with a form left out) the engine
    computes the same rows in loops of the core verbs, and every verdict is the same.
    """

    #: the flag :meth:`Backend.supports` reads
    batched_forms = True

    def evaluate_batch(self, fn: Callable, args: tuple, position: int, stacked) -> tuple:
        """``fn`` evaluated with ``args[position]`` replaced by each of ``stacked`` (a
        leading batch dimension) in one call: per output, the stacked results.
        Capability :attr:`Capability.BATCHED_EVALUATION`."""
        raise UnsupportedError("evaluate_batch")

    def evaluate_batch_functional(self, fn: Callable, args: tuple, position: int, stacked) -> tuple:
        """:meth:`evaluate_batch` with ``fn``'s in-place writes replaced by their
        out-of-place equivalents first, for functions that write batched values into arrays
        they create themselves (``out = zeros(...); out[..., 0] = f(x)``), which a batching
        transform refuses. The engine tries it only where :meth:`evaluate_batch` raised.
        Capability :attr:`Capability.FUNCTIONAL_BATCHED_EVALUATION`."""
        raise UnsupportedError("evaluate_batch_functional")

    def evaluate_stacked(self, fn: Callable, args: tuple, position: int, stacked,
                         tiled: Sequence[int] = ()) -> tuple:
        """``fn`` called once with ``args[position]`` replaced by the ``b`` copies in
        ``stacked`` laid end to end along the input's first dimension, as if it were
        ``fn``'s own batch dimension: per output, the result split back into ``b`` equal
        parts, shape ``(b, output.shape[0] // b, *output.shape[1:])``. The arguments at
        the positions ``tiled`` (which share that first dimension) are repeated ``b``
        times end to end, so that each copy meets them as a plain call does.

        Only a function that treats that dimension as independent samples gives each
        copy its own result; the engine uses this form only after comparing it with
        plain calls. Raises ``ValueError`` when an output cannot be split so.
        Capability :attr:`Capability.STACKED_EVALUATION`."""
        raise UnsupportedError("evaluate_stacked")

    def element_moves(self, x, flat: Sequence[int], step, sign: int):
        """Copies of ``x`` stacked, the ``b``-th with element ``flat[b]`` moved by
        ``sign * step``, rounded as :meth:`Perturber.evaluate_element` rounds.
        Capability :attr:`Capability.BATCHED_EVALUATION`."""
        raise UnsupportedError("element_moves")

    def one_hots(self, like, flat: Sequence[int]):
        """Stacked one-hot arrays shaped like ``like``, the ``b``-th one at ``flat[b]``.
        Capability :attr:`Capability.BATCHED_EVALUATION`."""
        raise UnsupportedError("one_hots")

    def batching_obstacle(self, fn: Callable, position: int, trace: Trace) -> str | None:
        """Why ``fn`` certainly cannot be evaluated with ``args[position]`` batched
        (:meth:`evaluate_batch`), as its traced evaluation ``trace`` shows it, or ``None``
        when nothing shows; by default :meth:`Trace.batching_obstacle`."""
        return trace.batching_obstacle()

    def stacking_obstacle(self, fn: Callable, position: int, tiled: Sequence[int] = ()) -> str | None:
        """Why :meth:`evaluate_stacked` certainly cannot evaluate ``fn`` with
        ``args[position]`` stacked (beside the arguments ``tiled``), as ``fn``'s kind
        shows it, or ``None`` when nothing shows. The engine then skips that form without
        calling ``fn``; ``None`` promises nothing."""
        return None

    def jvp_rows(self, fn: Callable, args: tuple, checked: Sequence[int], j: int, flat: Sequence[int]) -> list:
        """Forward-mode Jacobian rows ``flat`` of input ``checked[j]`` in one batched JVP:
        per floating output a ``(len(flat), numel)`` array. Capability
        :attr:`Capability.BATCHED_JVP`."""
        raise UnsupportedError("jvp_rows")

    def jvp_along(self, fn: Callable, args: tuple, checked: Sequence[int], j: int, stacked) -> list:
        """JVPs along each of ``stacked`` (tangents of input ``checked[j]``, the others'
        zero): per floating output a ``(len(stacked), numel)`` array, ``None`` where
        undefined. Capability :attr:`Capability.BATCHED_JVP`."""
        raise UnsupportedError("jvp_along")
