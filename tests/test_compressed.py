"""The compressed path of the slow-mode engine: where it applies it decides passing checks
from a few dozen evaluations; every failure it sees goes to the exact engines, so the
verdict is always the reference engine's."""
import importlib

import numpy as np
import pytest
import torch

import agcheck
from agcheck.engine import coloured, colouring
from agcheck.core.outcome import EngineEvent
from .helpers import property_settings
from .helpers import reference_takes, run_check as run


@pytest.fixture(autouse=True)
def _engine_always_runs(monkeypatch):
    """These tests are about the engine's paths: it runs however little the loop would
    cost (the plan that sends such checks to the reference engine is tested on its own)."""
    from agcheck.engine import cost

    monkeypatch.setattr(cost, "ENGINE_FROM_CALLS", 0)


N = 600  # 600 x 600 Jacobian entries: above coloured.MIN_ENTRIES




def events(r, path):
    """The engine's decisions on ``path``, with their reasons."""
    return [f"{e.decision}: {e.detail}" if e.detail else e.decision for e in r.engine_log if e.path == path]


def compressed_log(r):
    return events(r, "compressed")


def custom(forward, backward):
    """``forward`` with a hand-written ``backward(x, grad)``, vmappable (so the batched
    engines can move its input in batches)."""

    class Fn(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x):
            return forward(x)

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return backward(x, g)

    return Fn.apply


def x_of(n=N, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, dtype=dtype, generator=g).requires_grad_()


def at(n, i):
    return (torch.arange(n) == i).double()


PERMUTATION = torch.randperm(N, generator=torch.Generator().manual_seed(3))
CORRECT = {
    "elementwise": (lambda x: x.sin() * 2, lambda: (x_of(),)),
    "two inputs": (lambda a, b: a * b.exp() + a.tanh(), lambda: (x_of(), x_of(seed=1))),
    "transpose and slice": (lambda c: c.t()[::2].exp(), lambda: (x_of(40 * 30).reshape(40, 30),)),
    "permutation": (lambda x: x[PERMUTATION].cos(), lambda: (x_of(),)),
    "some outputs constant": (lambda x: torch.cat([x.sin(), torch.zeros(50, dtype=x.dtype)]),
                              lambda: (x_of(),)),
    "complex": (lambda z: z * z.conj() + z.exp(), lambda: (x_of(dtype=torch.complex128),)),
    "two outputs": (lambda x: (x.sin(), x.exp()), lambda: (x_of(),)),
    "custom function": (custom(lambda x: x.sin() * 2, lambda x, g: g * 2 * x.cos()), lambda: (x_of(),)),
}


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_correct_functions_pass_on_the_compressed_path(name):
    fn, make = CORRECT[name]
    r = run(fn, make())
    assert r.verdict is True
    assert "passed" in compressed_log(r) and not r.engine_fallbacks


def test_forward_mode_and_five_point_stencil_are_compressed():
    r = run(lambda x: x.sin() * 2, (x_of(),), check_forward_ad=True)
    assert r.verdict and compressed_log(r) == ["passed", "passed"]
    r = run(lambda x: x.sin() * 2, (x_of(),), stencil="five-point")
    assert r.verdict and compressed_log(r) == ["passed"]


def test_inputs_stay_unchanged():
    x = x_of()
    before = x.detach().clone()
    run(lambda x: x.sin() * 2, (x,))
    assert torch.equal(x.detach(), before) and x.grad is None


