"""The analytical Jacobian by forward mode (``agcheck.engine.forward_jacobian``): taken when
the outputs far outnumber the inputs, and only once random VJPs tie the backward to it;
every backward it cannot tie goes back to the VJPs and gets torch's verdict."""

import pytest
import torch

import agcheck
from agcheck.engine import forward_jacobian
from .helpers import busy, run_check as run, tensorflow_or_skip


@pytest.fixture(autouse=True)
def _engine_always_runs(monkeypatch):
    """The engine runs however few calls the loop would make."""
    from agcheck.engine import cost

    monkeypatch.setattr(cost, "ENGINE_FROM_CALLS", 0)


N_IN, N_OUT = 40, 320


def _matrix():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(N_OUT, N_IN, dtype=torch.float64, generator=g) / 6
    a[:, :5][torch.rand(N_OUT, 5, generator=g) < 0.5] = 0  # zeros the pattern can show
    return a


A = _matrix()
ZERO_OUT, ZERO_IN = (int(i) for i in (A == 0).nonzero()[0])


def _tanh_of_a(backward_scale=1.0, stray=0.0, jvp_scale=1.0, drift=0.0, both_scale=1.0, with_jvp=True):
    """``tanh(A x)`` with its own backward and JVP; ``backward_scale`` scales one input
    element's gradient, ``stray`` adds an output element's cotangent to an input element it
    does not depend on, ``jvp_scale`` scales the JVP, ``drift`` makes the backward not
    reentrant, ``both_scale`` scales backward and JVP alike (they agree, and are wrong);
    without ``with_jvp`` it has no forward-mode formula."""
    calls = [0]

    class TanhOfA(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x):
            return torch.tanh(A @ x)

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(output)
            ctx.save_for_forward(output)

        @staticmethod
        def backward(ctx, gy):
            (y,) = ctx.saved_tensors
            calls[0] += 1
            gx = A.T @ (gy * (1 - y * y)) * both_scale * (1 + drift * calls[0])
            scale = torch.ones(N_IN, dtype=gx.dtype)
            scale[3] = backward_scale
            gx = gx * scale
            if stray:
                gx = gx + torch.nn.functional.one_hot(torch.tensor(ZERO_IN), N_IN).to(gx) * gy[..., ZERO_OUT, None] * stray
            return gx

        @staticmethod
        def jvp(ctx, tx):
            (y,) = ctx.saved_tensors
            return (1 - y * y) * (A @ tx) * jvp_scale * both_scale

    if not with_jvp:
        del TanhOfA.jvp  # torch.autograd.Function's own: forward mode is not implemented
    return TanhOfA.apply


def _x(dtype=torch.float64):
    return torch.randn(N_IN, dtype=dtype, generator=torch.Generator().manual_seed(1)).requires_grad_()




def forward_log(r):
    return [(e.decision, e.detail) for e in r.engine_log if e.path == "forward"]


def torch_verdict(fn, inputs, **kw):
    return torch.autograd.gradcheck(fn, inputs, raise_exception=False, **kw)


