"""agcheck's default account of a failing ``check_grads`` level: explained from the arrays the
check compared (``backends/jax_direction_account.py``), with no further calls of
``f``. Each case: the right derivative passes, the broken one fails with JAX's message and
the pattern named."""
from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import agcheck  # noqa: E402
from agcheck.backends.jax_direction_account import DirectionAccount  # noqa: E402
from tests.test_jax_backend import sin_with_jvp  # noqa: E402

X = jnp.linspace(0.1, 1.0, 5)
HEAD = "agcheck (along the check's random direction):"


def _sin_with_transpose(scale):
    """``sin`` whose JVP is right and whose transpose (hence VJP) is ``scale`` times it:
    the JVP solves ``(1 / cos x) y = t``; the broken part is the solve's ``transpose_solve``."""
    def jvp_by_solve(primals, tangents):
        c = jnp.cos(primals[0])
        return jnp.sin(primals[0]), lax.custom_linear_solve(
            lambda v: v / c, tangents[0], solve=lambda _, b: b * c, transpose_solve=lambda _, b: scale * b * c)

    f = jax.custom_jvp(lambda x: jnp.sin(x))
    f.defjvp(jvp_by_solve)
    return f


def _failure(f, args, order=1, modes=("fwd", "rev"), **kw):
    with pytest.raises(AssertionError) as info:
        agcheck.check_grads(f, args, order, modes=modes, **kw)
    account = info.value.account
    assert isinstance(account, DirectionAccount) and info.value.report is None
    assert HEAD in str(info.value) and account.text in str(info.value)
    return info.value, account


@pytest.mark.parametrize("scale,kind,factor", [(0.0, "zero_analytical", None), (-1.0, "sign", -1.0),
                                               (1.1, "factor", 1.1)])
def test_a_wrong_jvp_is_named_by_its_pattern(scale, kind, factor):
    agcheck.check_grads(sin_with_jvp(), (X,), 1, modes=("fwd",))
    error, account = _failure(sin_with_jvp(scale), (X,), modes=("fwd",))
    assert error.level == "JVP" and "JVP tangent" in str(error)
    assert account.stage == "tangent" and account.kind == kind and account.output == 0
    assert account.compared == 5 and account.differing == 5
    if factor is not None:
        assert account.factor == pytest.approx(factor, rel=1e-3)


def test_one_wrong_element_is_located():
    x = jnp.linspace(0.0, 1.0, 20)
    one_off = sin_with_jvp(jnp.where(jnp.arange(20) == 3, 1.5, 1.0))
    agcheck.check_grads(sin_with_jvp(), (x,), 1, modes=("fwd",))
    _, account = _failure(one_off, (x,), modes=("fwd",))
    assert account.kind == "few_entries" and account.differing == 1 and account.worst_index == (3,)
    assert "Only element(s) (3,) differ" in account.text


def test_a_wrong_transpose_is_told_from_a_wrong_forward_rule():
    """The JVP check passed along the tangent the VJP check then uses: agcheck compares
    <J t, c> from that JVP with finite differences, and says the reverse rule is wrong."""
    agcheck.check_grads(_sin_with_transpose(1.0), (X,), 1)
    error, account = _failure(_sin_with_transpose(2.0), (X,))
    assert error.level == "VJP" and account.stage == "projection" and account.kind == "reverse_rule"
    assert account.factor == pytest.approx(2.0, rel=1e-3)
    assert account.forward_projection == pytest.approx(account.expected, rel=1e-2)
    assert "the forward derivative is right and the reverse one is wrong" in account.text
    # without a JVP check at the level there is nothing to tell them apart by
    _, alone = _failure(_sin_with_transpose(2.0), (X,), modes=("rev",))
    assert alone.kind is None and alone.forward_projection is None and 'Add "fwd" to modes' in alone.text


