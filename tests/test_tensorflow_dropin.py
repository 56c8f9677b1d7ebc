"""agcheck in the place of ``tf.test.compute_gradient``: ``agcheck.patch_tensorflow()`` and
``pytest --agcheck-tf`` (issue 61).

The Jacobians are compared with TensorFlow's own function's, called on the same ``f`` and
arguments: the same layout (types, shapes, dtypes) always, the same bits where agcheck
computes them one move (or row) at a time, the same numbers but for rounding where it
stacks or vectorizes.
"""
from __future__ import annotations

import importlib.metadata
import inspect
import logging
import sys

import numpy as np
import pytest

from .helpers import tensorflow_or_skip

pytest_plugins = ["pytester"]

tf = tensorflow_or_skip()

from tensorflow.python.ops import gradient_checker_v2  # noqa: E402
from tensorflow.python.ops.gradient_checker_v2 import compute_gradient as early_compute_gradient  # noqa: E402,F401

import agcheck  # noqa: E402
from agcheck.backends import tensorflow_dropin, tensorflow_jacobians  # noqa: E402
from agcheck.frontends import dropin  # noqa: E402

# TensorFlow's own function, kept in a dict: the patch rebinds module-level names bound to it
TENSORFLOW = {"compute_gradient": tensorflow_dropin.targets()[0][0]}


def theirs(f, xs, **kw):
    return TENSORFLOW["compute_gradient"](f, xs, **kw)


def rand(*shape, seed=0, dtype=tf.float64, complex=False):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(shape)
    if complex:
        values = values + 1j * rng.standard_normal(shape)
    return tf.constant(values, dtype)


def same_layout(a, b) -> None:
    assert type(a) is type(b) is tuple and len(a) == len(b) == 2
    for part_a, part_b in zip(a, b):
        assert type(part_a) is type(part_b) is tuple and len(part_a) == len(part_b)
        for x, y in zip(part_a, part_b):
            assert isinstance(y, np.ndarray) and x.shape == y.shape and x.dtype == y.dtype, (x.shape, y.shape)


def same_bits(a, b) -> None:
    same_layout(a, b)
    for part_a, part_b in zip(a, b):
        for x, y in zip(part_a, part_b):
            assert x.tobytes() == y.tobytes(), np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))


def quaternion_product(a, b):
    w1, x1, y1, z1 = tf.unstack(a, axis=-1)
    w2, x2, y2, z2 = tf.unstack(b, axis=-1)
    return tf.stack([w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2, w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
                     w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2, w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2], axis=-1)


def normalize(q):
    return q / tf.norm(q, axis=-1, keepdims=True)


@tf.custom_gradient
def exp_doubled(x):
    """exp with a gradient twice too large"""
    y = tf.exp(x)
    return y, lambda g: 2 * g * y


W = rand(4, 2, seed=5)

CASES = {
    "python float": (lambda x: x * x, [1.0]),
    "two arguments, matmul": (lambda x, w: tf.tanh(x @ w), [rand(3, 4), W]),
    "float32 quaternions": (quaternion_product, [rand(1, 8, 4, dtype=tf.float32), rand(1, 8, 4, seed=1,
                                                                                        dtype=tf.float32)]),
    "normalize, 40 quaternions": (normalize, [rand(40, 4)]),
    "complex argument and value": (lambda z: z * tf.sin(z), [rand(3, 2, complex=True, dtype=tf.complex128)]),
    "complex argument, real value": (lambda z: tf.math.real(z * z), [rand(5, complex=True, dtype=tf.complex64)]),
    "real and complex arguments": (lambda x, z: tf.complex(x, x) * z,
                                   [rand(4), rand(4, seed=2, complex=True, dtype=tf.complex128)]),
    "float32 argument, float64 value": (lambda x: tf.cast(x, tf.float64) ** 2, [rand(3, dtype=tf.float32)]),
    "an unconnected argument": (lambda x, y: x * 2.0, [rand(3), tf.constant(3.0, tf.float64)]),
    "an empty value": (lambda x: x[:0], [rand(3)]),
    "gather: IndexedSlices gradients": (lambda x: tf.gather(x, [0, 0, 2]) ** 2, [rand(3)]),
    "a scalar value": (lambda x: tf.reduce_sum(x ** 3), [rand(2, 3)]),
    "float16": (tf.sin, [rand(3, 4, dtype=tf.float16)]),
    "an explicit axis (no stack)": (lambda x: tf.reduce_sum(x * x, axis=1), [rand(6, 4)]),
    "mixing the stack's copies": (lambda x: x - tf.reduce_max(x), [rand(6, 4)]),
    "indexing the first axis": (lambda x: x * x[0], [rand(6, 4)]),
    "a wrong custom gradient": (exp_doubled, [rand(5)]),
    "a tf.function": (tf.function(normalize), [rand(2, 4)]),
    "delta given": (normalize, [rand(3, 4)], {"delta": 1e-3}),
}


