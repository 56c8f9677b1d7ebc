"""The backend contract (agcheck.backends.base), run over every registered backend.

A new backend is added to ``BACKENDS`` below with a way to make its arrays; every test
here then tells it what the core expects of it. Each behaviour is tested on a function
with known derivatives (f(x, y) = (sin(x) * y, sum(x * x))), so that a backend that
returned wrong numbers would fail here, not only deep inside a gradcheck.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest

import agcheck
from agcheck.backends.base import (BATCHED_FORMS, CAPABILITY_METHODS, CORE_METHODS, REQUIRED_METHODS, Backend, Capability,
                                  Perturber, Trace, missing_verbs)
from agcheck.backends.batched_forms import BatchedForms
from agcheck.backends.registry import available_backends, get_backend

from .helpers import tensorflow_or_skip

X = np.array([0.3, -1.2, 0.7, 2.1])
Y = np.array([1.5, 0.4, -0.8, 1.1])


def f_numpy(x, y):
    return np.sin(x) * y, np.sum(x * x)


def f_vjp(inputs, cotangents):
    x, y = inputs
    g0, g1 = cotangents
    return np.cos(x) * y * g0 + 2 * x * g1, np.sin(x) * g0


def f_jvp(inputs, tangents):
    x, y = inputs
    tx, ty = tangents
    return np.cos(x) * y * tx + np.sin(x) * ty, np.sum(2 * x * tx)


def _torch():
    torch = pytest.importorskip("torch")

    def make(a, checked=True):
        return torch.tensor(a, dtype=torch.float64, requires_grad=checked)

    def f(x, y):
        return torch.sin(x) * y, (x * x).sum()

    return get_backend("torch"), make, f


def _jax():
    pytest.importorskip("jax")
    import jax.numpy as jnp

    def make(a, checked=True):
        return jnp.asarray(np.asarray(a, dtype=np.float64))

    def f(x, y):
        return jnp.sin(x) * y, jnp.sum(x * x)

    return get_backend("jax"), make, f


def _numpy():
    def make(a, checked=True):
        return np.array(a, dtype=np.float64)

    return get_backend("numpy", vjp=f_vjp, jvp=f_jvp), make, f_numpy


def _tensorflow():
    tf = tensorflow_or_skip()

    def make(a, checked=True):
        return tf.constant(np.asarray(a, dtype=np.float64))

    def f(x, y):
        return tf.sin(x) * y, tf.reduce_sum(x * x)

    return get_backend("tensorflow"), make, f


def _mlx():
    pytest.importorskip("mlx.core")
    import mlx.core as mx

    def make(a, checked=True):
        return mx.array(np.asarray(a, dtype=np.float64), dtype=mx.float64)

    def sin(x):
        # MLX 0.32 computes float64 sin in float32 (ml-explore/mlx#3047); sin's Taylor series
        # (to x**33, exact in float64 for |x| < 3) keeps these tests to float64 tolerances
        x2, total = x * x, mx.zeros_like(x)
        for k in range(16, -1, -1):
            total = total * x2 + (-1) ** k / math.factorial(2 * k + 1)
        return x * total

    def f(x, y):
        return sin(x) * y, mx.sum(x * x)

    return get_backend("mlx"), make, f


BACKENDS = {"torch": _torch, "jax": _jax, "numpy": _numpy, "tensorflow": _tensorflow, "mlx": _mlx}


def test_every_registered_backend_is_covered_here():
    assert set(available_backends()) <= set(BACKENDS), "add the new backend to BACKENDS"


@pytest.fixture(params=sorted(BACKENDS))
def setup(request):
    be, make, f = BACKENDS[request.param]()
    with _precision(request.param):
        x, y = make(X), make(Y)
        fn, args = be.prepare(f, (x, y))
        yield be, make, fn, args


@contextlib.contextmanager
def _precision(name):
    """Double precision for the test's arrays (JAX: x64 on, the caller's setting restored)."""
    if name != "jax":
        yield
        return
    import jax

    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", before)


def _np(be, a):
    return np.asarray(be.to_numpy(a), dtype=np.float64)


def _overrides(cls, name) -> bool:
    return getattr(cls, name, None) not in (getattr(Backend, name, None), getattr(BatchedForms, name, None))


# -- the declaration ------------------------------------------------------------------------
def test_required_methods_are_implemented(setup):
    be = setup[0]
    assert not missing_verbs(type(be)), f"{be.name} does not implement {missing_verbs(type(be))}"


def test_the_required_core_is_about_twenty_verbs():
    assert len(REQUIRED_METHODS) == 15 and len(CORE_METHODS) == 20
    assert all(callable(getattr(Backend, m)) for m in CORE_METHODS)


def test_declared_capabilities_are_implemented(setup):
    be = setup[0]
    assert set(be.capabilities) <= {v for k, v in vars(Capability).items() if k.isupper()}
    for capability, methods in CAPABILITY_METHODS.items():
        if be.supports(capability):
            missing = [m for m in methods if not _overrides(type(be), m)]
            assert not missing, f"{be.name} lists {capability!r} without {missing}"


class _Partial(Backend):
    """A new backend half written: inspection and random vectors, nothing else."""

    name = "partial"

    def owns(self, x):
        return isinstance(x, np.ndarray)

    is_checked = is_complex = is_floating_or_complex = is_double_precision = owns
    is_differentiable_output = is_bool = owns
    generator = uniform_unit_vector = normal_like = owns


def test_a_backend_missing_required_verbs_is_told_all_of_them_at_once():
    assert missing_verbs(_Partial) == ["trace", "perturber", "jvp", "allclose", "from_numpy"]
    with pytest.raises(TypeError, match="_Partial does not implement the required verbs "
                                        "trace, perturber, jvp, allclose, from_numpy of agcheck's backend contract"):
        agcheck.gradcheck(lambda x: x, (X.copy(),), backend=_Partial())


def test_a_missing_capability_is_refused_with_an_error_naming_the_keyword():
    class Bare(Backend):
        name = "bare"
        capabilities = frozenset(BATCHED_FORMS)

    # the engine's faster paths are one protocol: listing its forms is not enough
    assert not any(Bare().supports(c) for c in BATCHED_FORMS)
    error = Bare().refusal(Capability.FORWARD, "check_forward_ad")
    assert isinstance(error, Exception) and "check_forward_ad" in str(error)


# -- inspection -------------------------------------------------------------------------
def test_inspection(setup):
    be, make, fn, args = setup
    x = args[0]
    assert be.owns(x) and be.is_array(x) and be.is_checked(x)
    assert be.checked_positions(args) == [0, 1]
    assert not be.is_complex(x) and be.is_floating_or_complex(x) and be.is_double_precision(x)
    assert be.numel(x) == 4 and tuple(x.shape) == (4,) and be.layout(x) == "dense"
    assert not be.owns(object())


# -- reverse mode -------------------------------------------------------------------------
def test_trace_vjp_matches_the_known_gradient(setup):
    be, make, fn, args = setup
    trace = be.trace(fn, args, [0, 1])
    np.testing.assert_allclose(_np(be, trace.outputs[0]), np.sin(X) * Y)
    v = make(np.array([1.0, -2.0, 0.5, 3.0]), checked=False)
    gx, gy = trace.vjp([0], [v])
    np.testing.assert_allclose(_np(be, gx), np.cos(X) * Y * _np(be, v), rtol=1e-12)
    np.testing.assert_allclose(_np(be, gy), np.sin(X) * _np(be, v), rtol=1e-12)


def test_vjp_batched_equals_vjps_one_at_a_time(setup):
    be, make, fn, args = setup
    if not be.supports(Capability.BATCHED_GRAD):
        pytest.skip(f"{be.name} does not list {Capability.BATCHED_GRAD!r}")
    trace = be.trace(fn, args, [0, 1])
    cots = [make(np.eye(4)[i], checked=False) for i in range(3)]
    batched = trace.vjp_batched(0, be.xp(cots[0]).stack(cots, axis=0))
    for i, c in enumerate(cots):
        for got, want in zip(batched, trace.vjp([0], [c])):
            np.testing.assert_allclose(_np(be, got[i]), _np(be, want), rtol=1e-12)


def test_undefined_output_gradients_give_zero_or_undefined_gradients(setup):
    be, make, fn, args = setup
    for grad in be.vjp_with_undefined_outputs(fn, args, [0, 1], "all"):
        assert grad is None or not np.any(_np(be, grad))


# -- the numerical side's primitive: perturb and restore ----------------------------------
def test_perturber_moves_one_element_and_restores_bitwise(setup):
    be, make, fn, args = setup
    before = [_np(be, a).copy() for a in args]
    with be.perturber(args, 0) as perturber:
        assert perturber.numel == 4 and perturber.index(2) == (2,)
        plus = perturber.evaluate_element(fn, 2, 1e-3, +1)
        minus = perturber.evaluate_element(fn, 2, 1e-3, -1)
    moved = X.copy()
    moved[2] += 1e-3
    np.testing.assert_allclose(_np(be, plus[0]), np.sin(moved) * Y, rtol=1e-12)
    moved[2] -= 2e-3
    np.testing.assert_allclose(_np(be, minus[0]), np.sin(moved) * Y, rtol=1e-12)
    for a, b in zip(args, before):
        assert np.array_equal(_np(be, a), b)


def test_perturber_element_moves_are_single_moves_and_restore_when_fn_raises(setup):
    be, make, fn, args = setup
    moves = [(1e-3, -1), (1e-3, +1), (2e-3, +1)]
    with be.perturber(args, 0) as perturber:
        together = perturber.evaluate_element_moves(fn, 1, moves)
        one_by_one = [perturber.evaluate_element(fn, 1, step, sign) for step, sign in moves]
    for a, b in zip(together, one_by_one):
        assert np.array_equal(_np(be, a[0]), _np(be, b[0]))  # bit for bit
    calls = []

    def raising_second(*a):
        calls.append(1)
        if len(calls) == 2:
            raise KeyError("from fn")
        return fn(*a)

    with pytest.raises(KeyError):
        with be.perturber(args, 0) as perturber:
            perturber.evaluate_element_moves(raising_second, 1, moves)
    assert np.array_equal(_np(be, args[0]), X)


def test_unit_vjps_are_one_hot_vjps(setup):
    be, make, fn, args = setup
    trace = be.trace(fn, args, [0, 1])
    got = list(trace.unit_vjps(0, [3, 0, 2], be.one_hot))
    assert len(got) == 3
    for j, grads in zip([3, 0, 2], got):
        for g, want in zip(grads, trace.vjp([0], [be.one_hot(trace.outputs[0], j)])):
            assert np.array_equal(_np(be, g), _np(be, want))


def test_perturber_moves_along_a_direction_and_restores_when_fn_raises(setup):
    be, make, fn, args = setup
    step = make(np.array([1e-3, 0.0, -1e-3, 2e-3]), checked=False)
    with be.perturber(args, 0) as perturber:
        out = perturber.evaluate_direction(fn, step, +1)
    np.testing.assert_allclose(_np(be, out[0]), np.sin(X + _np(be, step)) * Y, rtol=1e-12)

    def raising(*a):
        raise KeyError("from fn")

    with pytest.raises(KeyError):
        with be.perturber(args, 0) as perturber:
            perturber.evaluate_direction(raising, step, -1)
    assert np.array_equal(_np(be, args[0]), X)


# -- forward mode -------------------------------------------------------------------------
def test_jvp_matches_the_known_tangent(setup):
    be, make, fn, args = setup
    if not be.supports(Capability.FORWARD):
        pytest.skip(f"{be.name} does not list {Capability.FORWARD!r}")
    tx = make(np.array([1.0, 0.5, -1.0, 2.0]), checked=False)
    ty = make(np.zeros(4), checked=False)
    (p0, t0), (p1, t1) = be.jvp(fn, args, [0, 1], [tx, ty])
    np.testing.assert_allclose(_np(be, t0), np.cos(X) * Y * _np(be, tx), rtol=1e-12)
    np.testing.assert_allclose(float(_np(be, t1)), np.sum(2 * X * _np(be, tx)), rtol=1e-12)
    (t0_wrt, t1_wrt) = be.jvp_wrt(fn, args, 0, tx)
    np.testing.assert_allclose(_np(be, t0_wrt), _np(be, t0), rtol=1e-12)


def test_batched_evaluation_equals_plain_calls(setup):
    be, make, fn, args = setup
    if not be.supports(Capability.BATCHED_EVALUATION):
        pytest.skip(f"{be.name} does not list {Capability.BATCHED_EVALUATION!r}")
    moves = be.element_moves(args[0], [0, 3], 1e-3, -1)
    want = np.stack([X, X])
    want[0, 0] -= 1e-3
    want[1, 3] -= 1e-3
    np.testing.assert_array_equal(_np(be, moves), want)
    outs = be.evaluate_batch(fn, args, 0, moves)
    np.testing.assert_allclose(_np(be, outs[0]), np.sin(want) * Y, rtol=1e-12)
    np.testing.assert_array_equal(_np(be, be.one_hots(args[0], [1, 2])), np.eye(4)[[1, 2]])


def test_batched_jvp_rows_are_jacobian_rows(setup):
    be, make, fn, args = setup
    if not be.supports(Capability.BATCHED_JVP):
        pytest.skip(f"{be.name} does not list {Capability.BATCHED_JVP!r}")
    rows = be.jvp_rows(fn, args, [0, 1], 0, [0, 1, 2, 3])
    np.testing.assert_allclose(_np(be, rows[0]), np.diag(np.cos(X) * Y), rtol=1e-12)
    np.testing.assert_allclose(_np(be, rows[1]).reshape(-1), 2 * X, rtol=1e-12)


def test_second_order_vjp_can_be_differentiated(setup):
    be, make, fn, args = setup
    if not be.supports(Capability.SECOND_ORDER):
        pytest.skip(f"{be.name} does not list {Capability.SECOND_ORDER!r}")
    vjp_of_fn = be.differentiable_vjp(fn, 2, [0], [0])
    v = make(np.array([1.0, -1.0, 2.0, 0.5]))
    w = make(np.zeros(()), checked=False)
    (gx,) = be.as_tuple(vjp_of_fn(args[0], args[1], v, w))
    np.testing.assert_allclose(_np(be, gx), np.cos(X) * Y * _np(be, v), rtol=1e-12)
    # and its own reverse mode: d/dx (cos(x) y v) . u = -sin(x) y v u
    second = be.trace(vjp_of_fn, (args[0], args[1], v, w), [0])
    u = make(np.array([0.5, 1.0, -1.0, 1.0]), checked=False)
    (hx,) = second.vjp([0], [u])
    np.testing.assert_allclose(_np(be, hx), -np.sin(X) * Y * _np(be, v) * _np(be, u), rtol=1e-12)


# -- algebra, randomness, conversion ------------------------------------------------------
def test_allclose_is_torchs_rule_and_fails_on_nan(setup):
    be, make, fn, args = setup
    b = make(np.array([1.0, 2.0, 3.0, 4.0]), checked=False)
    assert be.allclose(b + 0.5e-3, b, rtol=0.0, atol=1e-3)
    assert not be.allclose(b + 2e-3, b, rtol=0.0, atol=1e-3)
    assert be.allclose(b * 1.0009, b, rtol=1e-3, atol=0.0)
    nan = make(np.array([np.nan, 2.0, 3.0, 4.0]), checked=False)
    assert not be.allclose(nan, nan, rtol=1e-3, atol=1e-3)


def test_random_vectors_are_private_and_reproducible(setup):
    be, make, fn, args = setup
    x = args[0]
    global_state = np.random.get_state()
    u1 = be.uniform_unit_vector(x, be.generator(x, 7), real=True)
    u2 = be.uniform_unit_vector(x, be.generator(x, 7), real=True)
    n1 = be.normal_like(x, be.generator(x, 8))
    assert np.array_equal(_np(be, u1), _np(be, u2))
    assert np.all(_np(be, u1) >= 0) and np.isclose(np.linalg.norm(_np(be, u1)), 1.0)
    assert _np(be, n1).shape == (4,)
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state()[1:2], global_state[1:2]))


def test_numpy_conversion_round_trips_on_the_device_of_like(setup):
    be, make, fn, args = setup
    values = np.array([[1.0, 2.0], [3.0, 4.0]])
    a = be.array_like(values, args[0])
    assert be.owns(a) and np.array_equal(_np(be, a), values)
    assert be.same_device(a, args[0])
    np.testing.assert_array_equal(_np(be, be.one_hot(args[0], 1)), np.eye(4)[1])


def test_the_core_algebra_of_the_contract_agrees_with_numpy(setup):
    """The algebra the core writes on ``be.xp(x)`` (the array API), and the few verbs that
    stay the backend's (complex parts, finite-difference combination)."""
    from agcheck.stencil import STENCILS

    be, make, fn, args = setup
    values = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 7.0]])
    a = be.array_like(values, args[0])
    xp = be.xp(a)
    parts = xp.unstack(a, axis=0)
    assert len(parts) == 3 and all(np.array_equal(_np(be, p), v) for p, v in zip(parts, values))
    np.testing.assert_array_equal(_np(be, xp.stack(parts, axis=0)), values)
    np.testing.assert_array_equal(_np(be, xp.concat([a, be.array_like(values[:1], args[0])], axis=0)),
                                  np.concatenate([values, values[:1]]))
    np.testing.assert_array_equal(_np(be, xp.reshape(a, (-1,))), values.reshape(-1))
    np.testing.assert_array_equal(_np(be, xp.permute_dims(a, (1, 0))), values.T)
    np.testing.assert_array_equal(_np(be, xp.zeros_like(a)), np.zeros_like(values))
    assert float(xp.max(xp.abs(a))) == 7.0 and int(xp.count_nonzero(a)) == 6
    assert float(be.max_abs_difference(a, be.array_like(values[::-1].copy(), args[0]))) == 5.0
    np.testing.assert_array_equal(
        np.asarray(be.to_numpy(be.plus_imaginary(a, be.array_like(values[::-1].copy(), args[0])))),
        values + values[::-1] * 1j)
    minus, plus = be.array_like(values[0], args[0]), be.array_like(values[2], args[0])
    np.testing.assert_array_equal(_np(be, be.combine(STENCILS["central"], [minus, plus], 0.5)), values[2] - values[0])


