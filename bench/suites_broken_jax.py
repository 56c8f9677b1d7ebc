"""pytest plugin for bench/real_suites.py: breaks the derivatives of a few JAX primitives, so
that a suite's checks of them fail, and JAX's checker and agcheck can be compared on
failing verdicts (the suites pass otherwise, under both).

Loaded with ``-p suites_broken_jax`` (bench/ on PYTHONPATH) before any function is traced.
``SUITES_BROKEN_JAX`` names the primitives and the factor their JVP's tangent is scaled
by, e.g. ``sin,exp,log,tanh:1.1`` (the default). The VJPs, which JAX derives from the JVP
by transposition, are broken alike.
"""
import os

_DEFAULT = "sin,exp,log,tanh:1.1"


def _scaled(rule, factor):
    from jax._src import ad_util

    def scale(t):
        if isinstance(t, ad_util.Zero) or not hasattr(t, "dtype"):
            return t
        return t * factor

    def jvp(primals, tangents, **params):
        out, tangent = rule(primals, tangents, **params)
        if isinstance(tangent, (list, tuple)):
            return out, type(tangent)(scale(t) for t in tangent)
        return out, scale(tangent)

    return jvp


def pytest_configure(config):
    from jax._src.interpreters import ad
    from jax._src.lax import lax

    names, _, factor = os.environ.get("SUITES_BROKEN_JAX", _DEFAULT).partition(":")
    factor = float(factor or 1.1)
    for name in names.split(","):
        primitive = getattr(lax, f"{name.strip()}_p")
        ad.primitive_jvps[primitive] = _scaled(ad.primitive_jvps[primitive], factor)
