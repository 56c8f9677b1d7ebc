"""crosscheck across torch, JAX and TensorFlow: ports agree, a port whose derivative
differs is flagged, and array-API code is refused on TensorFlow with a clear error."""
import numpy as np
import pytest

import agcheck

from .helpers import tensorflow_or_skip

tf = tensorflow_or_skip()
torch = pytest.importorskip("torch")
jnp = pytest.importorskip("jax.numpy")

X = np.array([0.0, 0.7, -1.3, 2.0])


def test_three_ports_agree_on_values_first_and_second_derivatives():
    ports = {"torch": lambda t: t.sin() * t, "jax": lambda t: jnp.sin(t) * t, "tensorflow": lambda t: tf.sin(t) * t}
    result = agcheck.crosscheck(ports, (X,), order=2)  # backends default to the ports' keys
    assert result.ok and list(result.backends) == ["torch", "jax", "tensorflow"]


PORTS_WITH_KINKS = {
    # torch's abs has slope 0 at 0; this port takes the right-hand slope 1 there
    "abs at its kink": (lambda t: t.abs(), lambda t: tf.where(t >= 0, t, -t)),
    # at the bound torch's maximum splits the gradient (0.5), TF's passes it to x (1)
    "clip at its bound": (lambda t: torch.maximum(t, torch.tensor(0.7, dtype=t.dtype)),
                          lambda t: tf.maximum(t, tf.constant(0.7, dtype=t.dtype))),
}


@pytest.mark.parametrize("name", sorted(PORTS_WITH_KINKS))
def test_a_port_whose_derivative_differs_is_flagged(name):
    torch_port, tf_port = PORTS_WITH_KINKS[name]
    ports = {"torch": torch_port, "tensorflow": tf_port}
    away = np.array([0.3, 1.1, 2.0])  # off the kinks the ports agree
    assert agcheck.crosscheck(ports, (away,)).ok
    with pytest.raises(agcheck.GradcheckError, match="torch and tensorflow disagree on the reverse-mode") as info:
        agcheck.crosscheck(ports, (X,))  # X holds 0 and 0.7
    assert "kink" in str(info.value)


def test_huber_at_its_kink_is_a_second_order_kink_not_a_wrong_side():
    """The quadratic branch up to and including delta (torch) or excluding it (TF): values
    and first derivatives agree everywhere, second derivatives differ at |r| == delta."""
    delta = 0.5

    def torch_huber(r):
        return torch.where(r.abs() <= delta, 0.5 * r * r, delta * (r.abs() - 0.5 * delta))

    def tf_huber(r):
        return tf.where(tf.abs(r) < delta, 0.5 * r * r, delta * (tf.abs(r) - 0.5 * delta))

    ports = {"torch": torch_huber, "tensorflow": tf_huber}
    with pytest.raises(agcheck.GradcheckError) as info:
        agcheck.crosscheck(ports, (np.array([-0.5, 0.2, 3.0]),), order=2, gradcheck=True)
    message = str(info.value)
    assert "input 0 element [0] sits on a kink of the first derivative" in message
    assert "FAILED gradgradcheck (second order)" in message and "cannot decide at a kink" in message
    assert "side with" not in message
    assert agcheck.crosscheck(ports, (np.array([-0.7, 0.2, 3.0]),), order=2, gradcheck=True)


def test_array_api_code_is_refused_on_tensorflow_with_a_clear_error():
    def f(x):
        import array_api_compat

        xp = array_api_compat.array_namespace(x)
        return xp.sin(x)

    with pytest.raises(ValueError, match="give ports instead"):
        agcheck.crosscheck(f, (X,), backends=("torch", "tensorflow"))
