"""agcheck.numerical_jacobian / analytical_jacobian: the matrices gradcheck compares, public,
on every backend. Correct derivatives give matching matrices; broken ones do not."""
import numpy as np
import pytest
import torch

import agcheck


def _x(*shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=dtype, generator=g).requires_grad_()


def two_outputs(x, w):
    return w @ x.sin(), (x * x).sum()


class _HalfSquare(torch.autograd.Function):
    """x * x with a backward missing its factor 2."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x

    @staticmethod
    def jvp(ctx, t):
        return t * ctx.saved_tensors[0]


def test_torch_layout_matches_torch_conventions_and_modes_agree():
    x, w = _x(3), _x(2, 3, seed=1)
    num = agcheck.numerical_jacobian(two_outputs, (x, w))
    rev = agcheck.analytical_jacobian(two_outputs, (x, w))
    fwd = agcheck.analytical_jacobian(two_outputs, (x, w), mode="forward")
    assert [[tuple(m.shape) for m in row] for row in num] == [[(3, 2), (3, 1)], [(6, 2), (6, 1)]]
    for i in range(2):
        for k in range(2):
            torch.testing.assert_close(num[i][k], rev[i][k])
            torch.testing.assert_close(fwd[i][k], rev[i][k])
    # d(w @ sin x)/dx: row j = cos(x_j) w[:, j]
    expected = (x.detach().cos()[:, None] * w.detach().T)
    torch.testing.assert_close(rev[0][0], expected)
    assert x.grad is None and w.grad is None


def test_a_broken_backward_shows_as_a_different_matrix():
    x = _x(4)
    num = agcheck.numerical_jacobian(_HalfSquare.apply, (x,))[0][0]
    ana = agcheck.analytical_jacobian(_HalfSquare.apply, (x,))[0][0]
    torch.testing.assert_close(num, torch.diag(2 * x.detach()))
    torch.testing.assert_close(ana, torch.diag(x.detach()))


def test_complex_input_rows_are_d_dx_plus_i_d_dy_in_every_mode():
    z = _x(4, dtype=torch.complex128)

    def f(z):
        return (z * z.conj()).real * z.imag

    num = agcheck.numerical_jacobian(f, (z,))[0][0]
    torch.testing.assert_close(agcheck.analytical_jacobian(f, (z,))[0][0], num)
    torch.testing.assert_close(agcheck.analytical_jacobian(f, (z,), mode="forward")[0][0], num)
    zd = z.detach()
    # f = |z|^2 y: df/dx = 2 x y, df/dy = 2 y^2 + |z|^2
    diag = 2 * zd.real * zd.imag + 1j * (2 * zd.imag ** 2 + zd.abs() ** 2)
    torch.testing.assert_close(num, torch.diag(diag), atol=1e-7, rtol=1e-7)


def test_five_point_stencil_and_non_float_outputs():
    x = _x(5)

    def f(x):
        return x.exp(), x.argmax()

    num = agcheck.numerical_jacobian(f, (x,), stencil="five-point")
    assert num[0][1] is None
    torch.testing.assert_close(num[0][0], torch.diag(x.detach().exp()), atol=1e-9, rtol=1e-9)


def test_inputs_and_caller_state_unchanged():
    x = _x(6)
    before = x.detach().clone()
    state = torch.get_rng_state()
    agcheck.numerical_jacobian(lambda t: t.sin(), (x,))
    agcheck.analytical_jacobian(lambda t: t.sin(), (x,), mode="forward")
    assert torch.equal(x.detach(), before) and x.grad is None
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("call, match", [
    (lambda: agcheck.numerical_jacobian(torch.sin, (_x(3),), eps=0.0), "eps must be a positive"),
    (lambda: agcheck.numerical_jacobian(torch.sin, (_x(3),), eps=float("nan")), "eps must be a positive"),
    (lambda: agcheck.analytical_jacobian(torch.sin, (_x(3),), mode="sideways"), "mode must be"),
    (lambda: agcheck.numerical_jacobian(lambda z: z * 2, (_x(3, dtype=torch.complex128),)), "output 0 is complex"),
    (lambda: agcheck.analytical_jacobian(torch.sin, (_x(3).detach(),)), "requires_grad"),
    (lambda: agcheck.numerical_jacobian(torch.sin, (_x(3),), stencil="seven"), "stencil"),
])
def test_bad_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_numpy_backend_with_hand_written_derivatives():
    def f(x, y):
        return np.sin(x) * y, np.sum(x * x)

    def vjp(inputs, cotangents):
        x, y = inputs
        g0, g1 = cotangents
        return np.cos(x) * y * g0 + 2 * x * g1, np.sin(x) * g0

    def bad_vjp(inputs, cotangents):
        x, y = inputs
        g0, g1 = cotangents
        return np.cos(x) * y * g0 + x * g1, np.sin(x) * g0

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(3), rng.standard_normal(3)
    x0 = x.copy()
    num = agcheck.numerical_jacobian(f, (x, y), backend="numpy")
    good = agcheck.analytical_jacobian(f, (x, y), backend="numpy", vjp=vjp)
    bad = agcheck.analytical_jacobian(f, (x, y), backend="numpy", vjp=bad_vjp)
    for i in range(2):
        for k in range(2):
            np.testing.assert_allclose(good[i][k], num[i][k], atol=1e-8)
    assert not np.allclose(bad[0][1], num[0][1], atol=1e-5)
    assert np.array_equal(x, x0)


def test_jax_backend_matches_torch():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    x, w = _x(3), _x(2, 3, seed=1)
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        xj, wj = jnp.asarray(x.detach().numpy()), jnp.asarray(w.detach().numpy())

        def fj(x, w):
            return w @ jnp.sin(x), (x * x).sum()

        num = agcheck.numerical_jacobian(fj, (xj, wj), as_numpy=True)
        rev = agcheck.analytical_jacobian(fj, (xj, wj), as_numpy=True)
        fwd = agcheck.analytical_jacobian(fj, (xj, wj), mode="forward", as_numpy=True)
        ref = agcheck.analytical_jacobian(two_outputs, (x, w), as_numpy=True)
        for i in range(2):
            for k in range(2):
                np.testing.assert_allclose(rev[i][k], ref[i][k], atol=1e-12)
                np.testing.assert_allclose(fwd[i][k], ref[i][k], atol=1e-12)
                np.testing.assert_allclose(num[i][k], ref[i][k], atol=1e-8)
    finally:
        jax.config.update("jax_enable_x64", previous)