def test_a_small_forward_error_let_through_by_the_jvp_check_is_named():
    """On 100 elements JAX's JVP check scales its tolerance by 100 and lets a 1% error
    through; the VJP check (a scalar) catches it, and the JVP agrees with the VJP."""
    x = jnp.linspace(0.1, 1.0, 100)
    agcheck.check_grads(sin_with_jvp(), (x,), 1)
    _, account = _failure(sin_with_jvp(1.01), (x,))
    assert account.kind == "small_forward_error"
    assert account.forward_projection == pytest.approx(account.derived, rel=1e-3)
    # the finite differences at larger steps stay where they were: not the step's fault
    errors = [e for _, e, _ in account.step_errors]
    assert max(errors) < 1.5 * min(errors) and "the derivative itself is." in account.text


def test_a_wrong_second_derivative_says_which_level_and_what_passed():
    @jax.custom_vjp
    def right(x):
        return jnp.sin(x)

    right.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (g * jnp.cos(x),))

    @jax.custom_vjp
    def frozen(x):  # first derivative right, its own derivative lost to a stop_gradient
        return jnp.sin(x)

    frozen.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (g * lax.stop_gradient(jnp.cos(x)),))
    agcheck.check_grads(right, (X,), 2, modes=("rev",))
    error, account = _failure(frozen, (X,), order=2, modes=("rev",))
    assert error.level == "VJP of VJP" and account.level == "VJP of VJP"
    assert "the VJP passed its own check, and the derivative of the VJP is wrong" in account.text


def test_a_primal_that_differs_is_explained():
    @jax.custom_jvp
    def shifted(x):  # the JVP's primal is not f(x)
        return jnp.sin(x)

    shifted.defjvp(lambda p, t: (jnp.sin(p[0]) + 0.5, jnp.cos(p[0]) * t[0]))
    agcheck.check_grads(sin_with_jvp(), (X,), 1, modes=("fwd",))
    error, account = _failure(shifted, (X,), modes=("fwd",))
    assert "JVP primal" in str(error) and account.stage == "primal" and account.kind == "primal"
    assert account.differing == 5 and account.derived == pytest.approx(account.expected + 0.5)


def test_non_finite_finite_differences_are_named():
    x = jnp.array([0.0, 1.0])
    jnp_sqrt_ok = jnp.array([1.0, 2.0])
    agcheck.check_grads(jnp.sqrt, (jnp_sqrt_ok,), 1, modes=("fwd",))
    _, account = _failure(jnp.sqrt, (x,), modes=("fwd",))
    assert account.kind == "non_finite" and account.worst_index == (0,)


def test_the_account_calls_f_no_more_than_jax_does():
    """The account reads what the check computed: a failing check calls f as often as JAX's
    own failing check (the full account, ``account="full"``, calls it per element)."""
    from jax._src import public_test_util

    jax_check = getattr(public_test_util.check_grads, "agcheck_original", public_test_util.check_grads)
    calls = []
    broken = sin_with_jvp(1.1)

    def counted(x):
        calls.append(1)
        return broken(x)

    x = jnp.linspace(0.1, 1.0, 30)
    counts = []
    for check in (jax_check, agcheck.check_grads):
        calls.clear()
        with pytest.raises(AssertionError):
            check(counted, (x,), 2, ["fwd", "rev"])
        counts.append(len(calls))
    by_jax, by_agcheck = counts
    assert by_jax > 0 and by_agcheck == by_jax
    calls.clear()
    with pytest.raises(AssertionError):
        agcheck.check_grads(counted, (x,), 2, ["fwd", "rev"], account="full")
    assert len(calls) > by_jax + 30


def test_account_keyword_is_checked():
    with pytest.raises(ValueError, match="account must be one of"):
        agcheck.check_grads(jnp.sin, (X,), 1, account="everything")
    with pytest.raises(ValueError, match="account must be"):
        agcheck.patch_jax(account="everything")
    with pytest.raises(TypeError, match="account keyword only"):
        agcheck.patch_jax(engine="reference")


