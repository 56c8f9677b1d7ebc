"""crosscheck's conclusions hold: the entry it names is outside tolerance, a kink (first or
second order) is never blamed on one side, every failed gradcheck says which check and
what part of it, a NaN derivative is concluded on, NaN against NaN is reported as such,
``raise_exception=False`` returns the result, and ports that coincide only at the inputs
given are told apart by their values nearby.

Each case is a pair of small hand-written ports (the differences measured between real
port pairs: gelu's tanh default, Huber at its kink, a norm's NaN second derivative at
zero, a quaternion-to-matrix that does not normalise). Both halves each time: the
misbehaving pair caught as described, a well-behaved pair passing or concluded on as
before.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import agcheck
from agcheck import CrosscheckResult, GradcheckError
from agcheck.backend import BackendUnavailableError

torch = pytest.importorskip("torch")


def jax_modules():
    jax = pytest.importorskip("jax")
    try:
        agcheck.get_backend("jax")
    except (BackendUnavailableError, ImportError) as e:  # pragma: no cover - depends on the install
        pytest.skip(f"the jax backend is not available: {e}")
    import jax.numpy as jnp

    return jax, jnp


def failure(ports, inputs, **kwargs) -> str:
    with pytest.raises(GradcheckError) as info:
        agcheck.crosscheck(ports, inputs, **kwargs)
    return str(info.value)


def assert_named_entries_outside_tolerance(result: CrosscheckResult):
    for d in result.disagreements():
        ref, other = complex(d.reference_value), complex(d.other_value)
        assert d.n_bad > 0
        assert (math.isnan(abs(ref)) != math.isnan(abs(other))
                or abs(other - ref) > result.atol + result.rtol * abs(ref)), d


# -- the entry named is outside tolerance --------------------------------------------------------


def test_the_entry_named_is_the_worst_outside_tolerance_not_the_largest_difference():
    """[0] differs by 1e-2 on a value of 1e6 (within rtol=1e-7); [1] by 1e-6 on 1e-3 (outside)."""
    x = np.array([1e6, 1e-3, 5.0])
    ports = {"torch": lambda x: x * 1, "numpy": lambda x: x + np.array([1e-2, 1e-6, 0.0])}
    result = agcheck.crosscheck(ports, (x,), backends=("torch", "numpy"), check_backward_ad=False,
                                check_forward_ad=False, raise_exception=False)
    (d,) = result.disagreements()
    assert d.where == "output 0 element [1]" and d.n_bad == 1
    assert d.max_abs == pytest.approx(1e-2) and d.difference == pytest.approx(1e-6)
    assert d.largest_where == "output 0 element [0]"
    assert_named_entries_outside_tolerance(result)
    message = result.message
    assert "difference 1e-06 (allowed 2e-10) at output 0 element [1]: torch gives 0.001" in message
    assert "The largest absolute difference, 0.01 at output 0 element [0], is within tolerance there." in message
    assert "DIFFER (1/3 entries) at output 0 element [1]" in str(result)


def test_the_largest_difference_is_named_when_it_is_the_worst():
    x = np.array([1.0, 2.0, 3.0])
    ports = {"torch": lambda x: x * 1, "numpy": lambda x: x + np.array([0.0, 1e-3, 1e-6])}
    result = agcheck.crosscheck(ports, (x,), backends=("torch", "numpy"), check_backward_ad=False,
                                check_forward_ad=False, raise_exception=False)
    (d,) = result.disagreements()
    assert d.where == "output 0 element [1]" and d.largest_where == ""
    assert "Largest difference 0.001 at output 0 element [1]" in result.message


def test_gelu_exact_against_tanh_names_entries_outside_tolerance():
    """jax.nn.gelu approximates with tanh by default; torch's gelu is exact."""
    jax, jnp = jax_modules()
    x = np.linspace(-3.0, 3.0, 7)
    ports = {"torch": torch.nn.functional.gelu, "jax": jax.nn.gelu}
    result = agcheck.crosscheck(ports, (x,), raise_exception=False, gradcheck=True)
    assert not result and {d.quantity for d in result.disagreements()} == {"value", "reverse", "forward"}
    assert_named_entries_outside_tolerance(result)
    assert "each port's derivatives agree with finite differences of its own function" in result.message
    assert "side with" not in result.message
    # the exact form on both sides agrees
    assert agcheck.crosscheck({"torch": torch.nn.functional.gelu,
                               "jax": lambda x: jax.nn.gelu(x, approximate=False)}, (x,))