def within_rounding(a, b, f, xs, delta=1 / 1024) -> None:
    """The same Jacobians but for rounding: a stacked or vectorized evaluation may round
    ``f``'s values (or a gradient) differently by an ulp or so, which a central difference
    divides by ``2 delta``."""
    same_layout(a, b)
    value = np.asarray(tf.convert_to_tensor(f(*xs)).numpy())
    value_eps = np.finfo(value.real.dtype).eps * max(1.0, float(np.abs(value).max(initial=0.0)))
    for part, (part_a, part_b) in enumerate(zip(a, b)):
        for x, y in zip(part_a, part_b):
            x64, y64 = x.astype(np.float64), y.astype(np.float64)
            atol = 16 * np.finfo(x.dtype).eps * max(1.0, float(np.abs(x64).max(initial=0.0)))
            if part == 1:
                atol += 16 * value_eps / delta
            np.testing.assert_allclose(y64, x64, rtol=0, atol=atol)


@pytest.mark.parametrize("name", list(CASES))
def test_the_jacobians_are_tensorflows(name):
    f, xs, *kw = CASES[name]
    kw = kw[0] if kw else {}
    within_rounding(theirs(f, xs, **kw), tensorflow_dropin.compute_gradient(f, xs, **kw), f, xs, **kw)


@pytest.mark.parametrize("name", list(CASES))
def test_one_move_at_a_time_the_jacobians_are_tensorflows_bit_for_bit(name, monkeypatch):
    for threshold in ("STACKED_ROWS", "STACKED_EVALUATIONS", "BATCHED_ROWS", "BATCHED_EVALUATIONS"):
        monkeypatch.setattr(tensorflow_jacobians, threshold, 10 ** 9)
    f, xs, *kw = CASES[name]
    kw = kw[0] if kw else {}
    same_bits(theirs(f, xs, **kw), tensorflow_dropin.compute_gradient(f, xs, **kw))


def test_vectorized_forms_give_tensorflows_numbers(monkeypatch):
    """Where ``f`` takes no stack, larger checks are vectorized (``tf.vectorized_map``):
    the same numbers within rounding; complex arguments and values go through their real
    views."""
    from agcheck.backends import tensorflow_backend as tfb

    calls = {"evaluate_batch": 0, "vjp_batched": 0}

    def spy(cls, name):
        original = getattr(cls, name)

        def counted(*a, **k):
            calls[name] += 1
            return original(*a, **k)

        monkeypatch.setattr(cls, name, counted)

    spy(tfb.TensorFlowBackend, "evaluate_batch")
    spy(tfb.TfTrace, "vjp_batched")
    x = rand(20, 8)
    f = lambda x: tf.tanh(x @ tf.transpose(x))  # noqa: E731 - 400 rows, 160 entries: vectorized
    a, b = theirs(f, [x]), tensorflow_dropin.compute_gradient(f, [x])
    same_layout(a, b)
    for part_a, part_b in zip(a, b):
        np.testing.assert_allclose(part_b[0], part_a[0], rtol=1e-9, atol=1e-12)
    assert calls["evaluate_batch"] and calls["vjp_batched"]
    # complex, vectorized where small
    monkeypatch.setattr(tensorflow_jacobians, "BATCHED_ROWS", 2)
    monkeypatch.setattr(tensorflow_jacobians, "BATCHED_EVALUATIONS", 2)
    monkeypatch.setattr(tensorflow_jacobians, "STACKED_ROWS", 10 ** 9)
    monkeypatch.setattr(tensorflow_jacobians, "STACKED_EVALUATIONS", 10 ** 9)
    calls.update(evaluate_batch=0, vjp_batched=0)
    f, xs = CASES["real and complex arguments"]
    a, b = theirs(f, xs), tensorflow_dropin.compute_gradient(f, xs)
    same_layout(a, b)
    for part_a, part_b in zip(a, b):
        for x, y in zip(part_a, part_b):
            np.testing.assert_allclose(y, x, rtol=1e-12, atol=1e-12)
    assert calls["evaluate_batch"] == 2 and calls["vjp_batched"] == 1


