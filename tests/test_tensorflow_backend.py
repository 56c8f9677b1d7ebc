"""The TensorFlow backend: ``agcheck.gradcheck(fn, inputs, backend="tensorflow")``.

Every gradient test has two halves: the correct function passes, and the same function
with a broken derivative (a ``tf.custom_gradient`` scaled, transposed, conjugated, with a
wrong second derivative, ...) fails. ``test_*_equal_compute_gradient`` compare
agcheck's Jacobians with ``tf.test.compute_gradient``'s for the same step;
``test_complex_*_agree_with_torch`` compare the TensorFlow backend's complex Jacobians
with the torch backend's on the same functions (TensorFlow's convention is torch's).
"""
from __future__ import annotations

pytest_plugins = ["pytester"]

import subprocess
import sys
import warnings

import numpy as np
import pytest

from .helpers import tensorflow_or_skip

tf = tensorflow_or_skip()

import agcheck  # noqa: E402
from agcheck import GradcheckError  # noqa: E402

MODES = [pytest.param(False, id="slow"), pytest.param(True, id="fast")]
JACOBIAN = r"Jacobian mismatch for output \d+ with respect to input \d+"
FORWARD_JACOBIAN = r"Jacobian computed with forward mode mismatch for output \d+ with respect to input \d+"


def rand(*shape, seed=0, complex=False):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(shape)
    if complex:
        values = values + 1j * rng.standard_normal(shape)
    return tf.constant(values)


def passes(fn, inputs, **kw):
    return agcheck.gradcheck(fn, inputs, backend="tensorflow", **kw)


def fails(fn, inputs, match, **kw):
    with pytest.raises(GradcheckError, match=match):
        agcheck.gradcheck(fn, inputs, backend="tensorflow", **kw)


def bits(x):
    return np.asarray(x.numpy()).tobytes()


# -- custom gradients: the right one and broken ones ---------------------------------------
def exp_with_gradient(scale=1.0):
    @tf.custom_gradient
    def exp(x):
        y = tf.exp(x)
        return y, lambda g: scale * g * y

    return exp


A = np.array([[1.0, 2.0, 0.5], [-1.0, 0.3, 2.0], [0.7, -0.2, 1.5]])


def matvec_with_gradient(transposed=False):
    a = tf.constant(A)

    @tf.custom_gradient
    def matvec(x):
        def grad(g):
            # right: A^T g; broken: A g (the forgotten transpose)
            return tf.linalg.matvec(a, g, transpose_a=not transposed)

        return tf.linalg.matvec(a, x), grad

    return matvec


def square_with_gradient(conjugated=False):
    @tf.custom_gradient
    def square(z):
        def grad(g):
            # TensorFlow's (and torch's) convention: g * conj(dz^2/dz); broken: no conj
            d = 2 * z
            return g * (d if conjugated else tf.math.conj(d))

        return z * z, grad

    return square


@pytest.mark.parametrize("fast_mode", MODES)
def test_custom_gradient_right_passes_scaled_fails(fast_mode):
    x = rand(4)
    assert passes(exp_with_gradient(), (x,), fast_mode=fast_mode)
    fails(exp_with_gradient(2.0), (x,), "Jacobian mismatch for output 0 with respect to input 0", fast_mode=fast_mode)


@pytest.mark.parametrize("fast_mode", MODES)
def test_custom_gradient_transposed_fails(fast_mode):
    x = rand(3)
    assert passes(matvec_with_gradient(), (x,), fast_mode=fast_mode)
    fails(matvec_with_gradient(transposed=True), (x,), JACOBIAN, fast_mode=fast_mode)


@pytest.mark.parametrize("fast_mode", MODES)
def test_custom_gradient_conjugated_fails(fast_mode):
    z = rand(3, complex=True)
    assert passes(square_with_gradient(), (z,), fast_mode=fast_mode)
    fails(square_with_gradient(conjugated=True), (z,), JACOBIAN, fast_mode=fast_mode)


@pytest.mark.parametrize("fast_mode", MODES)
def test_forward_mode_right_passes_broken_fails(fast_mode):
    # measured (TF 2.21): inside tf.function, ForwardAccumulator derives a custom_gradient's
    # JVP from its gradient function, so a broken gradient breaks forward mode too
    x = rand(3)
    assert passes(lambda x: tf.sin(x) * x, (x,), check_forward_ad=True, check_backward_ad=False, fast_mode=fast_mode)
    assert passes(tf.function(matvec_with_gradient()), (x,), check_forward_ad=True, fast_mode=fast_mode)
    fails(tf.function(matvec_with_gradient(transposed=True)), (x,), FORWARD_JACOBIAN,
          check_forward_ad=True, check_backward_ad=False, fast_mode=fast_mode)
    fails(tf.function(exp_with_gradient(2.0)), (x,), FORWARD_JACOBIAN,
          check_forward_ad=True, check_backward_ad=False, fast_mode=fast_mode)