def test_snapshot_unchanged_restore(setup):
    be, make, fn, args = setup
    snap = be.snapshot(args[0])
    assert be.unchanged(args[0], snap)


# -- the whole contract at work: both halves of a gradient check ---------------------------
def test_gradcheck_passes_the_right_derivative_and_fails_a_wrong_one(setup):
    be, make, fn, args = setup
    assert agcheck.gradcheck(fn, args, backend=be)
    if be.name == "numpy":
        def wrong_vjp(inputs, cotangents):
            gx, gy = f_vjp(inputs, cotangents)
            return 2 * gx, gy

        wrong = get_backend("numpy", vjp=wrong_vjp)
        assert agcheck.gradcheck(f_numpy, args, backend=wrong, raise_exception=False) is False
        return
    assert agcheck.gradcheck(lambda x, y: fn(x * 1.0, y), args, backend=be)
    assert agcheck.gradcheck(_with_wrong_gradient(be, fn), args, backend=be, raise_exception=False) is False


MODES = {
    "slow": {},
    "fast": {"fast_mode": True},
    "reference": {"engine": "reference"},
    "forward": {"check_forward_ad": True, "check_backward_ad": False, "check_undefined_grad": False},
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_an_output_that_is_not_an_array_is_refused_in_every_mode(setup, mode):
    """A forgotten ``return`` (None), alone or beside an array, is an error on every
    backend, never a check that passes with nothing compared; the same ``fn`` returning
    its arrays passes."""
    be, make, fn, args = setup
    kw = MODES[mode]
    if "check_forward_ad" in kw and not be.supports(Capability.FORWARD):
        pytest.skip(f"{be.name} does not list {Capability.FORWARD!r}")
    assert agcheck.gradcheck(fn, args, backend=be, **kw)
    for returns in (lambda x, y: None, lambda x, y: (fn(x, y)[0], None)):
        with pytest.raises(agcheck.OutputTypeError, match="NoneType"):
            agcheck.gradcheck(returns, args, backend=be, **kw)


def _with_wrong_gradient(be, fn):
    if be.name == "torch":
        import torch

        class Doubled(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.clone()

            @staticmethod
            def backward(ctx, g):
                return 2 * g

        return lambda x, y: fn(Doubled.apply(x), y)
    if be.name == "tensorflow":
        tf = tensorflow_or_skip()

        @tf.custom_gradient
        def doubled(x):
            return tf.identity(x), lambda g: 2 * g

        return lambda x, y: fn(doubled(x), y)
    if be.name == "mlx":
        import mlx.core as mx

        @mx.custom_function
        def doubled_mlx(x):
            return x

        @doubled_mlx.vjp
        def _(primals, cotangent, output):
            return 2 * cotangent

        return lambda x, y: fn(doubled_mlx(x), y)
    import jax

    @jax.custom_vjp
    def ident(x):
        return x

    ident.defvjp(lambda x: (x, None), lambda _, g: (2 * g,))
    return lambda x, y: fn(ident(x), y)


def test_stacked_evaluation_gives_each_copy_its_own_result(setup):
    be, make, fn, args = setup
    if not be.supports(Capability.STACKED_EVALUATION):
        pytest.skip(f"{be.name} does not list {Capability.STACKED_EVALUATION!r}")
    moves = be.element_moves(args[0], [0, 3], 1e-3, 1)
    want = np.stack([X, X])
    want[0, 0] += 1e-3
    want[1, 3] += 1e-3
    (out,) = be.evaluate_stacked(lambda x, y: (x * x * 3.0,), args, 0, moves)
    np.testing.assert_allclose(_np(be, out), want * want * 3.0, rtol=1e-12)
    # an output that is not the copies' results end to end cannot be split
    with pytest.raises(ValueError):
        be.evaluate_stacked(lambda x, y: ((x * x).sum(),), args, 0, moves)
    # y, which shares x's first dimension, repeated beside the copies: each copy meets y
    (out,) = be.evaluate_stacked(lambda x, y: (x * y,), args, 0, moves, tiled=(1,))
    np.testing.assert_allclose(_np(be, out), want * Y, rtol=1e-12)
    # only an argument that shares the first dimension can be tiled
    with pytest.raises(ValueError):
        be.evaluate_stacked(lambda x, y: (x * y,), (args[0], be.xp(args[1]).reshape(args[1], (2, 2))), 0, moves,
                            tiled=(1,))


# -- the optional protocol: without it the loops give the same verdicts ---------------------
def _loops_only_torch():
    from agcheck.backends.torch_backend import TorchBackend

    class LoopsOnlyTorch(TorchBackend):
        """The torch backend with the engine's faster paths switched off."""

        capabilities = TorchBackend.capabilities - BATCHED_FORMS

    return LoopsOnlyTorch()


@pytest.mark.parametrize("mode", [{}, {"fast_mode": True}, {"check_forward_ad": True}, {"engine": "batched"}])
def test_without_the_batched_protocol_the_verdicts_are_the_same(mode, monkeypatch):
    torch = pytest.importorskip("torch")
    loops = _loops_only_torch()
    used = []
    for name in ("evaluate_batch", "evaluate_stacked", "element_moves", "jvp_rows", "jvp_along"):
        original = getattr(type(loops).__mro__[1], name)  # the torch backend's own
        monkeypatch.setattr(type(loops).__mro__[1], name, lambda *a, _f=original, _n=name, **k: used.append(_n) or _f(*a, **k))
    assert not any(loops.supports(c) for c in BATCHED_FORMS) and loops.supports(Capability.REVERSE)
    x = torch.linspace(-1.0, 2.0, 40, dtype=torch.float64).reshape(8, 5).requires_grad_()

    def right(x):
        return torch.sin(2 * x.exp()), (x * x).sum(dim=1)

    class Halved(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return 0.5 * g

    def wrong(x):
        return right(Halved.apply(x))

    assert agcheck.gradcheck(right, (x,), backend=loops, **mode)
    assert agcheck.gradcheck(wrong, (x,), backend=loops, raise_exception=False, **mode) is False
    assert not used  # the loops alone
    assert agcheck.gradcheck(right, (x,), backend=get_backend("torch"), **mode)
    assert agcheck.gradcheck(wrong, (x,), backend=get_backend("torch"), raise_exception=False, **mode) is False
    if mode == {"engine": "batched"}:
        assert used  # the same verdicts from the batched forms


def test_the_numpy_backend_has_no_batched_protocol_and_gives_both_verdicts():
    be = get_backend("numpy", vjp=f_vjp)
    assert not isinstance(be, BatchedForms) and not any(be.supports(c) for c in BATCHED_FORMS)
    x, y = np.linspace(-1.0, 2.0, 40), np.linspace(0.5, 1.5, 40)
    assert agcheck.gradcheck(f_numpy, (x, y), backend=be)

    def doubled(inputs, cotangents):
        gx, gy = f_vjp(inputs, cotangents)
        return 2 * gx, gy

    assert agcheck.gradcheck(f_numpy, (x, y), backend=get_backend("numpy", vjp=doubled), raise_exception=False) is False


# -- the required core suffices: a backend of the fifteen verbs, checked end to end ----------
class _MiniTrace(Trace):
    def __init__(self, outputs, pullback):
        super().__init__(outputs)
        self.pullback = pullback

    def vjp(self, output_positions, cotangents):
        return [self.pullback(dict(zip(output_positions, cotangents)))]


class _MiniPerturber(Perturber):
    def __init__(self, args, position):
        self.args, self.position = args, position
        self.shape, self.numel = args[position].shape, args[position].size

    def index(self, flat):
        return tuple(int(i) for i in np.unravel_index(flat, self.shape))

    def _call(self, fn, moved):
        args = list(self.args)
        args[self.position] = moved
        return tuple(np.atleast_1d(o) for o in Backend.as_tuple(None, fn(*args)))

    def evaluate_element(self, fn, flat, step, sign):
        moved = self.args[self.position].copy()
        moved.flat[flat] = moved.flat[flat] + step if sign > 0 else moved.flat[flat] - step
        return self._call(fn, moved)

    def evaluate_direction(self, fn, step, sign):
        x = self.args[self.position]
        return self._call(fn, x + step if sign > 0 else x - step)


class _MiniBackend(Backend):
    """A new framework's backend as its author starts it: the fifteen required verbs, for
    one-input, one-output functions of float64 NumPy arrays with a hand-written VJP."""

    name = "mini"
    capabilities = frozenset({Capability.REVERSE})

    def __init__(self, vjp):
        self.vjp_of = vjp

    def owns(self, x):
        return isinstance(x, np.ndarray)

    def is_checked(self, x):
        return self.is_floating_or_complex(x)

    def is_complex(self, x):
        return np.iscomplexobj(x)

    def is_floating_or_complex(self, x):
        return np.issubdtype(x.dtype, np.inexact)

    def is_double_precision(self, x):
        return x.dtype == np.float64

    def is_differentiable_output(self, x):
        return self.is_floating_or_complex(x)

    def is_bool(self, x):
        return x.dtype == np.bool_

    def trace(self, fn, args, checked):
        return _MiniTrace((np.atleast_1d(fn(*args)),), lambda cots: self.vjp_of(args[0], cots[0]))

    @contextlib.contextmanager
    def perturber(self, args, position):
        yield _MiniPerturber(args, position)

    def jvp(self, fn, args, checked, tangents):
        raise NotImplementedError("no forward mode (not listed in capabilities)")

    def allclose(self, a, b, rtol, atol):
        return bool(np.all(np.abs(a - b) <= atol + rtol * np.abs(b)))

    def generator(self, like, seed):
        return np.random.default_rng(seed)

    def uniform_unit_vector(self, like, generator, real):
        v = generator.random(like.size)
        return v / np.linalg.norm(v)

    def normal_like(self, like, generator):
        return generator.standard_normal(like.shape)

    def from_numpy(self, values, *, checked=False, like=None):
        return np.array(values, dtype=None if like is None else like.dtype)


@pytest.mark.parametrize("mode", [{}, {"fast_mode": True}, {"engine": "reference"}])
def test_a_backend_of_the_required_verbs_alone_checks_both_halves(mode):
    assert not missing_verbs(_MiniBackend) and not isinstance(_MiniBackend, BatchedForms)
    x = np.linspace(-1.0, 2.0, 12)
    right = _MiniBackend(lambda x, v: np.cos(x) * v)
    wrong = _MiniBackend(lambda x, v: 2 * np.cos(x) * v)
    mode = {"check_undefined_grad": False, **mode}  # an optional part it does not list
    assert agcheck.gradcheck(np.sin, (x,), backend=right, **mode)
    assert agcheck.gradcheck(np.sin, (x,), backend=wrong, raise_exception=False, **mode) is False
