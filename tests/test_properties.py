"""Property tests: agcheck's verdict equals torch.autograd.gradcheck's on random programs.

Random compositions (depth 1-3) of elementwise ops, reductions and matrix ops on random
shapes (1-4 dims of size 1-4) and dtypes (float64, complex128), with the true derivative
and with a randomly broken one (a custom autograd.Function whose backward is the true VJP,
scaled by a factor in [1.05, 2], one entry shifted, or sign flipped), in slow and fast mode.
Both checkers run with ``raise_exception=False``; the inputs must be bitwise unchanged.
Deterministic: derandomized examples, no example database (``AGCHECK_PROPERTY_EXAMPLES=N``
for N random ones).
"""
from __future__ import annotations

import warnings

import torch
from hypothesis import event, given
from hypothesis import strategies as st

import agcheck

from .helpers import property_settings

SETTINGS = property_settings(30)


# ops: name -> (fn(x, gen) -> y, valid for complex). Shapes may change (reductions,
# matmul, transpose); every op keeps at least one dimension.

def _elementwise(name):
    return {
        "sin": torch.sin,
        "exp": lambda x: torch.exp(0.5 * x),
        "tanh": torch.tanh,
        "square": lambda x: x * x,
        "sigmoid": torch.sigmoid,
    }[name]


ELEMENTWISE = ["sin", "exp", "tanh", "square", "sigmoid"]
REDUCTIONS = ["sum", "mean", "logsumexp", "cumsum"]
MATRIX = ["matmul", "transpose"]
REAL_ONLY = {"logsumexp"}  # complex logsumexp has no autograd formula on every version


@st.composite
def programs(draw):
    dtype = draw(st.sampled_from([torch.float64, torch.complex128]))
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim)))
    depth = draw(st.integers(1, 3))
    ops = []
    for _ in range(depth):
        kind = draw(st.sampled_from(["elementwise", "reduction", "matrix"]))
        if kind == "elementwise":
            ops.append((draw(st.sampled_from(ELEMENTWISE)), None))
        elif kind == "reduction":
            names = [n for n in REDUCTIONS if not (dtype.is_complex and n in REAL_ONLY)]
            ops.append((draw(st.sampled_from(names)), draw(st.integers(0, 3))))
        else:
            ops.append((draw(st.sampled_from(MATRIX)), draw(st.integers(1, 4))))
    breakage = draw(st.sampled_from(["none", "scaled", "entry", "sign"]))
    factor = draw(st.floats(1.05, 2.0))
    seed = draw(st.integers(0, 2**16))
    fast = draw(st.booleans())
    return dtype, shape, ops, breakage, factor, seed, fast


def build(dtype, shape, ops, seed):
    """fn(x) composing ``ops``; fixed matrices drawn from a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    steps = []
    cur = list(shape)
    for name, arg in ops:
        if name in ELEMENTWISE:
            steps.append(_elementwise(name))
        elif name in ("sum", "mean", "logsumexp", "cumsum"):
            dim = arg % len(cur)
            if name == "cumsum":
                steps.append(lambda x, d=dim: torch.cumsum(x, d))
            elif len(cur) == 1:
                steps.append(lambda x, d=dim, n=name: getattr(torch, n)(x, d, keepdim=True))
                cur[dim] = 1
            else:
                steps.append(lambda x, d=dim, n=name: getattr(torch, n)(x, d))
                cur.pop(dim)
        elif name == "matmul":
            m = torch.randn(cur[-1], arg, generator=gen, dtype=torch.float64)
            if dtype.is_complex:
                m = torch.complex(m, torch.randn(cur[-1], arg, generator=gen, dtype=torch.float64))
            steps.append(lambda x, m=m: x @ m)
            cur[-1] = arg
        elif name == "transpose":
            if len(cur) >= 2:
                steps.append(lambda x: x.transpose(-1, -2))
                cur[-1], cur[-2] = cur[-2], cur[-1]
        else:
            raise AssertionError(name)

    def fn(x):
        for f in steps:
            x = f(x)
        return x

    return fn


def broken(fn, breakage, factor):
    if breakage == "none":
        return fn

    class Broken(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            with torch.no_grad():
                return fn(x).clone()

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            with torch.enable_grad():
                xd = x.detach().requires_grad_(True)
                (gx,) = torch.autograd.grad(fn(xd), xd, g)
            if breakage == "scaled":
                return gx * factor
            if breakage == "sign":
                return -gx
            gx = gx.clone().contiguous()
            gx.view(-1)[0] += 1e-2 * float(gx.abs().max()) + 1e-2
            return gx

    return Broken.apply


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.contiguous().view(torch.int64).clone()


@SETTINGS
@given(programs())
def test_verdict_matches_torch(prog):
    dtype, shape, ops, breakage, factor, seed, fast = prog
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(shape, generator=gen, dtype=dtype).requires_grad_(True)
    fn = broken(build(dtype, shape, ops, seed), breakage, factor)
    before = bits(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        ref = torch.autograd.gradcheck(fn, (x,), raise_exception=False, fast_mode=fast)
        assert torch.equal(bits(x), before)
        torch.manual_seed(0)
        got = agcheck.gradcheck(fn, (x,), backend="torch", raise_exception=False, fast_mode=fast)
    assert torch.equal(bits(x), before), "agcheck changed its input"
    assert x.grad is None
    event(f"{breakage}: torch {'passes' if ref else 'fails'}")
    assert bool(got) == bool(ref), (
        f"agcheck={got} torch={ref} dtype={dtype} shape={shape} ops={ops} breakage={breakage} "
        f"factor={factor} seed={seed} fast={fast}"
    )
    if breakage == "none":
        assert ref, f"torch fails a correct program: {prog}"