# -- kinks: frameworks choose, finite differences cannot decide ------------------------------------


def test_a_kink_is_not_blamed_on_one_side():
    """abs at 0 (torch: sign(0) = 0; this port: 1). gradcheck fails on the port whose
    subgradient is not the central difference's mean; that does not make it wrong."""
    x = np.array([-1.5, 0.0, 2.0])
    vjp = {"numpy": {"vjp": lambda i, c: (np.where(i[0] >= 0, 1.0, -1.0) * c[0],)}}
    message = failure({"torch": torch.abs, "numpy": np.abs}, (x,), backends=("torch", "numpy"),
                      check_forward_ad=False, gradcheck=True, backend_options=vjp)
    assert "sits on a kink" in message
    assert "numpy: FAILED gradcheck (reverse mode)" in message
    assert "finite differences cannot decide at a kink" in message
    assert "side with" not in message and "wrong ones" not in message


def test_a_wrong_derivative_away_from_kinks_is_blamed():
    x = np.array([-1.5, 0.5, 2.0])
    vjp = {"numpy": {"vjp": lambda i, c: (2.0 * np.sign(i[0]) * c[0],)}}
    message = failure({"torch": torch.abs, "numpy": np.abs}, (x,), backends=("torch", "numpy"),
                      check_forward_ad=False, gradcheck=True, backend_options=vjp)
    assert "kink" not in message
    assert "finite differences side with torch: numpy failed gradcheck (reverse mode)" in message


def test_torch_jax_kink_is_not_blamed_on_one_side():
    jax, jnp = jax_modules()
    message = failure({"torch": torch.abs, "jax": jnp.abs}, (np.array([-1.0, 0.0, 2.0]),), gradcheck=True)
    assert "sits on a kink" in message and "cannot decide at a kink" in message
    assert "side with" not in message


def huber_ports(delta: float):
    """The Huber loss written twice: the quadratic branch up to and including ``delta``
    (as torch's own), and up to but excluding it. Values and first derivatives agree
    everywhere; at ``|r| == delta`` the second derivatives are 1 and 0."""
    _, jnp = jax_modules()

    def torch_huber(r):
        return torch.where(r.abs() <= delta, 0.5 * r * r, delta * (r.abs() - 0.5 * delta))

    def jax_huber(r):
        return jnp.where(jnp.abs(r) < delta, 0.5 * r * r, delta * (jnp.abs(r) - 0.5 * delta))

    return {"torch": torch_huber, "jax": jax_huber}


def test_huber_at_its_kink_second_order_names_gradgradcheck_and_the_kink():
    ports = huber_ports(1.0)
    r = np.array([0.3, 1.0, -2.0])
    assert agcheck.crosscheck(ports, (r,))  # first order agrees, at the kink too
    message = failure(ports, (r,), order=2, gradcheck=True)
    assert "disagree on the second derivative of output 0 with respect to input 0 and input 0 [second]" in message
    assert ("input 0 element [1] sits on a kink of the first derivative of output 0 element [1] with respect "
            "to input 0 element [1]: its one-sided slopes there are 1 (left) and 0 (right)") in message
    assert "FAILED gradgradcheck (second order)" in message
    assert "cannot decide at a kink" in message and "side with" not in message
    assert "[kink]" in message  # in the table's row too
    # away from the kink the ports agree in second order
    result = agcheck.crosscheck(ports, (np.array([0.3, 1.5, -2.0]),), order=2, gradcheck=True)
    assert result and result.gradchecks == {"torch": "passed (gradcheck and gradgradcheck)",
                                            "jax": "passed (gradcheck and gradgradcheck)"}


def test_a_second_order_difference_off_kinks_is_blamed():
    """A JAX custom_vjp whose backward is not differentiable: zero second derivatives."""
    jax, jnp = jax_modules()

    @jax.custom_vjp
    def cube(x):
        return x ** 3

    cube.defvjp(lambda x: (cube(x), x), lambda x, g: (jax.lax.stop_gradient(3 * x ** 2) * g,))
    message = failure({"torch": lambda x: x ** 3, "jax": cube}, (np.array([0.5, -1.0, 2.0]),),
                      check_forward_ad=False, order=2, gradcheck=True)
    assert "kink" not in message
    assert "jax: FAILED gradgradcheck (second order)" in message
    assert ("finite differences side with torch: jax failed gradgradcheck (second order), so the second "
            "derivatives of jax are the wrong ones") in message
    assert "The values also agree at nearby inputs" in message


