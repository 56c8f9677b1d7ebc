"""The TensorFlow backend's batched forms: ``tf.vectorized_map``, each form traced once
per check.

:class:`TfBatched` is :class:`~agcheck.backends.tensorflow_backend.TensorFlowBackend`'s
implementation of the optional protocol
:class:`~agcheck.backends.batched_forms.BatchedForms`, with its batched JVPs;
:class:`_BatchedForm` and :func:`_quiet_notes` also serve the traces' batched VJPs.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager

import numpy as np

from agcheck.backends.batched_forms import BatchedForms
from agcheck.backends.tensorflow_arrays import _dtype, _host, _is_inexact, _np_dtype, _to_tf, _with_replaced, tf

__all__ = ["TfBatched"]


class _DropNotes(logging.Filter):
    """Drops two of TensorFlow's log notes that concern how the backend calls it, not the
    user's function: ``tf.vectorized_map`` traces its function anew on every call by design
    ("triggered tf.function retracing"), and ``ForwardAccumulator`` notes that it expects
    floating primals when given a complex one ("watched primal must be floating") although
    its complex JVPs are right (``tests/test_tensorflow_backend.py`` compares them with
    torch's)."""

    NOTES = ("triggered tf.function retracing", "The dtype of the watched primal must be floating")

    def filter(self, record) -> bool:
        message = record.getMessage()
        return not any(note in message for note in self.NOTES)


@contextmanager
def _quiet_notes():
    """Around calls into ``tf.vectorized_map`` and ``ForwardAccumulator``: the notes of
    :class:`_DropNotes` are dropped (the filter is removed afterwards; nothing else of
    TensorFlow's logging changes)."""
    logger = logging.getLogger("tensorflow")
    quiet = _DropNotes()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


class _BatchedForm:
    """One batched computation of a check as a ``tf.function`` of its stacked argument,
    traced once for every batch size.

    Called eagerly, ``tf.vectorized_map`` wraps its work in a new ``tf.function`` on every
    call, so ``fn`` is traced, converted by autograph (which leaves ``fn`` itself as it is:
    ``vectorized_map`` calls it from TensorFlow's own code) and vectorized anew for every
    batch: 15-60 ms for a small function, more than the loop of a small check costs, on
    every batch the engine computes. Here the vectorized computation ``body`` (a function
    of the stacked tensor that calls ``tf.vectorized_map``, which inside a ``tf.function``
    vectorizes in place) is traced once, without autograph, the batch dimension unknown."""

    def __init__(self, body, spec):
        self._body = body
        self._spec = spec
        self._concrete = None

    def __call__(self, stacked):
        if self._concrete is None:
            self._concrete = tf.function(self._body, autograph=False,
                                         input_signature=[self._spec]).get_concrete_function()
        return self._concrete(stacked)


def _stacked_spec(stacked, like):
    """The signature of a stack of ``like``-shaped tensors, any number of them."""
    return tf.TensorSpec((None, *tuple(int(s) for s in like.shape)), stacked.dtype)


class TfBatched(BatchedForms):
    """Batched evaluations and JVPs of the TensorFlow backend (``tf.vectorized_map``)."""

    def _form(self, key, held: tuple, body, spec) -> _BatchedForm:
        """The batched form ``key`` of this check, traced on its first use: ``held`` (the
        function and the arguments that ``body`` closes over) must be the very objects it
        was made with, else it is made anew. Forms live as long as the check's backend (one
        check): a function that reads values it does not take as arguments is traced anew
        by the next check."""
        entry = self._forms.get(key)
        if entry is not None and len(entry[0]) == len(held) and all(a is b for a, b in zip(entry[0], held)):
            return entry[1]
        form = _BatchedForm(body, spec)
        self._forms[key] = (held, form)
        return form

    def _jvp_stack(self, fn, args, positions, j, stacked):
        """``tf.vectorized_map`` of the JVP along each of ``stacked`` (tangents of
        ``args[positions[j]]``, the others zero): stacked tangents of every array output."""
        x = args[positions[j]]
        stacked = _to_tf(stacked, _dtype(x), like=x)
        native = self._native(fn)

        def single(t):
            primals = [args[p] for p in positions]
            tangents = [t if i == j else tf.zeros_like(_to_tf(args[p])) for i, p in enumerate(positions)]
            with tf.autodiff.ForwardAccumulator(primals, tangents) as acc:
                outs = self.as_tuple(native(*args))
            return [acc.jvp(o, unconnected_gradients=tf.UnconnectedGradients.ZERO)
                    for o in outs if _is_inexact(o)]

        form = self._form(("jvp", id(fn), tuple(positions), j), (fn, *args),
                          lambda s: tf.vectorized_map(single, s), _stacked_spec(stacked, x))
        try:
            with _quiet_notes():
                return [_host(r) for r in form(stacked)]
        except Exception as e:  # fn or its derivative under vectorized_map: the check's finding
            raise RuntimeError(
                f"tf.vectorized_map of the forward-mode derivative failed: {type(e).__name__}: {e}") from e

    def jvp_batched(self, fn, args, position, stacked_tangents) -> tuple:
        return tuple(self._jvp_stack(fn, args, [position], 0, stacked_tangents))

    # -- batched forms (the batched engine) ---------------------------------------------
    def evaluate_batch(self, fn, args, position, stacked):
        """``fn`` evaluated with ``args[position]`` replaced by each of ``stacked``
        (``tf.vectorized_map``); per output, the stacked results as NumPy arrays."""
        x = args[position]
        stacked = _to_tf(stacked, _dtype(x), like=x)
        native = self._native(fn)

        def at(value):
            return tuple(self.as_tuple(native(*_with_replaced(args, [position], [value]))))

        form = self._form(("evaluate", id(fn), position), (fn, *args), lambda s: tf.vectorized_map(at, s),
                          _stacked_spec(stacked, x))
        with _quiet_notes():
            return tuple(_host(o) for o in form(stacked))

    def element_moves(self, x, flat, step, sign):
        """Copies of ``x`` (NumPy), the ``b``-th with element ``flat[b]`` moved by
        ``sign * step``, computed as the perturber computes it (``x[k] - step``)."""
        base = _host(x).reshape(-1)
        index = np.asarray(flat, dtype=np.int64)
        moved = np.repeat(base[None, :], len(flat), axis=0)
        entries = base[index]
        moved[np.arange(len(flat)), index] = entries - step if sign < 0 else entries + step
        return moved.reshape(len(flat), *tuple(int(s) for s in x.shape))

    def one_hots(self, like, flat):
        n = self.numel(like)
        z = np.zeros((len(flat), n), dtype=_np_dtype(self._kind(like)))
        z[np.arange(len(flat)), np.asarray(flat, dtype=np.int64)] = 1
        return z.reshape(len(flat), *tuple(int(s) for s in like.shape))

    def jvp_rows(self, fn, args, checked, j, flat):
        return self.jvp_along(fn, args, checked, j, self.one_hots(args[checked[j]], flat))

    def jvp_along(self, fn, args, checked, j, stacked):
        rows = self._jvp_stack(fn, args, list(checked), j, stacked)
        b = int(stacked.shape[0])
        return [r.reshape(b, -1) for r in rows]