def _upsampler():
    """conv 3x3 to 4 channels, tanh, pixel shuffle: a 6x6 image to 12x12 (4x the outputs)."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(4, 1, 3, 3, dtype=torch.float64, generator=g) * 0.5

    def fn(x):
        return torch.nn.functional.pixel_shuffle(torch.tanh(torch.nn.functional.conv2d(x, w, padding=1)), 2)

    return fn, torch.randn(1, 1, 6, 6, dtype=torch.float64, generator=g).requires_grad_()


@pytest.mark.parametrize("case", ["tanh of A", "custom tanh of A", "upsampler"])
def test_correct_functions_with_many_outputs_pass_by_forward_mode(case):
    if case == "upsampler":
        fn, x = _upsampler()
    else:
        fn, x = (lambda t: torch.tanh(A @ t)) if case == "tanh of A" else _tanh_of_a(), _x()
    before = x.detach().clone()
    r = run(fn, (x,))
    assert r.verdict is True and torch_verdict(fn, (x,)) is True
    assert forward_log(r) == [("passed", "")]
    assert not r.engine_fallbacks
    assert torch.equal(x.detach(), before)


@pytest.mark.parametrize("bug", ["scaled input", "stray entry", "stray entry of 2 atol"])
def test_broken_backwards_are_not_tied_and_fail_like_torch(bug):
    fn = {"scaled input": _tanh_of_a(backward_scale=1.01), "stray entry": _tanh_of_a(stray=0.01),
          "stray entry of 2 atol": _tanh_of_a(stray=2e-5)}[bug]
    r = run(fn, (_x(),))
    assert r.verdict is False and torch_verdict(fn, (_x(),)) is False
    assert forward_log(r) == [("disagreement", "output 0, input 0: projections differ")]
    with pytest.raises(agcheck.GradcheckError, match="Jacobian mismatch for output 0 with respect to input 0"):
        agcheck.gradcheck(fn, (_x(),))


def test_a_stray_entry_within_atol_passes_like_torch():
    fn = _tanh_of_a(stray=5e-6)  # below atol = 1e-5: torch passes; the projections see it
    r = run(fn, (_x(),))
    assert r.verdict is True and torch_verdict(fn, (_x(),)) is True
    assert forward_log(r) == [("disagreement", "output 0, input 0: projections differ")]


def test_a_wrong_jvp_leaves_a_right_backward_to_the_vjps():
    fn = _tanh_of_a(jvp_scale=1.01)  # reverse mode is right; torch checks only it
    r = run(fn, (_x(),))
    assert r.verdict is True and torch_verdict(fn, (_x(),)) is True
    assert forward_log(r) == [("disagreement", "output 0, input 0: projections differ")]


def test_backward_and_jvp_wrong_alike_are_tied_and_fail_on_the_numerical_side():
    fn = _tanh_of_a(both_scale=1.01)
    r = run(fn, (_x(),))
    assert r.verdict is False and torch_verdict(fn, (_x(),)) is False
    assert forward_log(r) == [("passed", "")]  # tied: the mismatch is the backward's own
    with pytest.raises(agcheck.GradcheckError, match="Jacobian mismatch for output 0 with respect to input 0"):
        agcheck.gradcheck(fn, (_x(),))


def test_a_backward_that_is_not_reentrant_is_not_tied_and_raises_torchs_error():
    r = run(_tanh_of_a(drift=1e-3), (_x(),))
    assert r.verdict is False
    assert forward_log(r) == [("disagreement", "backward not reentrant on the projections")]
    with pytest.raises(agcheck.GradcheckError, match="Backward is not reentrant"):
        agcheck.gradcheck(_tanh_of_a(drift=1e-3), (_x(),))
    with pytest.raises(RuntimeError, match="Backward is not reentrant"):
        torch.autograd.gradcheck(_tanh_of_a(drift=1e-3), (_x(),))


@pytest.mark.parametrize("drift, verdict", [(1e-13, True), (1e-8, False)])
def test_a_drift_is_judged_against_nondet_tol_like_torch(drift, verdict):
    """Entries of about 0.1 drifting by ``drift`` relative per call, with nondet_tol 1e-9:
    within it, forward mode stands in; beyond it, torch's reentrancy error."""
    kw = {"nondet_tol": 1e-9}
    r = run(_tanh_of_a(drift=drift), (_x(),), **kw)
    assert r.verdict is verdict is torch_verdict(_tanh_of_a(drift=drift), (_x(),), **kw)
    if verdict:
        assert forward_log(r) == [("passed", "")]
    else:
        with pytest.raises(agcheck.GradcheckError, match="Backward is not reentrant"):
            agcheck.gradcheck(_tanh_of_a(drift=drift), (_x(),), **kw)


def test_a_function_without_forward_mode_is_left_to_the_vjps():
    r = run(_tanh_of_a(with_jvp=False), (_x(),))
    assert r.verdict is True
    [(decision, detail)] = forward_log(r)
    assert decision == "declined" and "jvp" in detail.lower()