# -- which check failed ---------------------------------------------------------------------------


def test_a_failed_forward_mode_gradcheck_says_forward_mode():
    x = np.linspace(0.2, 1.0, 3)
    options = {"numpy": {"vjp": lambda i, c: (np.cos(i[0]) * c[0],),
                         "jvp": lambda i, t: (2 * np.cos(i[0]) * t[0],)}}
    result = agcheck.crosscheck({"torch": torch.sin, "numpy": np.sin}, (x,), backends=("torch", "numpy"),
                                gradcheck=True, backend_options=options, raise_exception=False)
    assert [d.quantity for d in result.disagreements()] == ["forward"]
    verdict = result.gradcheck_results["numpy"]
    assert (verdict.status, verdict.failed_check, verdict.kind) == ("failed", "gradcheck", "forward mode")
    assert "numpy: FAILED gradcheck (forward mode): " in result.message
    assert "forward-mode derivatives of numpy are the wrong ones" in result.message
    assert result.gradcheck_results["torch"].status == "passed"


# -- a NaN derivative ------------------------------------------------------------------------------


def test_a_nan_second_derivative_is_concluded_on():
    """|v|^2 through torch's vector norm: first derivative 0 at the zero vector, second NaN
    (as roma's rotation vector at zero); the JAX port sum(v * v) gives 2."""
    jax, jnp = jax_modules()
    ports = {"torch": lambda v: torch.linalg.vector_norm(v) ** 2, "jax": lambda v: jnp.sum(v * v)}
    result = agcheck.crosscheck(ports, (np.zeros(3),), order=2, gradcheck=True, raise_exception=False)
    assert [d.quantity for d in result.disagreements()] == ["second"]
    verdict = result.gradcheck_results["torch"]
    assert (verdict.failed_check, verdict.nan) == ("gradgradcheck", True)
    assert "(its analytical derivative has NaN entries)" in result.gradchecks["torch"]
    message = result.message
    assert ("finite differences side with jax: torch failed gradgradcheck (second order), so the second "
            "derivatives of torch are the wrong ones") in message
    assert "Its second derivative is NaN (at output 0 (a scalar), gradient of input 0 element [0]" in message
    # away from zero both ports are right and agree
    assert agcheck.crosscheck(ports, (np.array([0.3, -1.0, 2.0]),), order=2, gradcheck=True)


# -- NaN against NaN ------------------------------------------------------------------------------


def test_nan_against_nan_is_reported_as_both_nan_and_agrees():
    x = np.array([-1.0, 2.0])
    vjp = {"numpy": {"vjp": lambda i, c: (c[0] / i[0],)}}
    result = agcheck.crosscheck({"torch": torch.log, "numpy": np.log}, (x,), backends=("torch", "numpy"),
                                check_forward_ad=False, backend_options=vjp)
    value = next(d for d in result.differences if d.quantity == "value")
    assert value.ok and value.both_nan == 1 and value.max_abs == 0.0
    row = next(line for line in str(result).splitlines() if line.strip().startswith("value"))
    assert "ok (both NaN at 1/2 entries)" in row and " nan " not in row
    # a block that is NaN everywhere on both sides says so in place of its largest difference
    everywhere = agcheck.crosscheck({"torch": torch.log, "numpy": np.log}, (np.array([-1.0, -2.0]),), backends=("torch", "numpy"),
                                    check_backward_ad=False, check_forward_ad=False)
    assert "both NaN  ok (both NaN at 2/2 entries)" in str(everywhere)


def test_nan_against_a_number_disagrees():
    x = np.array([-1.0, 2.0])
    ports = {"torch": torch.log, "numpy": lambda x: np.log(np.abs(x))}
    result = agcheck.crosscheck(ports, (x,), backends=("torch", "numpy"), check_backward_ad=False,
                                check_forward_ad=False, raise_exception=False)
    (d,) = result.disagreements()
    assert d.where == "output 0 element [0]" and d.both_nan == 0
    assert math.isnan(d.reference_value) and d.other_value == 0.0


def test_infinities_of_different_sign_disagree_and_equal_ones_agree():
    x = np.array([0.0, 1.0])
    same = agcheck.crosscheck({"torch": torch.log, "numpy": np.log}, (x,), backends=("torch", "numpy"),
                              check_backward_ad=False, check_forward_ad=False)
    assert same and next(iter(same.differences)).max_abs == 0.0
    result = agcheck.crosscheck({"torch": torch.log, "numpy": lambda x: -np.log(x) * np.array([1.0, 0.0])}, (x,),
                                backends=("torch", "numpy"), check_backward_ad=False, check_forward_ad=False,
                                raise_exception=False)
    (d,) = result.disagreements()
    assert d.where == "output 0 element [0]" and d.n_bad == 1