def test_patch_jax_passes_the_account_on():
    bad = sin_with_jvp(2.0)
    with agcheck.patch_jax(account="full"):
        with pytest.raises(AssertionError) as info:
            jax.test_util.check_grads(bad, (X,), 1, modes=("fwd",))
    assert "agcheck (full Jacobians of this level, slow mode)" in str(info.value)
    assert info.value.report is not None and info.value.account is None
    with agcheck.patch_jax():
        with pytest.raises(AssertionError) as info:
            jax.test_util.check_grads(bad, (X,), 1, modes=("fwd",))
    assert HEAD in str(info.value) and info.value.account.kind == "factor"


def test_the_account_works_under_strict_promotion_and_on_complex_inputs():
    z = jnp.array([1 + 2j, 0.5 - 1j, -0.3 + 0.2j], dtype=jnp.complex64)

    @jax.custom_jvp
    def conj_bug(z):
        return z * z

    conj_bug.defjvp(lambda p, t: (p[0] * p[0], jnp.conj(2 * p[0] * t[0])))
    right = jax.custom_jvp(lambda z: z * z)
    right.defjvp(lambda p, t: (p[0] * p[0], 2 * p[0] * t[0]))
    with jax.numpy_dtype_promotion("strict"):
        agcheck.check_grads(right, (z,), 1, modes=("fwd",))
        _, account = _failure(conj_bug, (z,), modes=("fwd",))
    assert account.kind == "conjugate" and account.differing == 3
    assert np.iscomplexobj(np.asarray(account.derived))


def test_an_assertion_of_f_itself_keeps_its_message():
    def asserting(x):
        assert x.shape == (3,), "f wants three elements"
        return jnp.sin(x)

    agcheck.check_grads(asserting, (jnp.ones(3),), 1)
    error, account = _failure(asserting, (X,))
    assert str(error).startswith("f wants three elements")
    assert account.stage == "unknown" and "failed before comparing anything" in account.text


def test_an_integer_output_fails_as_under_jax_and_its_dtypes_are_named():
    """JAX's check asserts that a JVP's tangents have the primal's dtypes (an integer
    output's tangent is float0): an AssertionError without a message, under both checkers."""
    from jax._src import public_test_util

    jax_check = getattr(public_test_util.check_grads, "agcheck_original", public_test_util.check_grads)

    def with_int(x):
        return jnp.sin(x), jnp.floor(3 * x).astype(jnp.int32)

    agcheck.check_grads(lambda x: with_int(x)[0], (X,), 1)
    with pytest.raises(AssertionError) as by_jax:
        jax_check(with_int, (X,), 1)
    error, account = _failure(with_int, (X,))
    assert str(by_jax.value) == "" and str(error).startswith("\n\n" + HEAD)
    assert account.stage == "dtypes" and "output 1: int32 against float0" in account.text


# -- the step, not the derivative: float32 finite differences ------------------------------------

def _kepler(mean_anomaly, e=0.3):
    """``10 sin E`` of the eccentric anomaly ``E`` solving Kepler's equation ``E = M + e sin E``
    (fixed-point iteration): in float32, its finite differences at JAX's eps=1e-4 are
    dominated by rounding, as jaxoplanet's orbit tests are at single precision."""
    anomaly = mean_anomaly
    for _ in range(20):
        anomaly = mean_anomaly + e * jnp.sin(anomaly)
    return 10 * jnp.sin(anomaly)