def test_what_cannot_be_stacked_or_vectorized_is_computed_one_move_at_a_time(monkeypatch):
    monkeypatch.setattr(tensorflow_jacobians, "BATCHED_ROWS", 2)
    monkeypatch.setattr(tensorflow_jacobians, "BATCHED_EVALUATIONS", 2)

    def eager_only(x):  # reads .numpy() (no graph), reshapes to its own shape (no stack)
        return tf.reshape(x, [3, 4]) * tf.constant(np.cos(x.numpy()))

    x = rand(3, 4)
    same_bits(theirs(eager_only, [x]), tensorflow_dropin.compute_gradient(eager_only, [x]))


def test_small_checks_call_f_far_less_often():
    """TensorFlow calls ``f`` once per row and twice per argument entry (97 times here);
    agcheck gives ``f`` the stacked copies, in a few calls, where ``f`` takes them."""
    calls = []

    def counted(q):
        calls.append(1)
        return normalize(q)

    x = rand(1, 8, 4, dtype=tf.float32)
    theirs(counted, [x])
    assert len(calls) == 1 + 32 + 64
    calls.clear()
    tensorflow_dropin.compute_gradient(counted, [x])
    assert len(calls) <= 10, len(calls)


def test_errors_are_tensorflows():
    def both(f, x):
        errors = []
        for compute in (TENSORFLOW["compute_gradient"], tensorflow_dropin.compute_gradient):
            with pytest.raises(Exception) as info:
                compute(f, x)
            errors.append((type(info.value), str(info.value)))
        assert errors[0] == errors[1]
        return errors[0]

    assert both(tf.sin, rand(3))[0] is ValueError  # x not a list
    assert both(lambda x: x * 2, [tf.constant([1, 2])]) == (
        AssertionError, "Cannot compute gradient for unsupported type int32 of argument 0")
    assert both(lambda x: tf.cast(x, tf.int32), [rand(2)])[1].endswith("of y")
    assert both(lambda x: (x, x), [rand(2)])[0] is AttributeError  # f returns no tensor


# -- the comparison after each call, and agcheck's report -------------------------------------

def test_a_wrong_gradient_is_logged_and_reported(caplog):
    x = rand(5)
    with caplog.at_level(logging.WARNING, logger="agcheck.tensorflow"):
        result = tensorflow_dropin.compute_gradient(exp_doubled, [x])
    (record,) = [r for r in caplog.records if r.name == "agcheck.tensorflow"]
    assert "Jacobians of argument 0 differ" in record.getMessage()
    assert "tensorflow_report()" in record.getMessage()
    report = dropin.tensorflow_report()
    assert report is not None and "analytical = 2.00 x numerical" in report.summary()
    assert tensorflow_dropin.differs(result)
    # the right gradient: no warning, no report
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="agcheck.tensorflow"):
        right = tensorflow_dropin.compute_gradient(tf.exp, [x])
    assert not [r for r in caplog.records if r.name == "agcheck.tensorflow"]
    assert dropin.tensorflow_report() is None and not tensorflow_dropin.differs(right)
    # an earlier call, by what it returned; a result agcheck did not return
    assert dropin.tensorflow_report(result) is not None
    with pytest.raises(LookupError, match="not one of the last"):
        dropin.tensorflow_report(theirs(tf.exp, [x]))


def test_single_precision_noise_is_not_a_difference(caplog):
    with caplog.at_level(logging.WARNING, logger="agcheck.tensorflow"):
        result = tensorflow_dropin.compute_gradient(quaternion_product, CASES["float32 quaternions"][1])
    assert not [r for r in caplog.records if r.name == "agcheck.tensorflow"]
    assert not tensorflow_dropin.differs(result)


# -- the patch --------------------------------------------------------------------------------

def _all_original() -> bool:
    original = TENSORFLOW["compute_gradient"]
    me = sys.modules[__name__]
    return (tf.test.compute_gradient is original and tf.compat.v2.test.compute_gradient is original
            and gradient_checker_v2.compute_gradient is original and me.early_compute_gradient is original)