@pytest.mark.parametrize("why", ["float32", "atol 0", "outputs not many more"])
def test_forward_mode_is_not_tried_where_it_cannot_stand_in(why):
    if why == "outputs not many more":
        r = run(lambda t: torch.tanh(A[:60] @ t), (_x(),))  # 60 outputs for 40 inputs
        assert r.verdict is True and forward_log(r) == []
        return
    x = _x(torch.float32) if why == "float32" else _x()
    # (steps and tolerances wide enough that batched float32 evaluations agree with plain ones)
    kw = {"atol": 5e-2, "rtol": 5e-2, "eps": 5e-2} if why == "float32" else {"atol": 0.0}
    r = run(lambda t: torch.tanh(A.to(t.dtype) @ t), (x,), **kw)
    assert r.verdict is torch_verdict(lambda t: torch.tanh(A.to(t.dtype) @ t), (x,), **kw)
    expected = "not double precision real" if why == "float32" else "atol is 0: the projections' bound would be 0"
    assert forward_log(r) == [("declined", expected)]


def _counting_projections(monkeypatch):
    """The calls of the forward-mode path's projections (its first VJPs), counted."""
    counted = []
    original = forward_jacobian._projections

    def counting(*args, **kw):
        counted.append(1)
        return original(*args, **kw)

    monkeypatch.setattr(forward_jacobian, "_projections", counting)
    return counted


