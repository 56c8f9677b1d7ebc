"""The contract's two per-call objects: :class:`Trace` (one evaluation of ``fn`` with its
VJP) and :class:`Perturber` (one input moved, ``fn`` evaluated, the input restored).

Re-exported by :mod:`agcheck.backends.base`, the contract's documented home.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Sequence

from agcheck.backends.contract_names import UnsupportedError

__all__ = ["Trace", "Perturber"]


class Trace:
    """The outputs of one evaluation of ``fn`` and the reverse-mode derivative at that point.

    Parameters
    ----------
    outputs : tuple
        Everything ``fn`` returned, as a tuple.
    """

    def __init__(self, outputs: tuple):
        self.outputs = outputs

    def vjp(self, output_positions: Sequence[int], cotangents: Sequence[Any]) -> list:
        """Vector-Jacobian product.

        Returns one entry per checked input: the gradient (an array) or ``None`` where
        the gradient is undefined (the input is unused).
        """
        raise NotImplementedError

    def unit_vjps(self, output_position: int, columns: Iterable[int], one_hot: Callable) -> Iterator[list]:
        """The VJP of each one-hot cotangent ``one_hot(output, j)``, ``j`` in ``columns``, in
        order: one list per column as :meth:`vjp` returns it, of arrays that later
        columns leave untouched."""
        out = self.outputs[output_position]
        for j in columns:
            yield self.vjp([output_position], [one_hot(out, j)])

    def vjp_batched(self, output_position: int, stacked_cotangents) -> list:
        """Many VJPs at once: ``stacked_cotangents`` has a leading batch dimension; one
        entry per checked input, stacked the same way, or ``None`` (undefined).
        Capability :attr:`Capability.BATCHED_GRAD`."""
        raise UnsupportedError("vjp_batched")

    def vjp_many(self, output_position: int, stacked_cotangents) -> list:
        """Many VJPs at once for the engine, as :meth:`vjp_batched` returns them, by
        whatever batching the framework offers (:meth:`vjp_batched` is what
        ``check_batched_grad`` tests, and may support fewer backward passes); by default
        :meth:`vjp_batched`."""
        return self.vjp_batched(output_position, stacked_cotangents)

    def batching_obstacle(self) -> str | None:
        """Why ``fn`` certainly cannot be evaluated in batched form
        (:meth:`Backend.evaluate_batch`), as this evaluation shows it (e.g. an operation
        without a batching rule), or ``None`` when nothing shows. The engine then skips
        that form without calling ``fn``; ``None`` promises nothing."""
        return None


class Perturber:
    """Moves one input in place and evaluates ``fn``; the input is restored bitwise.

    Obtained from :meth:`Backend.perturber`; the backend guarantees restoration also
    when ``fn`` raises, and after the ``with`` block that created it.
    """

    numel: int
    shape: tuple

    def index(self, flat: int) -> tuple:
        """The multi-index of the flat element ``flat`` (for messages)."""
        raise NotImplementedError

    def evaluate_element(self, fn: Callable, flat: int, step, sign: int) -> tuple:
        """Outputs of ``fn`` with element ``flat`` moved by ``sign * step`` (``step`` a
        real or complex scalar, ``sign`` +1 or -1), computed as ``x[flat] + step`` or
        ``x[flat] - step`` so that the rounding is the reference's."""
        raise NotImplementedError

    def evaluate_element_moves(self, fn: Callable, flat: int, moves: Sequence[tuple]) -> list:
        """:meth:`evaluate_element` at each ``(step, sign)`` of ``moves`` in turn: one
        tuple of outputs per move."""
        return [self.evaluate_element(fn, flat, step, sign) for step, sign in moves]

    def evaluate_direction(self, fn: Callable, step, sign: int) -> tuple:
        """Outputs of ``fn`` with the whole input moved by ``sign * step`` (``step`` an
        array shaped like the input)."""
        raise NotImplementedError

    # Inputs stored sparsely: ``numel`` counts the stored elements (what is moved), while
    # the Jacobian has one row per element of the input's dense equivalent.
    def dense_rows(self):
        """``None`` when stored element ``k`` is Jacobian row ``k`` (dense arrays); else
        ``(n_rows, rows)``: the Jacobian has ``n_rows`` rows, stored element ``k`` is row
        ``rows[k]``, and the rows of elements that are not stored are zero."""
        return None