def test_the_patch_routes_every_name_and_restores():
    assert _all_original()
    v1 = tf.compat.v1.test.compute_gradient
    me = sys.modules[__name__]
    with agcheck.patch_tensorflow() as patch:
        for f in (tf.test.compute_gradient, tf.compat.v2.test.compute_gradient, gradient_checker_v2.compute_gradient,
                  me.early_compute_gradient):
            assert getattr(f, "agcheck_dropin", None) == "tensorflow"
        assert tf.compat.v1.test.compute_gradient is v1  # TensorFlow 1's function: another one
        assert inspect.signature(tf.test.compute_gradient) == inspect.signature(TENSORFLOW["compute_gradient"])
        with agcheck.patch_tensorflow() as inner:  # nested: the outer patch stays
            tf.test.compute_gradient(tf.sin, [rand(3)])
        assert not inner.active and patch.active and getattr(tf.test.compute_gradient, "agcheck_dropin", None)
        same_bits(theirs(exp_doubled, [rand(2)]), tf.test.compute_gradient(exp_doubled, [rand(2)]))
        assert (patch.checks, patch.failures, inner.checks) == (2, 1, 1)
    assert _all_original()
    handle = agcheck.patch_tensorflow()
    assert tf.test.compute_gradient is not TENSORFLOW["compute_gradient"]
    handle.restore()
    handle.restore()
    assert _all_original() and "tensorflow patch, restored, 0 checks" in repr(handle)
    with pytest.raises(TypeError):
        agcheck.patch_tensorflow(engine="reference")


# -- a TensorFlow suite under pytest --agcheck-tf ------------------------------------------------

SUITE = '''
import numpy as np
import tensorflow as tf


def check(f, xs):
    theoretical, numerical = tf.test.compute_gradient(f, xs)
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, atol=1e-5, rtol=1e-5)


def x():
    return tf.constant([[0.3, -1.2], [0.7, 1.1]], tf.float64)


@tf.custom_gradient
def exp_doubled(v):
    y = tf.exp(v)
    return y, lambda g: 2 * g * y


def test_tanh():
    check(tf.tanh, [x()])


def test_matmul():
    check(lambda a, b: a @ b, [x(), x() + 1])


class TestQuaternions(tf.test.TestCase):
    def test_normalize(self):
        q = tf.constant([[1.0, 2.0, -0.5, 0.3]], tf.float64)
        theoretical, numerical = tf.test.compute_gradient(lambda q: q / tf.norm(q, axis=-1, keepdims=True), [q])
        self.assertAllClose(theoretical, numerical)


def test_broken():
    check(exp_doubled, [x()])


def test_broken_expected():
    theoretical, numerical = tf.test.compute_gradient(exp_doubled, [x()])
    assert not np.allclose(theoretical[0], numerical[0])
'''


def _plugin_args() -> tuple:
    eps = importlib.metadata.entry_points(group="pytest11")
    installed = any(ep.value.startswith("agcheck.frontends.pytest_plugin") for ep in eps)
    return () if installed else ("-p", "agcheck.frontends.pytest_plugin")


def _outcomes(pytester, *args) -> tuple:
    result = pytester.runpytest(*_plugin_args(), "-p", "no:cacheprovider", *args)
    outcomes = {r.nodeid.split("::", 1)[1]: r.outcome for r in result.reprec.getreports("pytest_runtest_logreport")
                if r.when == "call" and r.nodeid.split("::")[-1] != "test_session"}  # tf.test.TestCase's own
    return outcomes, result.stdout.str()


def test_the_suite_passes_and_fails_as_under_tensorflow(pytester):
    pytester.makepyfile(test_suite=SUITE)
    expected = {"test_tanh": "passed", "test_matmul": "passed", "TestQuaternions::test_normalize": "passed",
                "test_broken": "failed", "test_broken_expected": "passed"}
    plain, text = _outcomes(pytester)
    assert plain == expected and "went through agcheck" not in text
    routed, text = _outcomes(pytester, "--agcheck-tf")
    assert routed == expected
    assert "5 tf.test.compute_gradient calls went through agcheck (2 with Jacobians that differ)" in text
    # the failing test's captured log names the difference and how to see agcheck's report
    assert "the theoretical and numerical Jacobians of argument 0 differ" in text
    assert "tensorflow_report()" in text
    pytester.makeini("[pytest]\nagcheck_tf = true\n")
    by_ini, text = _outcomes(pytester)
    assert by_ini == expected and "5 tf.test.compute_gradient calls went through agcheck" in text
    assert _all_original()
