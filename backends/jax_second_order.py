"""The JAX backend's second order: VJPs as JAX functions, differentiable again.

:class:`JaxSecondOrder` is a mixin of :class:`~agcheck.backends.jax_backend.JaxBackend`:
the random cotangents and the differentiable VJP of gradgradcheck, and the VJP of a VJP
crosscheck compares.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from agcheck.backends.jax_arrays import (_Outputs, _as_cotangent, _is_complex_dtype, _is_inexact,
                                         _to_torch_convention, _with_replaced, _zero_cotangent)

__all__ = ["JaxSecondOrder"]


class JaxSecondOrder:
    """Second-order derivatives of the JAX backend (capability ``second_order``)."""

    # -- second order -----------------------------------------------------------------
    def random_cotangent(self, like, generator, noncontiguous):
        """Uniform values in [-1, 1) shaped like ``like`` (doubles for non-floating
        outputs); ``noncontiguous`` has no meaning for JAX arrays and is ignored."""
        dtype = like.dtype if _is_inexact(like) else jnp.float64
        shape = tuple(like.shape)
        if _is_complex_dtype(dtype):
            values = (generator.random(shape) * 2 - 1) + 1j * (generator.random(shape) * 2 - 1)
        else:
            values = generator.random(shape) * 2 - 1
        return self._from_numpy(values, like, dtype)

    def differentiable_vjp(self, fn, n_inputs, input_positions, cotangent_positions, evaluated=None,
                           few_calls=False, evaluated_seconds=None):
        """The VJP of ``fn`` (torch's convention) as a JAX function of
        ``(*inputs, *cotangents)``, differentiable again by JAX. Concrete calls whose
        inputs keep their values (only the cotangents move) reuse the last forward and its
        pullback, which JAX keeps pure."""
        ordered = sorted(set(input_positions))
        last = {}  # the last concrete forward: {"key": ..., "value": (outputs, pullback)}

        def vjp_of_fn(*args):
            primals, cotangents = args[:n_inputs], args[n_inputs:]
            split = _Outputs(self.as_tuple)

            def of_checked(*values):
                return split.arrays_of(fn(*_with_replaced(primals, ordered, values)))

            key = self._values_key(primals)
            if key is not None and last.get("key") == key:
                outs, pullback = last["value"]
            else:
                outs, pullback = jax.vjp(of_checked, *[primals[k] for k in ordered])
                last.clear()
                if key is not None:
                    last.update(key=key, value=(outs, pullback))
            given = iter(cotangents)
            cots = tuple(_as_cotangent(next(given), o) if _is_inexact(o) else _zero_cotangent(o) for o in outs)
            return tuple(_to_torch_convention(g) for g in pullback(cots))

        return vjp_of_fn

    def vjp_of_vjp(self, fn, args, checked, output, cotangent, gradient_cotangents) -> dict:
        """``jax.vjp`` of ``jax.vjp``, each mapped into torch's convention:
        ``torch_vjp(v) == conj(jax_vjp(conj(v)))`` at both levels."""
        primals = [args[p] for p in checked]

        def f_k(*xs):
            return self.as_tuple(fn(*_with_replaced(args, checked, xs)))[output]

        w = jnp.asarray(np.asarray(cotangent, dtype=np.asarray(f_k(*primals)).dtype))

        def gradient_in_torch_convention(*xs):
            _, pullback = jax.vjp(f_k, *xs)
            return tuple(jnp.conj(g) for g in pullback(jnp.conj(w)))

        result = {}
        for j1 in range(len(primals)):
            _, pullback2 = jax.vjp(lambda *xs, j1=j1: gradient_in_torch_convention(*xs)[j1], *primals)
            g_dtype = np.asarray(primals[j1]).dtype
            rows = {j2: [] for j2 in range(len(primals))}
            for c in gradient_cotangents[j1]:
                hs = pullback2(jnp.conj(jnp.asarray(np.asarray(c, dtype=g_dtype))))
                for j2, h in enumerate(hs):
                    rows[j2].append(np.asarray(jnp.conj(h)).reshape(-1))
            for j2 in rows:
                result[(j1, j2)] = np.stack(rows[j2], 0)
        return result
