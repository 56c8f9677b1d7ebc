"""The TensorFlow backend's traces and perturbers.

:class:`TfTrace` holds ``fn``'s outputs and the persistent ``tf.GradientTape`` that
recorded them; :class:`TfPerturber` moves one input (a ``tf.Variable`` in place, a
``tf.Tensor`` by a moved copy) and restores it bitwise.
"""
from __future__ import annotations

import numpy as np

from agcheck.backends.base import Perturber, Trace
from agcheck.backends.tensorflow_arrays import (_NONE, _Native, _dtype, _host, _is_inexact, _to_tf, _with_replaced,
                                                owns, tf)
from agcheck.backends.tensorflow_batched import _BatchedForm, _quiet_notes, _stacked_spec

__all__ = ["TfTrace", "TfPerturber"]


class TfTrace(Trace):
    """``fn``'s outputs and the persistent ``tf.GradientTape`` that recorded them."""

    def __init__(self, outputs: tuple, tape, sources: list, be):
        super().__init__(outputs)
        self._tape = tape
        self._sources = sources
        self._be = be
        self._batched = {}  # output position -> its _BatchedForm of VJPs

    def _targets(self, output_positions, cotangents):
        targets, grads = [], []
        for p, c in zip(output_positions, cotangents):
            o = self.outputs[p]
            if not _is_inexact(o):
                continue
            targets.append(o)
            grads.append(_to_tf(c, _dtype(o), like=o) if c is not None else tf.zeros_like(o))
            if tuple(grads[-1].shape) != tuple(o.shape):
                grads[-1] = tf.reshape(grads[-1], tf.shape(o))
        return targets, grads

    def vjp(self, output_positions, cotangents) -> list:
        targets, grads = self._targets(output_positions, cotangents)
        if not targets:
            return [None] * len(self._sources)
        result = self._tape.gradient(targets, self._sources, output_gradients=grads, unconnected_gradients=_NONE)
        return [None if g is None else _host(tf.convert_to_tensor(g)) for g in result]

    def vjp_batched(self, output_position, stacked_cotangents) -> list:
        o = self.outputs[output_position]
        stacked = _to_tf(stacked_cotangents, _dtype(o), like=o)
        form = self._batched.get(output_position)
        if form is None:
            tape, sources = self._tape, self._sources

            def single(c):
                grads = tape.gradient(o, sources, output_gradients=c,
                                      unconnected_gradients=tf.UnconnectedGradients.ZERO)
                return [tf.convert_to_tensor(g) for g in grads]

            form = self._batched[output_position] = _BatchedForm(lambda s: tf.vectorized_map(single, s),
                                                                 _stacked_spec(stacked, o))
        try:
            with _quiet_notes():
                batched = form(stacked)
        except Exception as e:  # the backward's failure under vectorized_map: the check's finding
            raise RuntimeError(f"tf.vectorized_map of the gradient failed: {type(e).__name__}: {e}") from e
        return [_host(g) for g in batched]


class TfPerturber(Perturber):
    """Moves ``args[position]`` for one evaluation of ``fn``: a ``tf.Variable`` in place
    (assigned back bitwise in a ``finally``), a ``tf.Tensor`` by passing a moved copy.
    Returns the outputs as NumPy arrays (non-array outputs as they are)."""

    def __init__(self, args: tuple, position: int, be):
        self.args = tuple(args)
        self.position = position
        self.x = args[position]
        self.shape = tuple(int(s) for s in self.x.shape)
        self.numel = int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1
        self._original = _host(self.x).copy()
        self._be = be
        self._native = _Native(be)

    def index(self, flat: int) -> tuple:
        return tuple(int(i) for i in np.unravel_index(flat, self.shape)) if self.shape else ()

    def _evaluate(self, fn, moved: np.ndarray) -> tuple:
        fn = self._native(fn)
        x = self.x
        if isinstance(x, tf.Variable):
            x.assign(moved)
            try:
                outs = self._be.as_tuple(fn(*self.args))
                return tuple(_host(o) if owns(o) else o for o in outs)
            finally:
                x.assign(self._original)
        value = _to_tf(moved, like=x)
        outs = self._be.as_tuple(fn(*_with_replaced(self.args, [self.position], [value])))
        return tuple(_host(o) if owns(o) else o for o in outs)

    def evaluate_element(self, fn, flat, step, sign) -> tuple:
        moved = self._original.copy()
        view = moved.reshape(-1)
        # the same arithmetic as torch's in-place move: x[idx] - step, x[idx] + step
        view[flat] = view[flat] - step if sign < 0 else view[flat] + step
        return self._evaluate(fn, moved)

    def evaluate_direction(self, fn, step, sign) -> tuple:
        step = _host(step)
        moved = self._original - step if sign < 0 else self._original + step
        return self._evaluate(fn, moved.astype(self._original.dtype, copy=False).reshape(self._original.shape))