BROKEN = {
    # wrong on the pattern: read off entry by entry
    "scaled": custom(lambda x: x.sin() * 2, lambda x, g: g * 2.01 * x.cos()),
    "sign": custom(lambda x: x.sin() * 2, lambda x, g: -g * 2 * x.cos()),
    "one entry off": custom(lambda x: x.sin() * 2, lambda x, g: g * 2 * x.cos() + 0.05 * g * at(N, 7)),
    "one entry zero": custom(lambda x: x.sin() * 2, lambda x, g: g * 2 * x.cos() * (1 - at(N, 11))),
    # derivatives off the pattern: stray entries in the compressed sums
    "spurious dependence": custom(lambda x: x.sin(), lambda x, g: g * x.cos() + 0.01 * g.roll(3)),
    "one spurious entry": custom(lambda x: x.sin(), lambda x, g: g * x.cos() + 0.01 * g[3] * at(N, 7)),
    # a stray entry well inside rtol * |entry|: only the sign patterns reveal it
    "stray masked by rtol": custom(lambda x: 1000 * x.sin(),
                                   lambda x, g: 1000 * g * x.cos() + 1e-3 * g.roll(1)),
    # strays that cancel when every sign is + (round 0)
    "cancelling strays": custom(lambda x: x.sin(),
                                lambda x, g: g * x.cos() + 0.05 * (g.roll(1) - g.roll(-1))),
    # forward mixes elements, backward forgets it: not compressible, exact engine
    "missing dependence": custom(lambda x: x.sin() + 0.1 * (x.roll(1) - x.roll(-1)), lambda x, g: g * x.cos()),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_backwards_fail_with_the_reference_verdict(name):
    fn = BROKEN[name]
    r = run(fn, (x_of(),))
    assert r.verdict is False
    log = compressed_log(r)
    assert log and "passed" not in log
    assert r.engine_fallbacks  # the failure was the reference engine's
    assert run(fn, (x_of(),), engine="reference").verdict is False


@pytest.mark.parametrize("loop_from", [0, 10**9])
def test_compressed_vjps_are_batched_where_the_checks_vjps_are(monkeypatch, loop_from):
    """The compressed pass's few dozen VJPs are batched where the check's loop of VJPs is
    long enough for batched VJPs (``cost.BATCHED_VJPS_FROM_CALLS``), else plain; either
    way the right backward passes and the wrong one fails."""
    from agcheck.backends.torch_backend import TorchTrace
    from agcheck.engine import cost

    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", loop_from)
    batched = []
    original = TorchTrace.vjp_many
    monkeypatch.setattr(TorchTrace, "vjp_many", lambda self, *a: (batched.append(1), original(self, *a))[1])
    fn, make = CORRECT["two inputs"]
    r = run(fn, make())
    assert r.verdict is True and "passed" in compressed_log(r) and not r.engine_fallbacks
    assert bool(batched) is (loop_from == 0)
    r = run(BROKEN["one spurious entry"], (x_of(),))
    assert r.verdict is False and compressed_log(r) and "passed" not in compressed_log(r)


def test_stray_masked_by_rtol_is_caught_by_the_sign_patterns():
    r = run(BROKEN["stray masked by rtol"], (x_of(),))
    assert compressed_log(r) == ["disagreement: output 0, input 0: sign patterns disagree"]


def test_forward_mode_broken_jvp_fails():
    class Fn(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x):
            return x.sin()

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])
            ctx.x = inputs[0]

        @staticmethod
        def backward(ctx, g):
            return g * ctx.saved_tensors[0].cos()

        @staticmethod
        def jvp(ctx, t):
            return t * ctx.x.cos() + 0.01 * t.roll(2)

    r = run(Fn.apply, (x_of(),), check_forward_ad=True)
    assert r.verdict is False and "passed" not in compressed_log(r)[1:]


def test_small_checks_and_the_batched_engine_skip_compression():
    r = run(lambda x: x.sin(), (x_of(100),))
    assert compressed_log(r) == [] and r.verdict
    r = run(lambda x: x.sin(), (x_of(),), engine="batched")
    assert compressed_log(r) == [] and r.verdict


def test_broadcast_inputs_with_wide_fan_out_are_left_to_the_batched_engine():
    # every element of b reaches 40 outputs: 40 VJPs per round would cost more than 1200
    r = run(lambda a, b: (a * b).sin(), (x_of(40 * 30).reshape(40, 30), x_of(30, seed=1).reshape(1, 30)))
    assert r.verdict and compressed_log(r) == ["declined: not worth it"]


def test_dense_functions_are_not_compressed():
    r = run(lambda x: x.softmax(0), (x_of(),))
    assert r.verdict and compressed_log(r) == ["declined: not compressible: an output element depends on several input elements"]


def test_index_signs_separate_every_pair():
    signs = colouring.index_signs(1000, 1 + colouring.bits_for(1000) + 4, np.random.default_rng(0))
    assert (signs[0] == 1).all()
    # any two indices get opposite relative signs in some round
    codes = signs[1:1 + colouring.bits_for(1000)].T
    assert len({tuple(c) for c in codes}) == 1000


def test_pattern_colours_separate_outputs_sharing_an_input_element():
    dep = np.array([2, 0, 2, -1, 1, 2, 0])
    pat = coloured._Pattern(dep)
    for j in range(3):
        colours = pat.colour[dep == j]
        assert len(set(colours)) == len(colours)
    assert pat.n_colours == 3