def test_forward_mode_of_an_eager_custom_gradient_ignores_the_gradient():
    # measured (TF 2.21): eagerly, ForwardAccumulator differentiates the forward
    # computation of a custom_gradient function, not its gradient function; reverse mode
    # is what checks the custom gradient (docs/tensorflow.md)
    x = rand(3)
    assert passes(exp_with_gradient(2.0), (x,), check_forward_ad=True, check_backward_ad=False)
    fails(exp_with_gradient(2.0), (x,), JACOBIAN, check_forward_ad=True)


@pytest.mark.parametrize("fast_mode", MODES)
def test_forward_mode_complex(fast_mode):
    z = rand(3, complex=True)
    f = lambda z: z * z * tf.math.conj(z)  # noqa: E731
    assert passes(f, (z,), check_forward_ad=True, fast_mode=fast_mode)
    fails(tf.function(square_with_gradient(conjugated=True)), (z,), "forward mode",
          check_forward_ad=True, check_backward_ad=False, fast_mode=fast_mode)


def test_message_names_output_and_input():
    x, y = rand(3), rand(3, seed=1)
    broken = exp_with_gradient(3.0)

    def f(x, y):
        return tf.sin(x) * y, broken(y) * x

    with pytest.raises(GradcheckError) as info:
        passes(f, (x, y))
    assert "Jacobian mismatch for output 1 with respect to input 1" in str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert passes(f, (x, y), raise_exception=False) is False


# -- tf.function ---------------------------------------------------------------------------
@pytest.mark.parametrize("fast_mode", MODES)
def test_tf_function(fast_mode):
    @tf.function
    def f(x, w):
        return tf.tanh(tf.linalg.matvec(w, x)), tf.reduce_sum(x * x)

    x, w = rand(3), rand(2, 3, seed=1)
    assert passes(f, (x, w), fast_mode=fast_mode, check_forward_ad=True)
    broken = exp_with_gradient(0.5)
    fails(tf.function(lambda x, w: broken(x) * tf.reduce_sum(w)), (x, w), JACOBIAN, fast_mode=fast_mode)


def test_tf_function_is_not_retraced_for_every_perturbation():
    traces = []

    @tf.function
    def f(x):
        traces.append(1)
        return tf.sin(x)

    assert passes(f, (rand(5),), engine="reference")
    assert len(traces) <= 2


# -- variables and closures ----------------------------------------------------------------
def test_variable_inputs_pass_and_are_restored_bitwise():
    w = tf.Variable(rand(4).numpy())
    before = bits(w)
    assert passes(lambda w: tf.sin(w) * w, (w,), check_forward_ad=True)
    assert bits(w) == before
    fails(lambda w: exp_with_gradient(2.0)(w * 1.0), (w,), JACOBIAN)
    assert bits(w) == before


@pytest.mark.parametrize("engine", ["reference", "batched", "auto"])
def test_closure_over_a_variable_sees_the_move(engine):
    # a module-style function: the variable is read through a closure, and passed as an
    # input so that the check moves it (in place, as torch moves a parameter)
    w = tf.Variable(rand(20).numpy())
    x = rand(20, seed=1)

    def model(_w):
        return tf.tanh(w * x)

    before = bits(w)
    assert passes(model, (w,), engine=engine)
    assert bits(w) == before
    bad = exp_with_gradient(2.0)
    fails(lambda _w: bad(w * 1.0) * x, (w,), JACOBIAN, engine=engine)
    assert bits(w) == before


def test_keras_layer_weights_read_by_the_layer():
    keras = pytest.importorskip("keras")
    layer = keras.layers.Dense(2, dtype="float64", activation="tanh")
    layer.build((None, 3))
    x = tf.constant([[0.3, -1.2, 0.7]], tf.float64)
    kernel, bias = layer.kernel.value, layer.bias.value  # Keras 3 wraps its tf.Variables
    before = bits(kernel), bits(bias)
    assert agcheck.gradcheck(lambda k, b: layer(x), (kernel, bias))
    assert (bits(kernel), bits(bias)) == before


def test_closure_over_a_tensor_is_not_seen():
    # tf.Tensors are immutable: a moved copy is passed, a closure reads the original
    x = rand(3)
    fails(lambda _x: tf.sin(x), (x,), "Numerical gradient for function expected to be zero|" + JACOBIAN)


