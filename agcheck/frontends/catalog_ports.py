"""The framework-specific ports of the catalog's ``custom`` entries and of the demo failure:
per framework a ``torch.autograd.Function``, a ``jax.custom_jvp`` or ``jax.custom_vjp``, a
``tf.custom_gradient``, an ``mx.custom_function``. They are examples of user code, built on
first use: importing this module imports no framework.
"""
from __future__ import annotations

import functools

__all__ = ["softplus_ports", "cube_ports", "broken_exp_ports"]


def _ports(builders: dict):
    """``Entry.ports`` from ``{backend: build}``: the port that ``build()`` makes, made once
    (``None`` for a backend without one)."""

    @functools.lru_cache(maxsize=None)
    def ports(backend: str):
        build = builders.get(backend)
        return None if build is None else build()

    return ports


# -- softplus: reverse and forward mode hand-written -------------------------------------------

def _softplus_torch():
    import torch

    class Softplus(torch.autograd.Function):
        """softplus with a hand-written backward and forward-mode jvp"""

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            ctx.save_for_forward(x)
            return torch.log1p(torch.exp(x))

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * torch.sigmoid(x)

        @staticmethod
        def jvp(ctx, t):
            (x,) = ctx.saved_tensors
            return t * torch.sigmoid(x)

    def softplus_torch(x):
        return Softplus.apply(x)

    return softplus_torch


def _softplus_jax():
    import jax
    import jax.numpy as jnp

    @jax.custom_jvp
    def softplus_jax(x):
        return jnp.log1p(jnp.exp(x))

    @softplus_jax.defjvp
    def _softplus_jax_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return softplus_jax(x), t / (1 + jnp.exp(-x))

    return softplus_jax


def _softplus_tensorflow():
    from agcheck.backends.tensorflow_loading import import_tensorflow

    tf = import_tensorflow()

    @tf.custom_gradient
    def softplus_tf(x):
        def backward(g):
            return g * tf.sigmoid(x)

        return tf.math.log1p(tf.exp(x)), backward

    return softplus_tf


def _softplus_mlx():
    import mlx.core as mx

    @mx.custom_function
    def softplus_mlx(x):
        return mx.log1p(mx.exp(x))

    @softplus_mlx.vjp
    def _softplus_mlx_vjp(primals, cotangent, output):  # one input: primals is the array
        return cotangent * mx.sigmoid(primals)

    @softplus_mlx.jvp
    def _softplus_mlx_jvp(primals, tangents):
        return tangents * mx.sigmoid(primals)

    return softplus_mlx


softplus_ports = _ports({"torch": _softplus_torch, "jax": _softplus_jax, "tensorflow": _softplus_tensorflow,
                         "mlx": _softplus_mlx})


# -- cube: reverse mode only hand-written ------------------------------------------------------

def _cube_torch():
    import torch

    class Cube(torch.autograd.Function):
        """x ** 3 with a hand-written backward only"""

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 3 * x * x * g

    def cube_torch(x):
        return Cube.apply(x)

    return cube_torch


def _cube_jax():
    import jax

    @jax.custom_vjp
    def cube_jax(x):
        return x * x * x

    cube_jax.defvjp(lambda x: (x * x * x, x), lambda x, g: (3 * x * x * g,))
    return cube_jax


def _cube_tensorflow():
    from agcheck.backends.tensorflow_loading import import_tensorflow

    tf = import_tensorflow()

    @tf.custom_gradient
    def cube_tf(x):
        return x * x * x, lambda g: 3 * x * x * g

    return cube_tf


def _cube_mlx():
    import mlx.core as mx

    @mx.custom_function
    def cube_mlx(x):
        return x * x * x

    @cube_mlx.vjp
    def _cube_mlx_vjp(primals, cotangent, output):  # one input: primals is the array
        return 3 * primals * primals * cotangent

    return cube_mlx


cube_ports = _ports({"torch": _cube_torch, "jax": _cube_jax, "tensorflow": _cube_tensorflow, "mlx": _cube_mlx})


# -- the demo failure: exp whose torch derivatives are scaled by 2 ---------------------------

@functools.lru_cache(maxsize=None)
def _broken_exp_ports(backend: str):
    if backend == "torch":
        import torch

        class ScaledBackwardExp(torch.autograd.Function):
            """exp whose backward and jvp are wrong by a factor of 2"""

            @staticmethod
            def forward(ctx, x):
                y = torch.exp(x)
                ctx.save_for_backward(y)
                ctx.save_for_forward(y)
                return y

            @staticmethod
            def backward(ctx, g):
                (y,) = ctx.saved_tensors
                return 2 * g * y  # the bug: the derivative of exp is exp, not 2 exp

            @staticmethod
            def jvp(ctx, t):
                (y,) = ctx.saved_tensors
                return 2 * t * y

        def exp_broken_torch(x):
            return ScaledBackwardExp.apply(x)

        return exp_broken_torch
    if backend == "jax":
        import jax.numpy as jnp

        return jnp.exp
    if backend == "mlx":
        import mlx.core as mx

        return mx.exp
    return None


#: public under this name; the function keeps its own, which the demo's report shows
#: (``_broken_exp_ports.<locals>.exp_broken_torch``)
broken_exp_ports = _broken_exp_ports