def test_a_float32_step_too_small_is_not_blamed_on_the_derivative():
    """The JVP and the VJP agree; the finite differences move toward them as the step
    grows: the account says it is the step, with the figures, at four more calls of f (the
    check itself shares three of JAX's)."""
    from jax._src import public_test_util

    jax_check = getattr(public_test_util.check_grads, "agcheck_original", public_test_util.check_grads)
    calls = []

    def counted(m):
        calls.append(1)
        return _kepler(m)

    with jax.enable_x64(False):
        m = jnp.linspace(0.1, 2.0, 100)
        assert m.dtype == jnp.float32
        agcheck.check_grads(_kepler, (m,), 1, eps=1e-3)  # a step rounding does not swamp: passes
        with pytest.raises(AssertionError):
            jax_check(counted, (m,), 1)
        by_jax, calls[:] = len(calls), []
        error, account = _failure(counted, (m,))
    assert len(calls) <= by_jax + 4
    assert error.level == "VJP" and account.stage == "projection" and account.kind == "step_size"
    assert account.forward_projection == pytest.approx(account.derived, rel=1e-5)
    (step, at_eps, within), *larger = account.step_errors
    assert step == pytest.approx(1e-4) and not within and [s for s, _, _ in larger] == pytest.approx([1e-3, 1e-2])
    assert min(e for _, e, _ in larger) * 4 <= at_eps
    assert "The step, not the derivative: the JVP and the VJP agree with each other" in account.text
    assert "check with a larger eps (eps=0.001) or in float64" in account.text
    assert "derivative itself is" not in account.text


def test_float32_finite_differences_swamped_by_a_large_value_fail_the_jvp_check_for_the_step():
    def offset(x):  # values near 100 that change by 1e-4 along the tangent: float32 keeps 3 digits of that
        return 100.0 + jnp.sin(x)

    with jax.enable_x64(False):
        x = jnp.linspace(0.1, 1.0, 5)
        agcheck.check_grads(offset, (x,), 1, modes=("fwd",), eps=1e-2)
        _, account = _failure(offset, (x,), modes=("fwd",))
    assert account.stage == "tangent" and account.kind == "step_size"
    assert "the finite differences move toward the JVP as the step grows (largest difference" in account.text


def test_a_wrong_float32_derivative_is_still_the_derivative():
    """The other half: a custom_vjp 1% off in float32. Its finite differences stay where
    they are as the step grows: the derivative itself is off."""
    def vjp_times(c):
        @jax.custom_vjp
        def f(x):
            return 10 * jnp.sin(x)

        f.defvjp(lambda x: (10 * jnp.sin(x), x), lambda x, g: (c * 10 * g * jnp.cos(x),))
        return f

    with jax.enable_x64(False):
        x = jnp.linspace(0.1, 1.0, 100)
        agcheck.check_grads(vjp_times(1.0), (x,), 1, modes=("rev",))
        _, account = _failure(vjp_times(1.01), (x,), modes=("rev",))
    assert account.stage == "projection" and account.kind != "step_size"
    errors = [e for _, e, _ in account.step_errors]
    assert max(errors) < 1.5 * min(errors)
    assert "do not move toward the VJP's projection as the step grows" in account.text
    assert "the derivative itself is." in account.text and "The VJP's projection is 1.01 x" in account.text


# -- a slice, a constant ---------------------------------------------------------------------------

def _tanh_with_jvp(broken):
    f = jax.custom_jvp(jnp.tanh)
    f.defjvp(lambda p, t: (jnp.tanh(p[0]), broken((1 - jnp.tanh(p[0]) ** 2) * t[0])))
    return f


def test_a_jvp_zero_on_a_slice_of_the_output_is_named():
    x = jnp.linspace(0.1, 1.0, 12).reshape(3, 4)
    agcheck.check_grads(_tanh_with_jvp(lambda t: t), (x,), 1, modes=("fwd",))
    _, account = _failure(_tanh_with_jvp(lambda t: t.at[1].set(0.0)), (x,), modes=("fwd",))
    assert account.kind == "missing_slice" and account.step_errors is None
    assert "The JVP is zero on elements [1, ...] of output 0" in account.text
    _, account = _failure(_tanh_with_jvp(lambda t: t + 0.5), (x,), modes=("fwd",))
    assert account.kind == "constant_term" and "finite differences + 0.50 on every element" in account.text