def test_inputs_unchanged_when_fn_raises():
    w = tf.Variable(rand(4).numpy())
    t = rand(4, seed=1)
    before_w, before_t = bits(w), bits(t)
    calls = []

    def f(w, t):
        calls.append(1)
        if len(calls) == 4:  # during the finite differences, with w moved
            raise KeyError("from fn")
        return tf.sin(w) * t

    with pytest.raises(KeyError):
        passes(f, (w, t), engine="reference")
    assert bits(w) == before_w and bits(t) == before_t


def test_fn_modifying_a_variable_in_place_is_reported_and_restored():
    w = tf.Variable(rand(3).numpy())
    before = bits(w)

    def f(w):
        w.assign_add(tf.ones_like(w))
        return w * 2.0

    with pytest.raises(ValueError, match="modified input 0 in place"):
        passes(f, (w,))
    assert bits(w) == before


# -- several outputs, complex ----------------------------------------------------------------
@pytest.mark.parametrize("fast_mode", MODES)
def test_multiple_outputs(fast_mode):
    x, y = rand(3), rand(3, seed=1)
    assert passes(lambda x, y: (x * y, tf.reduce_sum(tf.sin(x)), tf.cast(x > 0, tf.int32)), (x, y),
                  fast_mode=fast_mode, check_forward_ad=True)
    bad = matvec_with_gradient(transposed=True)
    fails(lambda x, y: (x * y, bad(y)), (x, y), "Jacobian mismatch for output 1 with respect to input 1",
          fast_mode=fast_mode)


@pytest.mark.parametrize("fast_mode", MODES)
def test_complex_functions(fast_mode):
    z, x = rand(3, complex=True), rand(3, seed=1)
    for f in (lambda z, x: z * z * tf.math.conj(z) * tf.cast(x, tf.complex128),
              lambda z, x: tf.math.abs(z) * x,
              lambda z, x: tf.complex(x, x * x) * z,
              lambda z, x: (tf.math.real(z) * x, tf.exp(z))):
        assert passes(f, (z, x), fast_mode=fast_mode, check_forward_ad=True)


def test_complex_convention_is_torchs():
    # measured: the gradient of Im(z) is 1j, and the VJP of z*z*conj(z) with cotangent v
    # is torch's; the backend maps nothing
    z = tf.constant([1 + 2j])
    v = tf.constant([0.5 - 1j])
    with tf.GradientTape() as tape:
        tape.watch(z)
        y = tf.reduce_sum(tf.math.imag(z))
    assert tape.gradient(y, z).numpy()[0] == 1j
    be = agcheck.get_backend("tf")
    fn, args = be.prepare(lambda z: z * z * tf.math.conj(z), (z,))
    (g,) = be.trace(fn, args, [0]).vjp([0], [v])
    np.testing.assert_allclose(g, [-0.5 - 11j])


COMPLEX_PORTS = [
    ("z*z*conj(z)", lambda z: z * z * tf.math.conj(z), lambda z: z * z * z.conj()),
    ("exp(z)*z", lambda z: tf.exp(z) * z, lambda z: z.exp() * z),
    ("abs(z)", lambda z: tf.math.abs(z), lambda z: z.abs()),
    ("real(z)*imag(z)", lambda z: tf.math.real(z) * tf.math.imag(z), lambda z: z.real * z.imag),
    ("1/z", lambda z: 1 / z, lambda z: 1 / z),
]


@pytest.mark.parametrize("name,f_tf,f_torch", COMPLEX_PORTS, ids=[p[0] for p in COMPLEX_PORTS])
def test_complex_jacobians_agree_with_torch(name, f_tf, f_torch):
    torch = pytest.importorskip("torch")
    values = np.array([0.3 + 1.1j, -1.2 + 0.4j, 0.8 - 0.6j])

    def real_parts(f, real, imag):
        # a complex output has two real Jacobians: compare both
        def g(z):
            out = f(z)
            return (real(out), imag(out)) if out.dtype in (tf.complex128, torch.complex128) else out
        return g

    g_tf = real_parts(f_tf, tf.math.real, tf.math.imag)
    g_torch = real_parts(f_torch, torch.real, torch.imag)
    z_tf = tf.constant(values)
    z_torch = torch.tensor(values, requires_grad=True)
    for mode in ("reverse", "forward"):
        a = agcheck.analytical_jacobian(g_tf, (z_tf,), mode=mode, as_numpy=True)
        b = agcheck.analytical_jacobian(g_torch, (z_torch,), mode=mode, as_numpy=True)
        for ma, mb in zip(a[0], b[0]):
            np.testing.assert_allclose(ma, mb, atol=1e-12)
    n_tf = agcheck.numerical_jacobian(g_tf, (z_tf,), as_numpy=True)
    n_torch = agcheck.numerical_jacobian(g_torch, (z_torch,), as_numpy=True)
    for ma, mb in zip(n_tf[0], n_torch[0]):
        np.testing.assert_allclose(ma, mb, atol=1e-9)
    assert agcheck.gradcheck(f_tf, (z_tf,), check_forward_ad=True)
    assert agcheck.gradcheck(f_torch, (z_torch,), check_forward_ad=True)