@pytest.mark.parametrize("scale", [1.0, 1.01])
def test_a_check_too_small_to_save_the_projections_is_declined_before_them(monkeypatch, scale):
    # 12 outputs of 4 inputs: the reverse passes (18 VJPs) less the JVP rows (4) save fewer
    # VJPs than twice the projections' 16, so no projection is made (kornia's Boxes checks
    # paid 2.6 ms of projections in an 8 ms check before this)
    from agcheck.engine import cost

    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", 0)  # the engine's path, however cheap its VJPs
    w = torch.randn(12, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    fn = _scaled_backward(lambda t: torch.tanh(w @ t), scale)
    x = torch.randn(4, dtype=torch.float64, generator=torch.Generator().manual_seed(4)).requires_grad_()
    counted = _counting_projections(monkeypatch)
    r = run(fn, (x,))
    assert forward_log(r) == [("declined", "too small: 14 VJPs to save against 16 for the projections")]
    assert not counted
    assert r.verdict is (scale == 1.0)
    assert r.verdict is torch_verdict(fn, (x,))


def _scaled_backward(fn, scale):
    """``fn`` as a custom Function whose gradient is scaled by ``1 / scale`` (right at 1,
    wrong otherwise)."""

    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            with torch.enable_grad():
                x_ = x.detach().requires_grad_()
                y = fn(x_)
            ctx.save_for_backward(x_, y)
            return y.detach()

        @staticmethod
        def backward(ctx, g):
            x_, y = ctx.saved_tensors
            (gx,) = torch.autograd.grad(y, x_, g, retain_graph=True)
            return gx / scale

    return Scaled.apply


@pytest.mark.parametrize("scale", [1.0, 1.01])
def test_the_path_follows_from_the_counts_however_long_the_jvps_take(monkeypatch, scale):
    """320 outputs of 40 inputs: the reverse passes' 480 VJPs less 40 JVP rows save far more
    than the projections' 16 VJPs, so forward mode stands in, even where each JVP call is
    made slow (no timing is taken); a backward and JVP wrong alike still fail numerically."""
    be_type = type(agcheck.get_backend("torch"))
    calls, original = [], be_type.jvp_rows

    def slow_rows(self, *args):
        calls.append(1)
        busy(0.05)
        return original(self, *args)

    monkeypatch.setattr(be_type, "jvp_rows", slow_rows)
    fn = _tanh_of_a(both_scale=scale)
    counted = _counting_projections(monkeypatch)
    r = run(fn, (_x(),))
    assert forward_log(r) == [("passed", "")] and counted == [1] and calls
    assert r.verdict is (scale == 1.0) is torch_verdict(fn, (_x(),))


# -- JAX: the same path through its backend (jax.jvp under vmap) ----------------------------

def _jax_functions(jax, jnp, scale):
    """``tanh(A x)`` plain, with a custom JVP (JAX transposes it into the backward: both
    scaled by ``scale`` alike), and with a custom VJP (no forward mode; backward scaled)."""
    a = jnp.asarray(A.numpy())

    @jax.custom_jvp
    def by_jvp(x):
        return jnp.tanh(a @ x)

    @by_jvp.defjvp
    def _(primals, tangents):
        y = jnp.tanh(a @ primals[0])
        return y, (1 - y * y) * (a @ tangents[0]) * scale

    @jax.custom_vjp
    def by_vjp(x):
        return jnp.tanh(a @ x)

    def fwd(x):
        y = jnp.tanh(a @ x)
        return y, y

    def bwd(y, gy):
        return (a.T @ (gy * (1 - y * y)) * scale,)

    by_vjp.defvjp(fwd, bwd)
    return {"plain": lambda x: jnp.tanh(a @ x), "custom jvp": by_jvp, "custom vjp": by_vjp}


@pytest.mark.parametrize("kind, scale", [("plain", 1.0), ("custom jvp", 1.0), ("custom jvp", 1.01),
                                         ("custom vjp", 1.0), ("custom vjp", 1.01)])
def test_jax_functions_with_many_outputs(monkeypatch, kind, scale):
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    with jax.enable_x64(True):
        fn = _jax_functions(jax, jnp, scale)[kind]
        r = run(fn, (jnp.asarray(_x().detach().numpy()),), backend="jax")
    assert r.verdict is (scale == 1.0)
    if kind == "custom vjp":  # jax.jvp cannot go through a custom VJP: the VJPs decide
        [(decision, _)] = forward_log(r)
        assert decision == "declined"
    else:  # tied (a custom JVP's backward is its transpose): a wrong one fails numerically
        assert forward_log(r) == [("passed", "")]


# -- TensorFlow: ForwardAccumulator under the backend's batched JVPs ----------------------

@pytest.mark.parametrize("scale", [1.0, 1.01])
def test_tensorflow_functions_with_many_outputs(monkeypatch, scale):
    tf = tensorflow_or_skip()
    a = tf.constant(A.numpy())

    @tf.custom_gradient
    def scaled(y):
        return tf.identity(y), lambda g: g * scale

    r = run(lambda t: scaled(tf.tanh(tf.linalg.matvec(a, t))), (tf.constant(_x().detach().numpy()),),
            backend="tensorflow")
    assert r.verdict is (scale == 1.0)
    # TF's forward mode differentiates the forward pass, not the custom gradient: a wrong
    # one is not tied
    expected = ("passed", "") if scale == 1.0 else ("disagreement", "output 0, input 0: projections differ")
    assert forward_log(r) == [expected]


@pytest.mark.parametrize("factor", [1.0, 1.01])
def test_an_empty_input_takes_its_jacobians_shapes_from_the_outputs_without_a_call(factor):
    # torch's checker moves no element of an empty input and calls fn for none; the
    # forward-mode Jacobians of an empty input are (0, output size), and their shapes come
    # from the outputs the check already has
    class TangentScaled(torch.autograd.Function):
        @staticmethod
        def forward(x):
            return x.sin()

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_forward(inputs[0])

        @staticmethod
        def jvp(ctx, t):
            (x,) = ctx.saved_tensors
            return t * x.cos() * factor

    dual_calls = []

    def fn(x, empty):
        if torch.autograd.forward_ad._current_level >= 0:  # noqa: SLF001 - inside a dual level
            dual_calls.append(empty.numel())
        return TangentScaled.apply(x) + empty.sum()

    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    empty = torch.zeros(0, dtype=torch.float64, requires_grad=True)
    options = dict(check_forward_ad=True, check_backward_ad=False, check_undefined_grad=False,
                   check_batched_grad=False, engine="reference", raise_exception=False)
    assert agcheck.gradcheck(fn, (x, empty), **options) is (factor == 1.0)
    ours = len(dual_calls)
    dual_calls.clear()
    assert torch.autograd.gradcheck(fn, (x, empty), **{k: v for k, v in options.items() if k != "engine"}) is \
        (factor == 1.0)
    assert ours == len(dual_calls) == x.numel()  # one per element of x, none for the empty input