# -- gradgradcheck: the VJP of an elementwise function is elementwise in (x, v) ---------

def _logged_gradgradcheck(monkeypatch, fn, x):
    gradgradcheck_module = importlib.import_module("agcheck.gradgradcheck")
    runs = []
    original = gradgradcheck_module.all_checks

    def recording(run, *args, **kwargs):
        runs.append(run)
        return original(run, *args, **kwargs)

    monkeypatch.setattr(gradgradcheck_module, "all_checks", recording)
    verdict = agcheck.gradgradcheck(fn, (x,), raise_exception=False)
    return verdict, [f"{e.decision}: {e.detail}" if e.detail else e.decision for r in runs for e in r.engine_log]


def test_gradgradcheck_is_compressed(monkeypatch):
    verdict, log = _logged_gradgradcheck(monkeypatch, lambda t: t.sin() * t, x_of())
    assert verdict is True and "passed" in log


class _WrongSecondDerivative(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return x.sin()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos().detach()  # first derivative right, its derivative lost


def test_gradgradcheck_broken_second_derivative_fails_like_torch(monkeypatch):
    verdict, log = _logged_gradgradcheck(monkeypatch, _WrongSecondDerivative.apply, x_of())
    assert verdict is False and "passed" not in log
    assert torch.autograd.gradgradcheck(_WrongSecondDerivative.apply, (x_of(),), raise_exception=False) is False


# -- coloured differences: the pattern read off the analytical Jacobian ---------------------

def coloured_log(r):
    return events(r, "coloured")


def mats(n=48, seeds=(0, 1)):
    return tuple(x_of(n * n, seed=s).reshape(n, n) for s in seeds)


def conv_input():
    return (x_of(400).reshape(1, 1, 400), x_of(5, seed=1).reshape(1, 1, 5))


COLOURED = {
    "matmul tanh": (lambda a, b: torch.tanh(a @ b), mats),
    "banded": (lambda x: x[1:-1] * x[:-2] + x[2:].sin(), lambda: (x_of(),)),
    "conv1d": (lambda x, w: torch.nn.functional.conv1d(x, w).tanh(), conv_input),
}


@pytest.mark.parametrize("name", sorted(COLOURED))
def test_blocked_and_banded_patterns_pass_coloured(name):
    fn, make = COLOURED[name]
    r = run(fn, make())
    assert r.verdict is True and coloured_log(r)[-1] == "passed" and not r.engine_fallbacks


@pytest.mark.parametrize("bug", [None, "scaled"])
def test_an_elementwise_jacobian_is_the_one_colour_case_of_the_coloured_path(monkeypatch, bug):
    # with the probe's path off, the analytical Jacobian's diagonal pattern is coloured with
    # one colour: every element moved at once, as the compressed path moves them
    monkeypatch.setattr(coloured, "try_compressed_reverse", lambda *a: False)
    colours, differences = [], coloured._differences
    monkeypatch.setattr(coloured, "_differences",
                        lambda p, q, colour, n_colours, *a: colours.append(n_colours) or differences(p, q, colour,
                                                                                                     n_colours, *a))
    fn = BROKEN[bug] if bug else CORRECT["custom function"][0]
    r = run(fn, (x_of(),))
    assert colours == [1]
    assert r.verdict is (bug is None) is torch.autograd.gradcheck(fn, (x_of(),), raise_exception=False)
    assert coloured_log(r) == (["passed"] if bug is None else ["disagreement: input 0, output 0: entries differ"])


def _matmul_with_backward(grad_a):
    class MatmulTanh(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(a, b):
            return torch.tanh(a @ b)

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(*inputs, output)

        @staticmethod
        def backward(ctx, g):
            a, b, y = ctx.saved_tensors
            gz = g * (1 - y * y)
            return grad_a(gz, a, b), a.transpose(-1, -2) @ gz

    return MatmulTanh.apply


BROKEN_COLOURED = {
    "scaled": lambda gz, a, b: 1.01 * (gz @ b.transpose(-1, -2)),
    "not transposed": lambda gz, a, b: gz @ b,
    "one entry off": lambda gz, a, b: gz @ b.transpose(-1, -2) + 0.05 * gz[..., :1, :1] * (a * 0 + 1)[..., :1, :1],
    # a stray dependence: grad of row i picks up row i+1 of the cotangent
    "stray rows": lambda gz, a, b: gz @ b.transpose(-1, -2) + 0.01 * gz.roll(1, dims=-2) @ b.transpose(-1, -2),
}


@pytest.mark.parametrize("name", sorted(BROKEN_COLOURED))
def test_broken_blocked_backwards_fail_with_the_reference_verdict(name):
    fn = _matmul_with_backward(BROKEN_COLOURED[name])
    r = run(fn, mats())
    assert r.verdict is False and "passed" not in coloured_log(r) and r.engine_fallbacks
    assert run(fn, mats(), engine="reference").verdict is False


def _no_samples(monkeypatch):
    """The coloured pass itself, not the loop moving the 48 rows of ``a`` (independent
    samples of ``tanh(a @ b)``) together, which is cheaper and takes ``a`` by default."""
    from agcheck.engine.rows import Problem

    monkeypatch.setattr(Problem, "_sample_candidate", lambda self, pos: None)


def test_correct_custom_matmul_passes_coloured(monkeypatch):
    _no_samples(monkeypatch)
    fn = _matmul_with_backward(lambda gz, a, b: gz @ b.transpose(-1, -2))
    r = run(fn, mats())
    assert r.verdict is True and coloured_log(r) == ["passed"]


@pytest.mark.parametrize("factor", [1.0, 1.1])
def test_a_coloured_pass_dearer_than_the_loop_by_samples_gives_way_to_it(factor, monkeypatch):
    # a: 48 independent rows, so 96 calls move every element of every row; the coloured
    # pass needs 48 colours x 2 points x 19 sign patterns = 1,824 moved copies
    fn = _matmul_with_backward(lambda gz, a, b: gz @ b.transpose(-1, -2) * factor)
    taken = reference_takes(monkeypatch)
    r = run(fn, mats())
    assert r.verdict is (factor == 1.0)
    assert EngineEvent("coloured", "declined", 0, "not compressible: the loop moving samples together is cheaper") \
        in r.engine_log and EngineEvent("numerical", "by samples", 0) in r.engine_log
    if factor != 1.0:  # a's rows all exact, handed to the reference engine
        assert len(r.engine_fallbacks) == 1
        blocks = taken[0]
        assert blocks[0][0] == 0 and blocks[-1][1] == 48 * 48
        assert all(x[1] == y[0] for x, y in zip(blocks, blocks[1:]))


@pytest.mark.parametrize("factor", [1.0, 1.1])
def test_a_coloured_pass_gives_way_before_it_moves_anything(monkeypatch, factor):
    # the choice follows from the counts (1,824 moved copies against 96 calls moving the
    # samples together): a's colour classes are never moved; b (whose rows are not
    # samples) is coloured
    moved, differences = [], coloured._differences
    monkeypatch.setattr(coloured, "_differences", lambda p, q, *a: moved.append(q) or differences(p, q, *a))
    fn = _matmul_with_backward(lambda gz, a, b: gz @ b.transpose(-1, -2) * factor)
    r = run(fn, mats())
    assert r.verdict is (factor == 1.0) is torch.autograd.gradcheck(fn, mats(), raise_exception=False)
    assert EngineEvent("coloured", "declined", 0, "not compressible: the loop moving samples together is cheaper") \
        in r.engine_log
    assert 0 not in moved and (factor != 1.0 or 1 in moved)


def test_colouring_separates_elements_that_meet():
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 50, size=400)
    cols = rng.integers(0, 120, size=400)
    colour = colouring.colour_columns(rows, cols, 120, limit=120)
    assert colour is not None
    seen = {}
    for r, c in zip(rows, cols):
        assert seen.setdefault((r, colour[c]), c) == c
    assert colouring.colour_columns(rows, cols, 120, limit=2) is None


def test_a_row_wider_than_the_limit_needs_no_colouring_attempt():
    block = coloured.DenseBlock(np.array([[1.0, 2.0, 0.0], [0.0, np.nan, 3.0]]))
    assert block.widest(axis=1) == 2 and block.widest(axis=0) == 2  # NaN counts as an entry
    rows, cols = np.array([0, 0, 0, 1]), np.array([0, 1, 2, 0])
    assert colouring.colour_columns(rows, cols, 3, limit=2) is None
    assert colouring.colour_columns(rows, cols, 3, limit=3) is not None


@pytest.mark.parametrize("scale", [1.0, 1.01])
def test_a_dense_jacobian_is_never_coloured_nor_its_pattern_built(scale, monkeypatch):
    # every input element reaches every output: no colouring can save a call, which the
    # widest row shows before the pattern's index arrays (4 blocks' worth of memory) exist
    built = []
    original = coloured.DenseBlock.pattern
    monkeypatch.setattr(coloured.DenseBlock, "pattern", lambda self: built.append(1) or original(self))
    w = torch.randn(300, 300, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) / 17

    class Dense(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x):
            return torch.tanh(w @ x)

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(output)

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            return scale * (w.T @ (g * (1 - y * y)))

    x = torch.randn(300, dtype=torch.float64, generator=torch.Generator().manual_seed(6)).requires_grad_()
    r = run(Dense.apply, (x,))
    assert not built
    assert r.verdict is torch.autograd.gradcheck(Dense.apply, (x,), raise_exception=False) is (scale == 1.0)


# -- property: on random elementwise-like functions with random planted bugs, the default
#    engine's verdict is the reference engine's ----------------------------------------

import hypothesis  # noqa: E402
import hypothesis.strategies as st  # noqa: E402

_UNARY = {
    "sin": (torch.sin, torch.cos),
    "tanh": (torch.tanh, lambda x: 1 - torch.tanh(x) ** 2),
    "exp": (torch.exp, torch.exp),
    "square": (lambda x: x * x, lambda x: 2 * x),
    "softplus": (torch.nn.functional.softplus, torch.sigmoid),
}
_BUGS = {
    "none": lambda x, d, g: d * g,
    "scale": lambda x, d, g: 1.02 * d * g,
    "one entry": lambda x, d, g: d * g + 0.05 * g * at(x.numel(), 17),
    "stray": lambda x, d, g: d * g + 0.02 * g.roll(5),
    "small stray": lambda x, d, g: d * g + 3e-4 * g.roll(1),
    "sign": lambda x, d, g: -d * g,
    "stray pair": lambda x, d, g: d * g + 0.03 * (g.roll(2) - g.roll(-2)),
}


@property_settings(20)
@hypothesis.given(st.lists(st.sampled_from(sorted(_UNARY)), min_size=1, max_size=3),
                  st.sampled_from(sorted(_BUGS)), st.sampled_from([1.0, 100.0]),
                  st.integers(0, 2**16))
def test_default_engine_verdict_is_the_reference_verdict(chain, bug, scale, seed):
    def forward(x):
        for name in chain:
            x = _UNARY[name][0](x)
        return scale * x

    def derivative(x):
        d = torch.ones_like(x)
        for name in chain:
            f, df = _UNARY[name]
            d = d * df(x)
            x = f(x)
        return scale * d

    fn = custom(forward, lambda x, g: _BUGS[bug](x, derivative(x), g))
    x = x_of(N, seed=seed) * 0.5
    expected = run(fn, (x,), engine="reference").verdict
    assert run(fn, (x,)).verdict is expected
    with torch.no_grad():
        overflows = not torch.isfinite(forward(x)).all()
    if overflows:  # exp(exp(exp(x))) at x > 1.88: torch's numerical Jacobian fails too
        return
    if bug in ("scale", "stray", "sign", "stray pair"):  # "one entry" may hide within rtol
        assert expected is False
    if bug == "none":
        assert expected is True


def test_a_correct_chain_that_overflows_fails_on_every_engine_as_under_torch():
    # found by a wider search of the property above (seed 443: one output is inf)
    def fn(x):
        return x.exp().exp().exp()

    x = x_of(N, seed=443) * 0.5
    assert not torch.isfinite(fn(x)).all()
    assert torch.autograd.gradcheck(fn, (x,), raise_exception=False) is False
    assert run(fn, (x,), engine="reference").verdict is False
    assert run(fn, (x,)).verdict is False


# -- the reentrancy pass, coloured: rows that share no input element share a VJP ---------

def vjp_log(r):
    return [(e.decision, e.subject, e.detail) for e in r.engine_log if e.path == "vjp"]


@pytest.mark.parametrize("name", ["matmul tanh", "banded"])
def test_second_analytical_pass_is_coloured(name):
    fn, make = COLOURED[name]
    r = run(fn, make())
    assert r.verdict is True and ("coloured", None, "") in vjp_log(r) and not r.engine_fallbacks


def test_an_input_reaching_every_output_gets_the_exact_second_pass():
    fn, make = COLOURED["conv1d"]  # each of the kernel's elements reaches every output
    r = run(fn, make())
    assert r.verdict is True and not r.engine_fallbacks
    # the first pass may loop its VJPs or batch them (as the plan's rule says): the
    # decision under test is the second pass's
    second_pass = [e for e in vjp_log(r) if e[0] not in ("looped", "batched")]
    assert second_pass == [("column by column", 1, "input reaches too many outputs")]


def _drifting_matmul(drift):
    """tanh(a @ b) whose backward scales its result by ``1 + drift * calls``: a backward
    that is not reentrant by ``drift`` relative."""
    calls = [0]

    def grad_a(gz, a, b):
        calls[0] += 1
        return (gz @ b.transpose(-1, -2)) * (1 + drift * calls[0])

    return _matmul_with_backward(grad_a)


@pytest.mark.parametrize("drift", [1e-3, 1e-13])
def test_backward_not_reentrant_is_caught_when_the_second_pass_is_coloured(drift):
    a, b = mats(16)  # 512 x 256 entries: coloured
    r = run(_drifting_matmul(drift), (a, b))
    assert r.verdict is False and r.engine_fallbacks
    with pytest.raises(agcheck.GradcheckError, match="Backward is not reentrant"):
        agcheck.gradcheck(_drifting_matmul(drift), mats(16))
    with pytest.raises(RuntimeError, match="Backward is not reentrant"):
        torch.autograd.gradcheck(_drifting_matmul(drift), mats(16))


def test_drift_within_nondet_tol_passes_like_torch():
    assert agcheck.gradcheck(_drifting_matmul(1e-13), mats(16), nondet_tol=1e-9)
    assert torch.autograd.gradcheck(_drifting_matmul(1e-13), mats(16), nondet_tol=1e-9)


def _small_cnn(scale_of_call=lambda calls: 1.0):
    """conv 5x5 -> tanh -> conv 3x3 on a 12x12 image: each output element reaches a 7x7
    window, so the second pass needs 49 colours for 144 outputs (more than a quarter,
    fewer than two thirds). The backward is multiplied by ``scale_of_call(calls)``."""
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(3, 1, 5, 5, dtype=torch.float64, generator=g) * 0.3
    w2 = torch.randn(1, 3, 3, 3, dtype=torch.float64, generator=g) * 0.3
    calls = [0]

    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.clone()

        @staticmethod
        def backward(ctx, grad):
            calls[0] += 1
            return grad * scale_of_call(calls[0])

    def net(x):
        h = torch.tanh(torch.nn.functional.conv2d(x, w1, padding=2))
        return Scaled.apply(torch.nn.functional.conv2d(h, w2, padding=1))

    x = torch.randn(1, 1, 12, 12, dtype=torch.float64, generator=g, requires_grad=True)
    return net, x


def test_a_cnn_needing_half_as_many_colours_as_outputs_gets_the_coloured_second_pass():
    net, x = _small_cnn()
    r = run(net, (x,))
    assert r.verdict is True and ("coloured", None, "") in vjp_log(r) and not r.engine_fallbacks
    wrong, x = _small_cnn(lambda calls: 1.01)
    assert run(wrong, (x,)).verdict is False
    assert not torch.autograd.gradcheck(wrong, (x,), raise_exception=False)


def test_a_cnn_whose_backward_drifts_is_not_reentrant_with_the_coloured_second_pass():
    drifting, x = _small_cnn(lambda calls: 1 + 1e-12 * calls)
    with pytest.raises(agcheck.GradcheckError, match="Backward is not reentrant"):
        agcheck.gradcheck(drifting, (x,))
    drifting, x = _small_cnn(lambda calls: 1 + 1e-12 * calls)
    with pytest.raises(RuntimeError, match="Backward is not reentrant"):
        torch.autograd.gradcheck(drifting, (x,))


# -- inputs that cannot be moved in batches: compressed with one plain call per move -------

def unbatchable(backward):
    """sin(x) * 2 as an autograd.Function with no vmap rule (vmap refuses it) that takes
    inputs of one size only (as a fixed-size kernel does): no batched form of it exists."""

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            if x.shape != (N,):
                raise ValueError(f"a kernel for {N} elements, got {tuple(x.shape)}")
            ctx.save_for_backward(x)
            return x.sin() * 2

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return backward(x, g)

    return Fn.apply


def looped_detail(r, pos) -> str:
    """Why the engine log says input ``pos`` went to the loop (it must say it did)."""
    (event,) = [e for e in r.engine_log if e.path == "numerical" and e.subject == pos]
    assert event.decision == "looped"
    return event.detail


def test_unbatchable_function_is_compressed_one_call_at_a_time():
    fn = unbatchable(lambda x, g: g * 2 * x.cos())
    r = run(fn, (x_of(),))
    assert r.verdict is True and compressed_log(r) == ["passed"] and not r.engine_fallbacks
    assert "vmap: custom Function" in looped_detail(r, 0)


@pytest.mark.parametrize("bug", ["scaled", "one entry off"])
def test_unbatchable_broken_backward_fails_with_the_reference_verdict(bug):
    wrong = {"scaled": lambda x, g: 1.01 * g * 2 * x.cos(),
             "one entry off": lambda x, g: g * 2 * x.cos() + 0.01 * g * at(N, 7)}[bug]
    fn = unbatchable(wrong)
    r = run(fn, (x_of(),))
    assert r.verdict is False and "passed" not in compressed_log(r) and r.engine_fallbacks
    assert torch.autograd.gradcheck(fn, (x_of(),), raise_exception=False) is False


def test_input_read_through_a_closure_is_compressed_one_call_at_a_time():
    w = x_of()

    def module_like(_):  # reads the parameter it is given through a closure, like an nn.Module
        return w.sin() * 2

    r = run(module_like, (w,))
    assert r.verdict is True and compressed_log(r) == ["passed"]
    assert "vmap: differs from plain calls" in looped_detail(r, 0)  # the batch does not reach fn
    assert torch.autograd.gradcheck(module_like, (w,))


class _RecordingMatmulTanh(torch.autograd.Function):
    """tanh(a @ b) of square blocks of one shape, with no vmap rule; keeps a copy of every
    input it is called with."""

    seen = []
    recording = False

    @staticmethod
    def forward(ctx, a, b):
        if a.shape != b.shape:  # nor can it be batched along a's first dimension
            raise ValueError("blocks of one shape only")
        if _RecordingMatmulTanh.recording:
            _RecordingMatmulTanh.seen.append((a.detach().clone(), b.detach().clone()))
        y = torch.tanh(a @ b)
        ctx.save_for_backward(a, b, y)
        return y

    @staticmethod
    def backward(ctx, g):
        a, b, y = ctx.saved_tensors
        gz = g * (1 - y * y)
        return gz @ b.transpose(-1, -2), a.transpose(-1, -2) @ gz


def _only_moved_by_eps(seen, x, eps):
    """Every finite-difference value ``fn`` saw is ``x``, ``x + eps`` or ``x - eps`` as torch
    computes them in the input's dtype: the moves of the sequential perturbation, to the bit.
    Returns how many evaluations moved ``x`` by about ``eps`` (the others are the pattern
    probe's larger moves, 2^-6 |x|)."""
    x = x.detach()
    plus, minus = x + eps, x - eps
    differences = [v for v in seen if (v - x).abs().max() <= 10 * eps]
    assert all(bool(((v == x) | (v == plus) | (v == minus)).all()) for v in differences)
    return len(differences)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_one_call_at_a_time_moves_are_the_sequential_moves_to_the_bit(dtype, monkeypatch):
    from agcheck.engine.rows import Problem

    looped = Problem.evaluate_looped

    def recorded(self, *args, **kwargs):  # what fn sees in the compressed paths' plain calls
        _RecordingMatmulTanh.recording = True
        try:
            return looped(self, *args, **kwargs)
        finally:
            _RecordingMatmulTanh.recording = False

    monkeypatch.setattr(Problem, "evaluate_looped", recorded)
    _no_samples(monkeypatch)
    _RecordingMatmulTanh.seen.clear()
    a, b = (t.detach().to(dtype).requires_grad_() for t in mats(48))
    kw = dict(atol=1e-2, rtol=1e-2, eps=1e-3) if dtype == torch.float32 else {}
    r = run(_RecordingMatmulTanh.apply, (a, b), **kw)
    assert coloured_log(r) == ["passed"] and "vmap: custom Function" in looped_detail(r, 0)
    eps = kw.get("eps", 1e-6)
    seen = _RecordingMatmulTanh.seen
    # each input: 48 colours x 2 points x (1 + 6 bit patterns + 12 random ones), with the
    # other input unmoved; at most 2 x 25 pattern-probe moves besides
    assert _only_moved_by_eps([s[0] for s in seen], a, eps) >= 2 * 48 * 19
    assert _only_moved_by_eps([s[1] for s in seen], b, eps) >= 2 * 48 * 19
    assert len(seen) <= 2 * (2 * 48 * 19 + 25)
    seen.clear()


def test_coloured_second_pass_batches_follow_the_memory_budget(monkeypatch):
    # each element of x reaches 64 outputs: 64 colour classes in the second pass
    kernel = torch.randn(1, 1, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def fn(x):
        return torch.nn.functional.conv1d(x, kernel).tanh()

    from agcheck.backends import torch_backend
    from agcheck.engine import cost

    # what is tested is the memory limit: batched VJPs are used, however short the loop
    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", 0)
    batches = []
    original = torch_backend.TorchTrace.vjp_many

    def recording(self, k, stacked):
        batches.append(int(stacked.shape[0]))
        return original(self, k, stacked)

    monkeypatch.setattr(torch_backend.TorchTrace, "vjp_many", recording)
    widest = {}
    for budget in (None, 4 << 20):
        batches.clear()
        r = run(fn, (x_of(400).reshape(1, 1, 400),), memory_budget=budget)
        assert r.verdict is True and ("coloured", None, "") in vjp_log(r)
        widest[budget] = max(batches)
    # all 64 colour classes at most MAX_BATCH a call; (400 + 337) elements x 8 bytes x 8
    # per cotangent, a quarter of 4 MiB per call: 22
    assert widest[None] == min(64, cost.MAX_BATCH) and widest[4 << 20] <= 22


@pytest.mark.parametrize("broken", [False, True])
def test_the_coloured_pass_batches_at_most_max_batch_copies_a_call(broken, monkeypatch):
    # a batched call of hundreds of copies fits the budget on paper, but a convolution's
    # workspace grows with the copies (kornia's 3-D motion blur peaked at 3.3 GB so, under
    # 1 GB capped); the coloured pass's calls are capped as every batched call is
    from agcheck.engine import cost

    from .helpers import OneEntryOff, make

    be = type(agcheck.get_backend("torch"))
    sizes = []
    for name in ("evaluate_batch", "evaluate_stacked"):
        original = getattr(be, name)

        def recorded(self, fn, args, position, stacked, *rest, _original=original, **kw):
            sizes.append(stacked.shape[0])
            return _original(self, fn, args, position, stacked, *rest, **kw)

        monkeypatch.setattr(be, name, recorded)
    w = torch.tensor([[[0.3, -0.5, 0.2]]], dtype=torch.float64)
    last = OneEntryOff.apply if broken else torch.sin

    def fn(t):
        return last(torch.nn.functional.conv1d(t, w))

    x = make(1, 1, 1500, seed=3)
    r = run(fn, (x,))
    assert ("coloured", "passed") in {(e.path, e.decision) for e in r.engine_log} or broken
    assert r.verdict is (not broken) is torch.autograd.gradcheck(fn, (x,), raise_exception=False)
    # a row's two stencil points are two copies
    assert sizes and max(sizes) <= 2 * cost.MAX_BATCH


@pytest.mark.parametrize("broken", [False, True])
def test_the_coloured_pass_calls_fn_plainly_where_batched_copies_cost_more(broken, monkeypatch):
    # a batched form that works 20 ms more per call (as a 3-D convolution costs 7.4 ms a
    # copy in a batch of 32, 3-4 ms alone): after the first chunk the coloured pass calls
    # fn once per move, priced against the probe's plain call; the verdict is the reference's
    from agcheck.engine.rows import Problem

    from .helpers import OneEntryOff, busy, make

    plain = []
    looped = Problem.evaluate_looped
    monkeypatch.setattr(Problem, "evaluate_looped", lambda self, *a: (plain.append(len(a[1])), looped(self, *a))[1])
    w = torch.tensor([[[0.3, -0.5, 0.2]]], dtype=torch.float64)
    last = OneEntryOff.apply if broken else torch.sin

    def fn(t):
        return last(torch.nn.functional.conv1d(t, w))

    x = make(1, 1, 1500, seed=3)
    assert run(fn, (x,)).verdict is (not broken) and not plain  # batched copies cost less here
    be = type(agcheck.get_backend("torch"))
    for name in ("evaluate_batch", "evaluate_stacked"):
        original = getattr(be, name)

        def slow(self, *args, _original=original, **kw):
            busy(0.02)
            return _original(self, *args, **kw)

        monkeypatch.setattr(be, name, slow)
    r = run(fn, (x,))
    assert r.verdict is (not broken) is torch.autograd.gradcheck(fn, (x,), raise_exception=False)
    if not broken:
        assert ("coloured", "passed") in {(e.path, e.decision) for e in r.engine_log}
        assert sum(plain) > 0