# -- the numbers against tf.test.compute_gradient ----------------------------------------------
DELTA = 1 / 1024  # compute_gradient's default step


def _compute_gradient(f, x):
    theoretical, numerical = tf.test.compute_gradient(f, [x], delta=DELTA)
    return theoretical[0], numerical[0]


@pytest.mark.parametrize("f", [
    lambda x: tf.stack([tf.reduce_sum(tf.sin(x)), tf.reduce_prod(x)]),
    lambda x: tf.tanh(tf.linalg.matvec(tf.constant(A), x)) * x,
    lambda x: tf.nn.softmax(x) * 3.0,
], ids=["reductions", "matvec", "softmax"])
def test_real_jacobians_equal_compute_gradient(f):
    x = tf.constant([0.3, -1.2, 0.7], tf.float64)
    theoretical, numerical = _compute_gradient(f, x)  # outputs x inputs
    num = agcheck.numerical_jacobian(f, (x,), eps=DELTA)[0][0]  # inputs x outputs
    rev = agcheck.analytical_jacobian(f, (x,))[0][0]
    fwd = agcheck.analytical_jacobian(f, (x,), mode="forward")[0][0]
    assert num.shape == numerical.T.shape
    np.testing.assert_array_equal(num, numerical.T)  # the same differences, bit for bit
    np.testing.assert_allclose(rev, theoretical.T, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(fwd, theoretical.T, rtol=1e-14, atol=1e-15)


def test_complex_jacobians_equal_compute_gradient():
    # compute_gradient splits a complex input into (real, imag) columns; agcheck's row is
    # d/dx + i d/dy (torch's convention): row j = column 2j + 1j * column 2j+1
    z = tf.constant([0.3 + 1.0j, -1.2 + 0.5j])
    f = lambda z: tf.math.real(z * z * tf.math.conj(z)) + tf.math.imag(z)  # noqa: E731
    theoretical, numerical = _compute_gradient(f, z)
    as_complex = lambda m: (m[:, 0::2] + 1j * m[:, 1::2]).T  # noqa: E731
    np.testing.assert_allclose(agcheck.numerical_jacobian(f, (z,), eps=DELTA)[0][0], as_complex(numerical),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(agcheck.analytical_jacobian(f, (z,))[0][0], as_complex(theoretical),
                               rtol=1e-14, atol=1e-14)


def test_a_broken_gradient_differs_from_compute_gradient_as_from_agcheck():
    x = tf.constant([0.3, -1.2, 0.7], tf.float64)
    f = matvec_with_gradient(transposed=True)
    theoretical, numerical = _compute_gradient(f, x)
    assert not np.allclose(theoretical, numerical)
    np.testing.assert_allclose(agcheck.analytical_jacobian(f, (x,))[0][0], theoretical.T)
    np.testing.assert_array_equal(agcheck.numerical_jacobian(f, (x,), eps=DELTA)[0][0], numerical.T)
    fails(f, (x,), JACOBIAN)


# -- gradgradcheck --------------------------------------------------------------------------
def sin_with_gradient(second_order_right=True):
    @tf.custom_gradient
    def sin(x):
        def grad(g):
            d = tf.cos(x)
            # broken: the derivative is right, but it is cut off from x, so its own
            # derivative (the second derivative of sin) comes out as zero
            return g * (d if second_order_right else tf.stop_gradient(d))

        return tf.sin(x), grad

    return sin


@pytest.mark.parametrize("fast_mode", MODES)
def test_gradgradcheck_right_passes_wrong_second_derivative_fails(fast_mode):
    x = rand(4)
    assert agcheck.gradgradcheck(sin_with_gradient(), (x,), fast_mode=fast_mode)
    assert passes(sin_with_gradient(False), (x,), fast_mode=fast_mode)  # first order is right
    with pytest.raises(GradcheckError, match=JACOBIAN):
        agcheck.gradgradcheck(sin_with_gradient(False), (x,), fast_mode=fast_mode)


def test_gradgradcheck_forward_over_reverse_and_tf_function():
    x, w = rand(3), rand(2, 3, seed=1)

    @tf.function
    def f(x, w):
        return tf.tanh(tf.linalg.matvec(w, x))

    assert agcheck.gradgradcheck(f, (x, w), check_fwd_over_rev=True, backend="tf")
    with pytest.raises(GradcheckError, match="forward mode"):
        agcheck.gradgradcheck(sin_with_gradient(False), (x,), check_fwd_over_rev=True, check_rev_over_rev=False,
                              check_undefined_grad=False)


def test_gradgradcheck_complex_and_given_grad_outputs():
    z = rand(3, complex=True)
    assert agcheck.gradgradcheck(lambda z: z * z * tf.math.conj(z), (z,))
    v = rand(3, seed=3, complex=True)
    assert agcheck.gradgradcheck(lambda z: tf.exp(z) * z, (z,), (v,))


# -- the other checks ------------------------------------------------------------------------
def test_undefined_grad_check():
    x = rand(3)

    @tf.custom_gradient
    def ignores_zero_upstream(x):
        # right for every cotangent but zero, where it returns ones
        return tf.sin(x), lambda g: tf.where(tf.reduce_all(g == 0), tf.ones_like(x), g * tf.cos(x))

    assert passes(lambda x: tf.sin(x), (x,), check_undefined_grad=True)
    with pytest.raises(GradcheckError, match="backward not multiplied by grad_output"):
        passes(ignores_zero_upstream, (x,))
    # TensorFlow has no undefined output gradients: they are zero output_gradients, so
    # the undefined-gradient check asks what the grad_output check asks (docs/tensorflow.md)
    be = agcheck.get_backend("tf")
    fn, args = be.prepare(ignores_zero_upstream, (x,))
    (g,) = be.vjp_with_undefined_outputs(fn, args, [0], "all")
    np.testing.assert_array_equal(g, np.ones(3))


def test_nondeterministic_backward_and_gradient_dtype():
    x = rand(3)
    noise = np.random.default_rng(5)

    @tf.custom_gradient
    def noisy(x):
        return tf.sin(x), lambda g: g * tf.cos(x) + tf.constant(noise.standard_normal(3) * 1e-9) * g

    fails(noisy, (x,), "Backward is not reentrant")
    assert passes(noisy, (x,), nondet_tol=1e-6)

    @tf.custom_gradient
    def single_precision(x):
        return tf.sin(x), lambda g: tf.cast(g * tf.cos(x), tf.float32)

    # TensorFlow does not cast a custom gradient to its input's dtype (torch's engine does):
    # torch's phrase for a gradient dtype problem, whatever check_grad_dtypes says
    fails(single_precision, (x,), "Analytical gradient has incorrect size")


def test_unused_inputs_get_undefined_gradients():
    x, y = rand(3), rand(3, seed=1)
    assert passes(lambda x, y: tf.sin(x), (x, y), check_forward_ad=True)
    be = agcheck.get_backend("tensorflow")
    fn, args = be.prepare(lambda x, y: tf.sin(x), (x, y))
    gx, gy = be.trace(fn, args, [0, 1]).vjp([0], [np.ones(3)])
    assert gy is None and gx is not None


@pytest.mark.parametrize("fast_mode", MODES)
def test_batched_grad_and_batched_forward_grad(fast_mode):
    x, y = rand(4), rand(4, seed=1)
    f = lambda x, y: (tf.sin(x) * y, tf.reduce_sum(x * x * y))  # noqa: E731
    assert passes(f, (x, y), check_batched_grad=True, check_batched_forward_grad=True, check_forward_ad=True,
                  fast_mode=fast_mode)
    assert agcheck.gradgradcheck(f, (x, y), check_batched_grad=True)


def test_batched_grad_of_a_backward_that_cannot_be_vectorized_fails():
    @tf.custom_gradient
    def eager_only(x):
        # the backward reads its cotangent's values: fine one at a time, not under vectorized_map
        return tf.sin(x), lambda g: tf.constant(g.numpy()) * tf.cos(x)

    x = rand(3)
    assert passes(eager_only, (x,))
    fails(eager_only, (x,), "While computing batched gradients", check_batched_grad=True)


@pytest.mark.parametrize("engine", ["batched", "auto"])
def test_batched_engine(engine):
    x = rand(40)
    w = rand(40, seed=2)
    assert passes(lambda x: tf.tanh(x) * w + tf.reduce_sum(x), (x,), engine=engine, check_forward_ad=True)
    bad = exp_with_gradient(1.001 + 0.01)
    fails(lambda x: bad(x) * w, (x,), JACOBIAN, engine=engine)


def test_masked_is_refused_naming_the_keyword():
    with pytest.raises(ValueError, match="masked"):
        passes(tf.sin, (rand(3),), masked=True)
    assert passes(tf.sin, (rand(3),), masked=False)


def test_float32_input_warns():
    x = tf.constant([0.5, 1.0], tf.float32)
    with pytest.warns(UserWarning, match="double precision"):
        agcheck.gradcheck(tf.sin, (x,), atol=1e-2, rtol=1e-2, eps=1e-3)


# -- inputs: inference, alias, wrt= ----------------------------------------------------------
def test_inference_alias_and_unknown_names():
    x = rand(3)
    assert agcheck.gradcheck(tf.sin, (x,))  # inferred
    assert agcheck.gradcheck(tf.sin, (x,), backend="tf")
    assert agcheck.infer_backend((x,)).name == "tensorflow"
    assert agcheck.infer_backend((tf.Variable(x),)).name == "tensorflow"
    assert agcheck.get_backend("tf").name == "tensorflow"
    with pytest.raises(ValueError, match="tf = tensorflow"):
        agcheck.get_backend("tensorflw")


def test_inference_does_not_import_tensorflow():
    code = (
        "import sys, numpy as np, agcheck\n"
        "assert agcheck.infer_backend((np.ones(3),)).name == 'numpy'\n"
        "assert 'tensorflow' not in sys.modules, 'inference imported tensorflow'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_which_inputs_are_checked_and_wrt():
    x, y = rand(3), rand(3, seed=1)
    n = tf.constant([1, 2, 3])
    f = lambda x, y, n: tf.sin(x) * y * tf.cast(n, tf.float64)  # noqa: E731
    assert len(agcheck.numerical_jacobian(f, (x, y, n))) == 2  # integer tensors are constants
    assert len(agcheck.numerical_jacobian(f, (x, y, n), wrt=0)) == 1
    assert len(agcheck.numerical_jacobian(f, (x, y, n), wrt=(0, 1))) == 2
    # a named NumPy array or Python float becomes a tf.Tensor (float64)
    assert agcheck.gradcheck(lambda x, s: tf.sin(x) * s, (np.array([0.1, 0.2]), 1.5), backend="tf", wrt=(0, 1))
    with pytest.raises(ValueError, match="wrt names input 2"):
        agcheck.gradcheck(f, (x, y, n), wrt=2)
    with pytest.raises(TypeError, match="wrt must be"):
        agcheck.gradcheck(f, (x, y, n), wrt="x")
    with pytest.raises(ValueError, match="out of range"):
        agcheck.gradcheck(f, (x, y, n), wrt=5)
    with pytest.raises(ValueError, match="floating point or complex tf.Tensor"):
        agcheck.gradcheck(lambda n: tf.cast(n, tf.float64), (n,))


def test_wrt_with_gradgradcheck():
    x, y = rand(3), rand(3, seed=1)
    assert agcheck.gradgradcheck(lambda x, y: tf.sin(x) * y * y, (x, y), wrt=0)


# -- TensorFlow's global state --------------------------------------------------------------
def test_global_state_untouched():
    x = rand(5)

    def draws():
        tf.random.set_seed(1234)
        return tf.random.uniform((3,)).numpy(), tf.random.normal((2,)).numpy()

    tf.random.set_seed(1234)
    first = tf.random.uniform((3,)).numpy()
    assert passes(lambda x: tf.sin(x) * x, (x,), fast_mode=True, check_forward_ad=True)
    second = tf.random.uniform((3,)).numpy()
    want = draws()
    assert np.array_equal(first, want[0]) and not np.array_equal(second, first)
    # the draw after a check is the draw that would have followed without it
    tf.random.set_seed(1234)
    tf.random.uniform((3,))
    assert np.array_equal(tf.random.uniform((3,)).numpy(), second)
    assert tf.executing_eagerly()
    np_state = np.random.get_state()[1].copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert agcheck.gradgradcheck(lambda x: tf.sin(x) * x, (x,))
    assert np.array_equal(np.random.get_state()[1], np_state)


# -- the verbs crosscheck and the frontends use -------------------------------------------
def test_from_numpy_copies_and_takes_like():
    be = agcheck.get_backend("tensorflow")
    values = np.array([1.0, 2.0, 3.0])
    t = be.from_numpy(values, checked=True)
    values[0] = 99.0
    assert be.owns(t) and t.dtype == tf.float64 and t.numpy()[0] == 1.0
    assert be.is_checked(t) and be.checked_positions((t,)) == [0]
    like = tf.constant([1 + 1j], tf.complex64)
    c = be.from_numpy(np.array([0.5, 2.0]), like=like)
    assert c.dtype == tf.complex64 and np.array_equal(c.numpy(), [0.5, 2.0])
    with be.precision(True):
        assert be.from_numpy(np.array([0.1])).dtype == tf.float64
    assert be.framework_version() == tf.__version__
    f = lambda x: tf.sin(x)  # noqa: E731
    assert be.compiled(f) is f


def test_vjp_of_vjp_is_the_second_derivative():
    be = agcheck.get_backend("tensorflow")
    xv, yv = np.array([0.3, -1.2, 0.7]), np.array([1.5, 0.4, -0.8])
    x, y = be.from_numpy(xv), be.from_numpy(yv)
    w = np.array([1.0, -2.0, 0.5])
    cx, cy = np.array([0.5, 1.0, -1.0]), np.array([2.0, 0.0, 1.0])
    f = lambda x, y, n: (tf.sin(x) * y * n,)  # noqa: E731
    got = be.vjp_of_vjp(f, (x, y, 3.0), [0, 1], 0, w, [[cx], [cy]])
    # g_x = 3 w cos(x) y, g_y = 3 w sin(x)
    np.testing.assert_allclose(got[(0, 0)][0], -3 * w * np.sin(xv) * yv * cx)
    np.testing.assert_allclose(got[(0, 1)][0], 3 * w * np.cos(xv) * cx)
    np.testing.assert_allclose(got[(1, 0)][0], 3 * w * np.cos(xv) * cy)
    np.testing.assert_array_equal(got[(1, 1)][0], np.zeros(3))  # g_y does not depend on y
    # a wrong second derivative (cut off by stop_gradient) shows as zeros
    bad = be.vjp_of_vjp(lambda x: sin_with_gradient(False)(x), (x,), [0], 0, w, [[cx]])
    np.testing.assert_array_equal(bad[(0, 0)][0], np.zeros(3))
    right = be.vjp_of_vjp(lambda x: sin_with_gradient()(x), (x,), [0], 0, w, [[cx]])
    np.testing.assert_allclose(right[(0, 0)][0], -w * np.sin(xv) * cx)


def test_vjp_of_vjp_complex_is_torchs():
    torch = pytest.importorskip("torch")
    zv = np.array([0.3 + 1.1j, -1.2 + 0.4j])
    w = np.array([0.5 - 1.0j, 1.0 + 0.25j])
    c = np.array([1.0 + 2.0j, -0.5 + 0.5j])
    be = agcheck.get_backend("tensorflow")
    got = be.vjp_of_vjp(lambda z: z * z * tf.math.conj(z), (be.from_numpy(zv),), [0], 0, w, [[c]])[(0, 0)][0]
    zt = torch.tensor(zv, requires_grad=True)
    (g,) = torch.autograd.grad(zt * zt * zt.conj(), zt, torch.tensor(w), create_graph=True)
    (h,) = torch.autograd.grad(g, zt, torch.tensor(c))
    np.testing.assert_allclose(got, h.numpy(), atol=1e-12)


def test_the_batched_engine_uses_the_batched_forms(monkeypatch):
    from agcheck.backends import tensorflow_backend as tfb

    calls = {"evaluate_batch": 0, "jvp_along": 0, "vjp_batched": 0}

    def spy(cls, name):
        original = getattr(cls, name)

        def counted(*a, **k):
            calls[name] += 1
            return original(*a, **k)

        monkeypatch.setattr(cls, name, counted)

    spy(tfb.TensorFlowBackend, "evaluate_batch")
    spy(tfb.TensorFlowBackend, "jvp_along")
    spy(tfb.TfTrace, "vjp_batched")
    # 160 outputs: the loop of VJPs makes 320 calls, past cost.BATCHED_VJPS_FROM_CALLS
    w = rand(160, 40, seed=3)
    x = rand(40)
    assert passes(lambda x: tf.tanh(tf.linalg.matvec(w, x)), (x,), engine="batched", check_forward_ad=True)
    assert all(calls.values()), calls


def test_a_check_traces_each_batched_form_once():
    """``tf.vectorized_map`` called eagerly traces its function on every call; the backend
    traces each batched form once per check, whatever the batch sizes (before: 5 traces of
    fn in this check, each 15-60 ms for a small function)."""
    traces = []

    def normalize(q):
        if not tf.executing_eagerly():
            traces.append(1)
        return q / tf.norm(q, axis=-1, keepdims=True)

    x = rand(6, 8, 4)
    assert passes(normalize, (x,), engine="batched", check_batched_grad=True)
    assert len(traces) <= 1, len(traces)
    # the broken half: the same check of a wrong gradient fails
    bad = exp_with_gradient(1.01)
    fails(lambda q: bad(normalize(q)), (x,), JACOBIAN, engine="batched")


def test_batched_forms_live_for_one_check():
    be = agcheck.get_backend("tensorflow")
    traces, scale = [], {"value": 2.0}

    def f(x):
        if not tf.executing_eagerly():
            traces.append(1)
        return tf.sin(x) * scale["value"]

    x = rand(5)
    for b in (2, 3, 7):  # batch sizes of a ramp: one trace
        stacked = np.stack([x.numpy() + k for k in range(b)])
        (out,) = be.evaluate_batch(f, (x,), 0, stacked)
        np.testing.assert_allclose(out, np.sin(stacked) * 2.0, rtol=1e-14)
    assert len(traces) == 1
    # the next check traces anew: it sees what f reads at its own time
    scale["value"] = 3.0
    (out,) = agcheck.get_backend("tensorflow").evaluate_batch(f, (x,), 0, stacked)
    np.testing.assert_allclose(out, np.sin(stacked) * 3.0, rtol=1e-14)
    assert len(traces) == 2
    # other arguments are part of the form: new ones, a new form
    (out,) = be.evaluate_batch(lambda x, y: f(x) * y, (x, rand(5, seed=1)), 0, stacked)
    np.testing.assert_allclose(out, np.sin(stacked) * 3.0 * rand(5, seed=1).numpy(), rtol=1e-14)


def test_batched_gradient_form_traced_once_per_trace():
    traced = []

    @tf.custom_gradient
    def square(x):
        def grad(g):
            if not tf.executing_eagerly():
                traced.append(1)
            return 2 * g * x
        return x * x, grad

    be = agcheck.get_backend("tensorflow")
    x = rand(4)
    trace = be.trace(square, (x,), [0])
    for rows in ([0, 1], [2], [0, 1, 2, 3]):
        (grads,) = trace.vjp_batched(0, be.one_hots(trace.outputs[0], rows))
        np.testing.assert_allclose(grads, np.stack([np.eye(4)[r] * 2 * x.numpy() for r in rows]), rtol=1e-14)
    assert len(traced) == 1


# -- the command line and the pytest plugin on TensorFlow ---------------------------------------

TF_MODULE = '''
import tensorflow as tf


def good(x):
    return tf.sin(x) * x


@tf.custom_gradient
def bad(x):
    def grad(g):
        return 2 * g * (tf.cos(x) * x + tf.sin(x))  # twice the right gradient
    return tf.sin(x) * x, grad
'''


@pytest.mark.parametrize("name", ["tensorflow", "tf"])
def test_command_line_checks_a_tensorflow_function_both_halves(name, tmp_path, capsys):
    from agcheck.frontends import cli

    (tmp_path / "tfops.py").write_text(TF_MODULE)
    good = cli.main(["check", f"{tmp_path / 'tfops.py'}:good", "--input", "3x4", "--backend", name, "--plain"])
    out = capsys.readouterr().out
    assert good == 0 and "PASSED" in out, out
    bad = cli.main(["check", f"{tmp_path / 'tfops.py'}:bad", "--input", "5", "--backend", name, "--plain"])
    out = capsys.readouterr().out
    assert bad == 1 and "Jacobian mismatch for output 0 with respect to input 0" in out
    assert "[factor] analytical = 2.00 x numerical" in out


def test_pytest_fixture_runs_on_tensorflow(pytester):
    pytester.makepyfile(test_tf='''
import numpy as np
import tensorflow as tf

def test_sin(agcheck_backend, agcheck):
    assert agcheck_backend == "tensorflow"
    x = tf.constant(np.linspace(-1.0, 1.0, 6))
    assert agcheck.gradcheck(lambda t: tf.sin(t) * t, (x,))

def test_wrong(agcheck):
    @tf.custom_gradient
    def doubled(t):
        return tf.identity(t), lambda g: 2 * g
    agcheck.gradcheck(doubled, (tf.constant([0.5, 1.5], dtype=tf.float64),))
''')
    from .test_pytest_plugin import PLUGIN_ARGS

    result = pytester.runpytest(*PLUGIN_ARGS, "-p", "no:cacheprovider", "--agcheck-backend", "tensorflow")
    result.assert_outcomes(passed=1, failed=1)
    assert "Jacobian mismatch" in result.stdout.str()
