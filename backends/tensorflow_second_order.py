"""The TensorFlow backend's second order: VJPs through nested ``tf.GradientTape``s.

:class:`TfSecondOrder` is a mixin of
:class:`~agcheck.backends.tensorflow_backend.TensorFlowBackend`: the random cotangents
and the differentiable VJP of gradgradcheck, and the VJP of a VJP crosscheck compares.
"""
from __future__ import annotations

import numpy as np

from agcheck.backends.tensorflow_arrays import _NONE, _dtype, _host, _is_inexact, _np_dtype, _to_tf, tf

__all__ = ["TfSecondOrder"]


class TfSecondOrder:
    """Second-order derivatives of the TensorFlow backend (capability ``second_order``)."""

    # -- second order -----------------------------------------------------------------
    def random_cotangent(self, like, generator, noncontiguous):
        """Uniform values in [-1, 1) shaped like ``like`` (float64 for non-floating
        outputs), as a ``tf.Tensor``; ``noncontiguous`` has no meaning for TensorFlow's
        tensors (no strides) and is ignored."""
        kind = self._kind(like) if self.is_floating_or_complex(like) else tf.float64
        shape = tuple(int(s) for s in like.shape)
        real = kind.real_dtype
        values = generator.uniform(shape, minval=-1.0, maxval=1.0, dtype=tf.float64)
        if kind.is_complex:
            values = tf.complex(values, generator.uniform(shape, minval=-1.0, maxval=1.0, dtype=tf.float64))
            return tf.cast(values, kind)
        return tf.cast(values, real)

    def differentiable_vjp(self, fn, n_inputs, input_positions, cotangent_positions, evaluated=None,
                           few_calls=False, evaluated_seconds=None):
        """The VJP of ``fn`` as a function of ``(*inputs, *cotangents)``, computed with a
        tape inside the caller's tapes (and forward accumulators), so that it can be
        differentiated again; inputs with an unconnected gradient are left out, as
        torch leaves out undefined ones."""
        ordered = sorted(set(input_positions))
        native = self._native

        def vjp_of_fn(*args):
            primals, cotangents = args[:n_inputs], args[n_inputs:]
            sources = [primals[k] for k in ordered]
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                for s in sources:
                    tape.watch(s)
                outs = [o for o in self.as_tuple(native(fn)(*primals)) if _is_inexact(o)]
            grads = [_to_tf(c, _dtype(o), like=o) for c, o in zip(cotangents, outs)]
            result = tape.gradient(outs, sources, output_gradients=grads, unconnected_gradients=_NONE)
            return tuple(tf.convert_to_tensor(g) for g in result if g is not None)

        return vjp_of_fn

    def vjp_of_vjp(self, fn, args, checked, output, cotangent, gradient_cotangents) -> dict:
        """Second derivatives through nested ``tf.GradientTape``s: the VJP of output
        ``output`` with ``cotangent``, computed inside a persistent outer tape, then the
        VJP of each gradient with each of ``gradient_cotangents``. TensorFlow's complex
        convention is torch's at both levels, so nothing is mapped; an unconnected
        derivative is zeros."""
        fn = self._native(fn)
        sources = [args[p] for p in checked]
        shapes = [tuple(int(s) for s in x.shape) for x in sources]
        sizes = [int(np.prod(s, dtype=np.int64)) if s else 1 for s in shapes]
        dtypes = [_np_dtype(_dtype(x)) for x in sources]
        with tf.GradientTape(persistent=True, watch_accessed_variables=False) as outer:
            for x in sources:
                outer.watch(x)
            with tf.GradientTape(watch_accessed_variables=False) as inner:
                for x in sources:
                    inner.watch(x)
                out = self.as_tuple(fn(*args))[output]
            if _is_inexact(out):
                w = _to_tf(np.asarray(cotangent), _dtype(out), like=out)
                grads = inner.gradient(out, sources, output_gradients=tf.reshape(w, tf.shape(out)),
                                       unconnected_gradients=_NONE)
            else:
                grads = [None] * len(sources)
        result = {}
        for j1, g in enumerate(grads):
            for j2, x2 in enumerate(sources):
                rows = []
                for c in gradient_cotangents[j1]:
                    h = None
                    if g is not None:
                        c = _to_tf(np.asarray(c).reshape(shapes[j1]), g.dtype, like=g)
                        h = outer.gradient(g, x2, output_gradients=c, unconnected_gradients=_NONE)
                    rows.append(np.zeros(sizes[j2], dtype=dtypes[j2]) if h is None
                                else _host(tf.convert_to_tensor(h)).reshape(-1))
                result[(j1, j2)] = np.stack(rows, 0) if rows else np.zeros((0, sizes[j2]), dtypes[j2])
        del outer
        return result
