"""``agcheck.check_grads``, ``agcheck.patch_jax()`` and ``pytest --agcheck-jax`` (issue 13,
item 4): JAX's ``check_grads`` semantics on agcheck."""
from __future__ import annotations

import sys

import numpy as np
import pytest

pytest_plugins = ["pytester"]

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import jax.test_util  # noqa: E402,F811

import agcheck  # noqa: E402

from tests.test_pytest_plugin import run  # noqa: E402

_JAX = {"check_grads": sys.modules["jax._src.public_test_util"].check_grads}


@jax.custom_vjp
def good_sin(x):
    return jnp.sin(x)


good_sin.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (g * jnp.cos(x),))


@jax.custom_vjp
def bad_sin(x):  # backward doubled
    return jnp.sin(x)


bad_sin.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (2 * g * jnp.cos(x),))


@jax.custom_jvp
def slightly_bad(x):  # tangent off by 1 %
    return jnp.sin(x)


slightly_bad.defjvp(lambda p, t: (jnp.sin(p[0]), 1.01 * jnp.cos(p[0]) * t[0]))


@jax.custom_vjp
def bad_second_order(x):  # first derivative right, its derivative wrong (g * cos(x) built from a stop_gradient)
    return jnp.sin(x)


bad_second_order.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (g * jax.lax.stop_gradient(jnp.cos(x)),))

X = jnp.linspace(0.1, 1.0, 5)

CASES = [
    ("good custom_vjp", good_sin, (X,), ("rev",)),
    ("bad custom_vjp", bad_sin, (X,), ("rev",)),
    ("1% jvp", slightly_bad, (X,), ("fwd", "rev")),
    # JAX's tolerances grow with the size of a compared array: on 100 elements the JVP's
    # 1% passes the "fwd" check, and the "rev" check (a scalar) fails it, on the
    # evaluations of f that it shares with the "fwd" check
    ("1% jvp, rev fails", slightly_bad, (jnp.linspace(0.1, 1.0, 100),), ("fwd", "rev")),
    ("second order", bad_second_order, (X,), ("rev",)),
    ("pytree", lambda x, y: (x * y["a"], jnp.sum(x) ** 2), (X, {"a": X + 1}), ("fwd", "rev")),
    ("numpy scalar float32", jnp.tanh, (np.float32(0.3),), ("fwd", "rev", "lin")),
    ("python float", lambda x: x ** 3, (2.0,), ("fwd", "rev")),
]


def _outcome(check, f, args, order, modes, **kw):
    try:
        check(f, args, order, modes=modes, **kw)
    except AssertionError as e:
        lines = str(e).strip().splitlines()
        return lines[:2]  # numpy's tolerance line and JAX's label (e.g. "VJP cotangent projection")
    return "ok"


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("name,f,args,modes", CASES, ids=[c[0] for c in CASES])
def test_same_verdict_and_message_as_jax(name, f, args, modes, order):
    expected = _outcome(_JAX["check_grads"], f, args, order, modes)
    assert _outcome(agcheck.check_grads, f, args, order, modes) == expected


@pytest.mark.parametrize("modes,order,fewer", [
    (("fwd", "rev"), 1, 3), (("fwd", "rev", "lin"), 1, 6), (("rev",), 1, 0),
    (("fwd", "rev"), 2, 10), (("rev",), 2, 1)])
def test_the_checks_of_a_level_share_the_evaluations_of_f(modes, order, fewer):
    """The primal and the central difference along the level's tangent are computed once
    for all the modes of a level (JAX computes them per mode: 3 calls of f fewer per level
    with two modes, 6 with three), and the next level on the "rev" branch takes its primal
    from the "rev" check's own VJP (1 call fewer): same verdict, fewer calls."""
    calls = []

    def counted(x):
        calls.append(1)
        return jnp.sin(x) * x

    _JAX["check_grads"](counted, (X,), order, modes=modes)
    by_jax = len(calls)
    calls.clear()
    agcheck.check_grads(counted, (X,), order, modes=modes)
    assert len(calls) == by_jax - fewer
    # the shared evaluations where a check must fail: a JVP 1% off on 100 elements (within
    # the "fwd" check's tolerance there) fails the "rev" check, as under JAX; a second
    # derivative built from a stop_gradient fails the next level's "rev" check, whose
    # primal came from the VJP of the level above
    if modes == ("rev",) and order == 2:
        broken, inputs, where = bad_second_order, (X,), "VJP of VJP"
    else:
        broken, inputs, where = slightly_bad, (jnp.linspace(0.1, 1.0, 100),), "VJP cotangent projection"
    with pytest.raises(AssertionError, match=where):
        agcheck.check_grads(broken, inputs, order, modes=modes)


def test_verdicts_where_they_should_be():
    agcheck.check_grads(good_sin, (X,), 2, modes=("rev",))
    with pytest.raises(AssertionError, match="VJP cotangent projection"):
        agcheck.check_grads(bad_sin, (X,), 1, modes=("rev",))
    agcheck.check_grads(bad_second_order, (X,), 1, modes=("rev",))
    with pytest.raises(AssertionError, match="VJP of VJP"):
        agcheck.check_grads(bad_second_order, (X,), 2, modes=("rev",))