# -- ports that coincide only at the inputs given --------------------------------------------------


def normalise_torch(x):
    return x / torch.linalg.vector_norm(x)


def test_ports_that_coincide_only_on_unit_vectors_are_told_apart():
    """One port normalises its input, the other assumes it is normalised: equal values at
    a unit vector, different Jacobians (I - x x^T against I), both right for their own
    function."""
    x = np.array([0.6, 0.0, -0.8])
    options = {"numpy": {"vjp": lambda i, c: (c[0],)}}
    result = agcheck.crosscheck({"torch": normalise_torch, "numpy": lambda x: x * 1}, (x,),
                                backends=("torch", "numpy"), check_forward_ad=False, gradcheck=True,
                                backend_options=options, raise_exception=False)
    assert [d.quantity for d in result.disagreements()] == ["reverse"]
    assert [d.ok for d in result.nearby] == [False]
    message = result.message
    assert "The values agree at the inputs given but not at nearby ones" in message
    assert "The ports are different functions that coincide at these inputs" in message
    assert "the ports are different functions (their values differ)" in message
    assert "at nearby inputs" in str(result)


def test_ports_of_one_function_with_different_derivatives_are_not_called_different_functions():
    x = np.array([0.6, 0.0, -0.8])
    options = {"numpy": {"vjp": lambda i, c: (np.cos(i[0]) * c[0] * 1.001,)}}
    result = agcheck.crosscheck({"torch": torch.sin, "numpy": np.sin}, (x,), backends=("torch", "numpy"),
                                check_forward_ad=False, backend_options=options, raise_exception=False)
    assert [d.ok for d in result.nearby] == [True]
    assert "The values also agree at nearby inputs" in result.message
    assert "different functions" not in result.message
    # agreeing ports: nothing is compared nearby
    assert agcheck.crosscheck({"torch": torch.sin, "numpy": np.sin}, (x,), backends=("torch", "numpy"),
                              check_forward_ad=False,
                              backend_options={"numpy": {"vjp": lambda i, c: (np.cos(i[0]) * c[0],)}}).nearby == []


def quaternion_matrix(xp, q, normalise: bool):
    if normalise:
        q = q / xp.sqrt(xp.sum(q * q))
    w, x, y, z = q[0], q[1], q[2], q[3]
    return xp.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
                     2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
                     2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)])


def test_quaternion_port_that_does_not_normalise():
    jax, jnp = jax_modules()
    q = np.array([0.5, 0.5, -0.5, 0.5])  # a unit quaternion
    ports = {"torch": lambda q: quaternion_matrix(torch, q, True), "jax": lambda q: quaternion_matrix(jnp, q, False)}
    message = failure(ports, (q,), gradcheck=True)
    assert "value    output 0" in message and "The values agree at the inputs given but not at nearby ones" in message
    assert "torch: passed; jax: passed" in message and "side with" not in message
    # both normalising: the same function, agreeing everywhere
    assert agcheck.crosscheck({"torch": ports["torch"], "jax": lambda q: quaternion_matrix(jnp, q, True)}, (q,))


# -- float32: no kink is made of rounding ----------------------------------------------------------


def test_float32_smooth_disagreement_is_not_a_kink():
    x = np.linspace(-2.0, 2.0, 9).astype(np.float32)
    options = {"numpy": {"vjp": lambda i, c: ((1 - np.tanh(i[0]) ** 2) * c[0] * 1.01,)}}
    result = agcheck.crosscheck({"torch": torch.tanh, "numpy": np.tanh}, (x,), backends=("torch", "numpy"),
                                check_forward_ad=False, backend_options=options, raise_exception=False)
    assert result.disagreements() and not any(d.kink for d in result.disagreements())
    kinked = agcheck.crosscheck({"torch": torch.abs, "numpy": np.abs}, (x,), backends=("torch", "numpy"),
                                check_forward_ad=False, raise_exception=False,
                                backend_options={"numpy": {"vjp": lambda i, c: (np.where(i[0] >= 0, 1, -1).astype(np.float32) * c[0],)}})
    assert [bool(d.kink) for d in kinked.disagreements()] == [True]