def test_failure_carries_agcheck_account():
    with pytest.raises(AssertionError) as info:
        agcheck.check_grads(bad_sin, (X,), 1, modes=("rev",))
    e = info.value
    assert "agcheck (along the check's random direction)" in str(e)
    assert "The VJP's projection is 2.00 x the finite differences'" in str(e)
    assert e.account.factor == pytest.approx(2.0, rel=1e-3) and e.report is None and e.level == "VJP"


def test_failure_carries_agcheck_report_of_full_jacobians_on_request():
    with pytest.raises(AssertionError) as info:
        agcheck.check_grads(bad_sin, (X,), 1, modes=("rev",), account="full")
    e = info.value
    text = str(e)
    assert "agcheck (full Jacobians of this level, slow mode)" in text
    assert "Jacobian mismatch for output 0 with respect to input 0" in text
    assert "analytical = 2.00 x numerical" in text
    assert e.report is not None and e.report.blocks and e.level == "VJP" and e.account is None


def test_tolerances_and_eps_keywords():
    # a 1% error passes with a loose tolerance, given as a number or per dtype
    agcheck.check_grads(slightly_bad, (X,), 1, atol=0.1, rtol=0.1)
    agcheck.check_grads(slightly_bad, (X,), 1, atol={np.float32: 0.1}, rtol={np.float32: 0.1}, eps=1e-3)
    with pytest.raises(AssertionError):
        agcheck.check_grads(slightly_bad, (X,), 1, atol=1e-6, rtol=1e-6)


def test_full_mode_compares_whole_jacobians():
    # a wrong entry that a single random projection may miss at a loose tolerance
    @jax.custom_vjp
    def one_entry_off(x):
        return jnp.sin(x)

    one_entry_off.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (g * jnp.cos(x) * jnp.where(jnp.arange(x.size) == 3, 1.2, 1.0),))
    agcheck.check_grads(one_entry_off, (X,), 1, modes=("rev",), atol=1.0, rtol=1.0)
    with pytest.raises(AssertionError, match="full Jacobians"):
        agcheck.check_grads(one_entry_off, (X,), 1, modes=("rev",), atol=0.05, rtol=0.05, full=True)
    agcheck.check_grads(good_sin, (X,), 2, modes=("rev",), full=True)


def test_patch_jax_routes_check_grads():
    module = sys.modules["jax._src.public_test_util"]
    with agcheck.patch_jax() as patch:
        assert getattr(jax.test_util.check_grads, "agcheck_dropin", None) == "jax"
        jax.test_util.check_grads(good_sin, (X,), 1, modes=("rev",))
        with pytest.raises(AssertionError) as info:
            jax.test_util.check_grads(bad_sin, (X,), 1, modes=("rev",))
        assert "agcheck (along the check's random direction)" in str(info.value)
        assert patch.checks == 2 and patch.failures == 1
    assert jax.test_util.check_grads is _JAX["check_grads"] and module.check_grads is _JAX["check_grads"]
    handle = agcheck.patch_jax()
    handle.restore()
    assert jax.test_util.check_grads is _JAX["check_grads"]


def test_the_patched_check_grads_tells_a_float32_step_from_a_wrong_derivative():
    """A float32 Kepler orbit fails at JAX's eps=1e-4 as under JAX, with the same message;
    the account says the step is at fault, not the derivative."""
    from tests.test_jax_direction_account import _kepler

    with jax.enable_x64(False):
        m = jnp.linspace(0.1, 2.0, 100)
        expected = _outcome(_JAX["check_grads"], _kepler, (m,), 1, ("fwd", "rev"))
        with agcheck.patch_jax():
            assert _outcome(jax.test_util.check_grads, _kepler, (m,), 1, ("fwd", "rev")) == expected != "ok"
            with pytest.raises(AssertionError) as info:
                jax.test_util.check_grads(_kepler, (m,), 1)
    assert info.value.account.kind == "step_size" and "The step, not the derivative" in str(info.value)


SUITE = """
import jax, jax.numpy as jnp
from jax.test_util import check_grads


@jax.custom_vjp
def good(x):
    return jnp.sin(x)

good.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (g * jnp.cos(x),))


@jax.custom_vjp
def bad(x):
    return jnp.sin(x)

bad.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (2 * g * jnp.cos(x),))


def test_good():
    check_grads(good, (jnp.linspace(0.1, 1.0, 4),), 1, modes=("rev",))


def test_bad():
    check_grads(bad, (jnp.linspace(0.1, 1.0, 4),), 1, modes=("rev",))
"""


def test_plugin_agcheck_jax(pytester):
    pytester.makepyfile(test_jsuite=SUITE)
    result = run(pytester, "--agcheck-jax")
    result.assert_outcomes(passed=1, failed=1)
    text = result.stdout.str()
    assert "VJP cotangent projection" in text and "agcheck (along the check's random direction)" in text
    assert "2 jax check_grads calls went through agcheck (1 failed)" in text
    full = run(pytester, "--agcheck-jax", "--agcheck-jax-account=full")
    full.assert_outcomes(passed=1, failed=1)
    assert "agcheck (full Jacobians of this level" in full.stdout.str()
    plain = run(pytester)
    plain.assert_outcomes(passed=1, failed=1)
    assert "agcheck (" not in plain.stdout.str()
