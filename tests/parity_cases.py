"""A catalog of gradcheck cases for parity tests between agcheck and torch.

Every :class:`Case` names a function, a factory for fresh inputs (double / complex128
tensors built from a *local* ``torch.Generator`` -- the global RNG is never touched), the
gradcheck keywords to use, and torch's verdict on it in slow and in fast mode, as measured
against ``torch.autograd.gradcheck`` (``tests/test_parity.py::test_torch_verdict_matches_catalog``
keeps these expectations honest).

Cases come in two halves per ``category``: ``broken=False`` cases are correct functions
(torch passes them), ``broken=True`` cases carry a deliberate bug (torch fails them).  A
few cases are *deliberate parity cases*: torch's verdict is surprising (a broken backward
that torch passes because the check that would catch it is disabled, a torch quirk that
raises an unrelated exception).  They carry ``parity_only=True`` and a note saying why
they are there; ``quirk=True`` marks torch behaviour that is arguably a torch bug.

Outcomes are spelled:

- ``"pass"``: gradcheck returns True;
- ``"fail"``: gradcheck raises GradcheckError (returns False with raise_exception=False);
- ``"raise:<ExceptionName>"``: gradcheck raises that exact exception type.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, Mapping

import torch

F64 = torch.float64
C128 = torch.complex128

PASS = "pass"
FAIL = "fail"


def RAISE(exc: type[BaseException]) -> str:
    return f"raise:{exc.__name__}"


# --------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class T:
    """Spec of one tensor input, materialized from a local generator.

    kind: "r" real normal, "c" complex normal, "pos" real in [0.5, 1.5) (log, sqrt, pow),
    "away" real with |x| in [0.3, 1.3) and random sign (kinks at 0 stay far away).
    """

    shape: tuple[int, ...]
    kind: str = "r"
    grad: bool = True
    noncontig: bool = False  # a transposed (non-contiguous) leaf of the same shape
    dtype: torch.dtype | None = None  # override (e.g. float32 parity cases)

    def make(self, g: torch.Generator) -> torch.Tensor:
        shape = self.shape[::-1] if self.noncontig else self.shape
        if self.kind == "c":
            re = torch.randn(shape, generator=g, dtype=F64)
            im = torch.randn(shape, generator=g, dtype=F64)
            x = torch.complex(re, im)
        elif self.kind == "pos":
            x = torch.rand(shape, generator=g, dtype=F64) + 0.5
        elif self.kind == "away":
            mag = torch.rand(shape, generator=g, dtype=F64) + 0.3
            sign = torch.randint(0, 2, shape, generator=g).to(F64) * 2 - 1
            x = mag * sign
        else:
            x = torch.randn(shape, generator=g, dtype=F64)
        if self.noncontig:
            x = x.transpose(0, -1) if x.dim() >= 2 else x
        if self.dtype is not None:
            x = x.to(self.dtype)
        x = x.detach()
        if self.grad:
            x.requires_grad_(True)
        return x


def R(*shape: int, **kw: Any) -> T:
    return T(tuple(shape), "r", **kw)


def C(*shape: int, **kw: Any) -> T:
    return T(tuple(shape), "c", **kw)


def POS(*shape: int, **kw: Any) -> T:
    return T(tuple(shape), "pos", **kw)


def AWAY(*shape: int, **kw: Any) -> T:
    return T(tuple(shape), "away", **kw)


class Inputs:
    """A factory for fresh inputs: each call builds new tensors from the same seed."""

    def __init__(self, *specs: Any, seed: int = 0) -> None:
        self.specs = specs
        self.seed = seed

    def __call__(self) -> tuple:
        g = torch.Generator().manual_seed(self.seed)
        return tuple(s.make(g) if isinstance(s, T) else s for s in self.specs)

    def __repr__(self) -> str:
        return f"Inputs({', '.join(map(repr, self.specs))}, seed={self.seed})"


class Special:
    """An input factory with hand-written construction (stride-0 inputs and the like)."""

    def __init__(self, build: Callable[[torch.Generator], tuple], seed: int = 0, desc: str = "") -> None:
        self.build = build
        self.seed = seed
        self.desc = desc

    def __call__(self) -> tuple:
        return self.build(torch.Generator().manual_seed(self.seed))

    def __repr__(self) -> str:
        return f"Special({self.desc!r}, seed={self.seed})"


def _const(*shape: int, seed: int, complex: bool = False) -> torch.Tensor:
    """A fixed constant tensor (not an input) from a private generator."""
    g = torch.Generator().manual_seed(seed)
    if complex:
        return torch.complex(torch.randn(shape, generator=g, dtype=F64), torch.randn(shape, generator=g, dtype=F64))
    return torch.randn(shape, generator=g, dtype=F64)


# --------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    fn: Callable
    make_inputs: Callable[[], tuple]
    category: str
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    slow: str = PASS  # torch's outcome with fast_mode=False
    fast: str = PASS  # torch's outcome with fast_mode=True
    broken: bool = False
    phrase: str | None = None  # the key phrase torch's failure message carries (slow mode)
    fast_phrase: str | None = None  # ... in fast mode, when it differs from ``phrase``
    parity_only: bool = False  # torch's verdict is not what the "broken" label suggests
    quirk: bool = False  # torch behaviour that is arguably a torch bug
    note: str = ""
    watch: tuple = ()  # tensors outside the inputs (closures) whose bits and .grad must not change

    def expected(self, fast_mode: bool) -> str:
        return self.fast if fast_mode else self.slow

    def expected_phrase(self, fast_mode: bool) -> str | None:
        if fast_mode and self.fast_phrase is not None:
            return self.fast_phrase
        return self.phrase

    def __repr__(self) -> str:  # used in pytest failure output
        return f"Case({self.name})"


CASES: list[Case] = []


def case(name: str, fn: Callable, inputs: Callable[[], tuple], category: str, *,
         expect: str = PASS, fast: str | None = None, **kw: Any) -> Case:
    c = Case(name, fn, inputs, category, slow=expect, fast=expect if fast is None else fast, **kw)
    if any(o.name == name for o in CASES):
        raise ValueError(f"duplicate case name {name}")
    CASES.append(c)
    return c


def broken(name: str, fn: Callable, inputs: Callable[[], tuple], category: str, *,
           phrase: str, expect: str = FAIL, fast: str | None = None, **kw: Any) -> Case:
    return case(name, fn, inputs, category, expect=expect, fast=fast, broken=True, phrase=phrase, **kw)


def jac(out: int = 0, inp: int = 0, *, forward: bool = False, part: str | None = None,
        element: str | None = None) -> str:
    """The key phrase of a Jacobian mismatch."""
    mode = "computed with forward mode " if forward else ""
    s = f"Jacobian {mode}mismatch for output {out} with respect to input {inp}"
    if part is not None:
        element = element or ("inputs" if forward else "outputs")
        s = f"While considering the {part} part of complex {element} only, " + s
    return s


# --------------------------------------------------------------------------------------
# custom autograd.Function factories
# --------------------------------------------------------------------------------------


def unary(name: str, f: Callable, df: Callable, *, bwd: Callable | None = None,
          jvp: Callable | None = None, materialize: bool = True) -> type[torch.autograd.Function]:
    """An elementwise custom Function y = f(x) with derivative df.

    ``bwd(g, x)`` replaces the correct backward ``g * conj(df(x))`` and ``jvp(t, x)``
    replaces the correct jvp ``t * df(x)`` (that is how broken variants are made).
    """

    def forward(ctx, x):
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        ctx.set_materialize_grads(materialize)
        return f(x)

    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        if bwd is not None:
            return bwd(g, x)
        return g * df(x).conj()

    def jvp_(ctx, t):
        (x,) = ctx.saved_tensors
        if jvp is not None:
            return jvp(t, x)
        return t * df(x)

    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward),
        "backward": staticmethod(backward),
        "jvp": staticmethod(jvp_),
    })


def _sin(x):
    return x.sin()


def _cos(x):
    return x.cos()


def _exp(x):
    return x.exp()


# --- correct customs -------------------------------------------------------------------

Sin = unary("Sin", _sin, _cos)
Exp = unary("Exp", _exp, _exp)


class SumSin(torch.autograd.Function):
    """y = sum(sin(x)) (a single-element output); correct backward and jvp."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        return x.sin().sum()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos()

    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return (t * x.cos()).sum()


class SumSinIgnoresGrad(SumSin):
    """Backward returns the Jacobian row (cos x) whatever grad_output is."""

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return x.cos()


class MulTwo(torch.autograd.Function):
    """(x, y) -> x * y with correct backward and jvp; ``bad_input`` breaks one grad."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        ctx.save_for_forward(x, y)
        return x * y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y.conj(), g * x.conj()

    @staticmethod
    def jvp(ctx, tx, ty):
        x, y = ctx.saved_tensors
        return tx * y + ty * x


class MulTwoBadGradY(MulTwo):
    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y.conj(), g * x.conj() * 1.5


class MulTwoBadJvpY(MulTwo):
    @staticmethod
    def jvp(ctx, tx, ty):
        x, y = ctx.saved_tensors
        return tx * y + 1.5 * ty * x


class SinCos(torch.autograd.Function):
    """x -> (sin x, cos x): two outputs, correct backward; grads may arrive undefined."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        ctx.set_materialize_grads(False)
        return x.sin(), x.cos()

    @staticmethod
    def backward(ctx, g1, g2):
        (x,) = ctx.saved_tensors
        out = None
        if g1 is not None:
            out = g1 * x.cos()
        if g2 is not None:
            out = -g2 * x.sin() if out is None else out - g2 * x.sin()
        return out

    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return t * x.cos(), -t * x.sin()


class SinCosBadSecond(SinCos):
    """The gradient through the second output is off by a factor 2."""

    @staticmethod
    def backward(ctx, g1, g2):
        (x,) = ctx.saved_tensors
        out = None
        if g1 is not None:
            out = g1 * x.cos()
        if g2 is not None:
            out = -2 * g2 * x.sin() if out is None else out - 2 * g2 * x.sin()
        return out


class SinCosRaisesOnOneUndefined(SinCos):
    """Handles 'all grads undefined' but raises when only one of two is undefined."""

    @staticmethod
    def backward(ctx, g1, g2):
        (x,) = ctx.saved_tensors
        if g1 is None and g2 is None:
            return None
        if g1 is None or g2 is None:
            raise RuntimeError("SinCosRaisesOnOneUndefined: one grad_output is undefined")
        return g1 * x.cos() - g2 * x.sin()


# --- linear maps (transposition bugs) -------------------------------------------------

_W = _const(3, 3, seed=1234)  # a fixed, non-symmetric square matrix


class LinearW(torch.autograd.Function):
    """x -> W @ x for a fixed square W; correct backward W^T g."""

    @staticmethod
    def forward(ctx, x):
        return _W @ x

    @staticmethod
    def backward(ctx, g):
        return _W.t() @ g

    @staticmethod
    def jvp(ctx, t):
        return _W @ t


class LinearWTransposed(LinearW):
    @staticmethod
    def backward(ctx, g):
        return _W @ g


class LinearWTransposedJvp(LinearW):
    @staticmethod
    def jvp(ctx, t):
        return _W.t() @ t


class MatMul(torch.autograd.Function):
    """(A, B) -> A @ B, correct backward."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g @ b.t(), a.t() @ g


class MatMulTransposedGradB(MatMul):
    """grad_B forgets a transpose (only shape-compatible for square matrices)."""

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g @ b.t(), a @ g


class ExpOneOff(torch.autograd.Function):
    """Elementwise exp whose Jacobian has one extra (off-diagonal) entry: d y[2] / d x[0]."""

    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        gi = g * y
        gf = gi.reshape(-1).clone()
        gf[0] = gf[0] + 0.25 * g.reshape(-1)[2]
        return gf.reshape(gi.shape)


class ExpOneOffDiag(torch.autograd.Function):
    """Elementwise exp whose Jacobian's diagonal entry 1 is off by 0.5."""

    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        gi = (g * y).reshape(-1).clone()
        gi[1] = gi[1] + 0.5 * g.reshape(-1)[1]
        return gi.reshape(g.shape)


# --- complex ----------------------------------------------------------------------------

_CC = complex(0.3, 1.7)


class CMul(torch.autograd.Function):
    """C -> C: z -> c z, correct backward g * conj(c) and jvp t * c."""

    @staticmethod
    def forward(ctx, z):
        return z * _CC

    @staticmethod
    def backward(ctx, g):
        return g * _CC.conjugate()

    @staticmethod
    def jvp(ctx, t):
        return t * _CC


class CMulNoConj(CMul):
    @staticmethod
    def backward(ctx, g):
        return g * _CC


class CMulConjJvp(CMul):
    @staticmethod
    def jvp(ctx, t):
        return t * _CC.conjugate()


class CMulBadForRealGrad(CMul):
    """Correct for purely imaginary grad_output, wrong (doubled) for the real part."""

    @staticmethod
    def backward(ctx, g):
        return (2 * g.real + 1j * g.imag) * _CC.conjugate()


class CMulBadForImagGrad(CMul):
    """Correct for purely real grad_output, wrong (doubled) for the imaginary part."""

    @staticmethod
    def backward(ctx, g):
        return (g.real + 2j * g.imag) * _CC.conjugate()


class CMulBadJvpImagTangent(CMul):
    """jvp is right for real tangents, doubled for imaginary ones."""

    @staticmethod
    def jvp(ctx, t):
        return (t.real + 2j * t.imag) * _CC


class CMulBadJvpRealTangent(CMul):
    """jvp is right for imaginary tangents, doubled for real ones."""

    @staticmethod
    def jvp(ctx, t):
        return (2 * t.real + 1j * t.imag) * _CC


class CSquare(torch.autograd.Function):
    """C -> C: z -> z^2, correct backward g * conj(2 z)."""

    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        ctx.save_for_forward(z)
        return z * z

    @staticmethod
    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        return g * (2 * z).conj()

    @staticmethod
    def jvp(ctx, t):
        (z,) = ctx.saved_tensors
        return t * 2 * z


class CSquareNoConj(CSquare):
    @staticmethod
    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        return g * 2 * z


class CRealPart(torch.autograd.Function):
    """C -> R: z -> Re(c z), correct backward g * conj(c)."""

    @staticmethod
    def forward(ctx, z):
        return (z * _CC).real

    @staticmethod
    def backward(ctx, g):
        return g * _CC.conjugate()

    @staticmethod
    def jvp(ctx, t):
        return (t * _CC).real


class CRealPartNoConj(CRealPart):
    @staticmethod
    def backward(ctx, g):
        return g * _CC


class CAbs2(torch.autograd.Function):
    """C -> R: z -> |z|^2, correct backward 2 g z."""

    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        return (z * z.conj()).real

    @staticmethod
    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        return 2 * g * z


class CAbs2Conj(CAbs2):
    """Returns the conjugate of the right gradient."""

    @staticmethod
    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        return 2 * g * z.conj()


class RToC(torch.autograd.Function):
    """R -> C: x -> c x, correct backward Re(g * conj(c))."""

    @staticmethod
    def forward(ctx, x):
        return x * _CC

    @staticmethod
    def backward(ctx, g):
        return (g * _CC.conjugate()).real

    @staticmethod
    def jvp(ctx, t):
        return t * _CC


class RToCNoConj(RToC):
    @staticmethod
    def backward(ctx, g):
        return (g * _CC).real


# --- grad_output handling --------------------------------------------------------------

SinIgnoresGrad = unary("SinIgnoresGrad", _sin, _cos, bwd=lambda g, x: x.cos())
SinAddsTinyConstant = unary("SinAddsTinyConstant", _sin, _cos, bwd=lambda g, x: g * x.cos() + 1e-9)

# --- nondeterminism --------------------------------------------------------------------

_NOISE_GEN = torch.Generator().manual_seed(987654321)


def _noisy_bwd(g, x):
    noise = torch.rand(x.shape, generator=_NOISE_GEN, dtype=x.dtype) * 1e-10
    return g * (x.cos() + noise)


SinNondet = unary("SinNondet", _sin, _cos, bwd=_noisy_bwd)

# --- undefined grads -------------------------------------------------------------------


def _raise_if_undefined(g, x):
    if g is None:
        raise RuntimeError("SinRaisesOnUndefined: grad_output is undefined")
    return g * x.cos()


def _none_if_undefined(g, x):
    return None if g is None else g * x.cos()


def _ones_if_undefined(g, x):
    return torch.ones_like(x) if g is None else g * x.cos()


SinHandlesUndefined = unary("SinHandlesUndefined", _sin, _cos, bwd=_none_if_undefined, materialize=False)
SinRaisesOnUndefined = unary("SinRaisesOnUndefined", _sin, _cos, bwd=_raise_if_undefined, materialize=False)
SinTypeErrorOnUndefined = unary("SinTypeErrorOnUndefined", _sin, _cos, materialize=False)  # None * tensor
SinOnesOnUndefined = unary("SinOnesOnUndefined", _sin, _cos, bwd=_ones_if_undefined, materialize=False)

# --- vmap / batched --------------------------------------------------------------------


def _item_bwd(g, x):
    if g.abs().max().item() > 1e300:  # .item() is not vmappable
        raise AssertionError("unreachable")
    return g * x.cos()


def _item_jvp(t, x):
    if t.abs().max().item() > 1e300:
        raise AssertionError("unreachable")
    return t * x.cos()


def _is_batched(t):
    f = torch._C._functorch
    return bool(f.is_batchedtensor(t) or f.is_legacy_batchedtensor(t))


def _batched_differs_bwd(g, x):
    return (2.0 if _is_batched(g) else 1.0) * g * x.cos()


def _batched_differs_jvp(t, x):
    return (2.0 if _is_batched(t) else 1.0) * t * x.cos()


SinItemBackward = unary("SinItemBackward", _sin, _cos, bwd=_item_bwd)
SinItemJvp = unary("SinItemJvp", _sin, _cos, jvp=_item_jvp)
SinBatchedDiffersBackward = unary("SinBatchedDiffersBackward", _sin, _cos, bwd=_batched_differs_bwd)
SinBatchedDiffersJvp = unary("SinBatchedDiffersJvp", _sin, _cos, jvp=_batched_differs_jvp)

# --- forward AD ------------------------------------------------------------------------

SinJvpScaled = unary("SinJvpScaled", _sin, _cos, jvp=lambda t, x: 2 * t * x.cos())
SinBwdScaled = unary("SinBwdScaled", _sin, _cos, bwd=lambda g, x: 2 * g * x.cos())
SinBwdScaled1p01 = unary("SinBwdScaled1p01", _sin, _cos, bwd=lambda g, x: 1.01 * g * x.cos())
SinJvpComplexTangent = unary("SinJvpComplexTangent", _sin, _cos, jvp=lambda t, x: (t * x.cos()).to(C128))


class SinNoJvp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos()


class MulTwoUndefTangent(MulTwo):
    """jvp differs when x's tangent is undefined rather than zero."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.set_materialize_grads(False)
        return MulTwo.forward(ctx, x, y)

    @staticmethod
    def jvp(ctx, tx, ty):
        x, y = ctx.saved_tensors
        out = torch.zeros_like(x)
        if tx is not None:
            out = out + tx * y
        if ty is not None:
            out = out + ty * x
        if tx is None:
            out = out + 1.0
        return out


class MulTwoUndefTangentOk(MulTwo):
    """jvp (and backward) that handle undefined tangents (grads) correctly."""

    @staticmethod
    def backward(ctx, g):
        if g is None:
            return None, None
        x, y = ctx.saved_tensors
        return g * y.conj(), g * x.conj()

    @staticmethod
    def forward(ctx, x, y):
        ctx.set_materialize_grads(False)
        return MulTwo.forward(ctx, x, y)

    @staticmethod
    def jvp(ctx, tx, ty):
        x, y = ctx.saved_tensors
        out = torch.zeros_like(x)
        if tx is not None:
            out = out + tx * y
        if ty is not None:
            out = out + ty * x
        return out


# --- gradient dtype / size -------------------------------------------------------------

SinGradFloat32 = unary("SinGradFloat32", _sin, _cos, bwd=lambda g, x: (g * x.cos()).float())
SinGradComplex = unary("SinGradComplex", _sin, _cos, bwd=lambda g, x: (g * x.cos()).to(C128))
SinGradTooShort = unary("SinGradTooShort", _sin, _cos, bwd=lambda g, x: (g * x.cos())[:2])
SinGradBroadcastable = unary("SinGradBroadcastable", _sin, _cos, bwd=lambda g, x: (g * x.cos()).unsqueeze(0))


# --------------------------------------------------------------------------------------
# plain functions (named, so that reports read well)
# --------------------------------------------------------------------------------------


def f_sin(x):
    return torch.sin(x)


def f_mul_add(x, y):
    return x * y + x.exp()


def f_matmul(a, b):
    return a @ b


def f_sum(x):
    return x.sum()


def f_mean_dim(x):
    return x.mean(dim=1)


def f_prod(x):
    return x.prod()


def f_norm(x):
    return x.norm()


def f_logsumexp(x):
    return torch.logsumexp(x, dim=-1)


def f_max_dim(x):
    v, i = x.max(dim=1)  # values (float) then indices (int64)
    return v, i


def f_three_outputs(x, y):
    return x.sin(), x * y, y.sum()


def f_list_output(x):
    return [x.sin(), x.cos()]


def f_passthrough(x, k, scale, mode, nothing):
    assert isinstance(k, int) and isinstance(scale, float) and mode == "sq" and nothing is None
    return (x ** k) * scale


def f_weight_no_grad(x, w):
    return (w * x).sin()


def f_output_no_grad_second(x):
    return x.sin(), x.detach() * 2


def f_output_no_grad_first(x):
    return x.detach() * 2, x.sin()


def f_output_constant_second(x):
    return x.exp(), torch.ones(2, dtype=F64)


def f_int_after_float(x):
    return x * 2, (x > 0).sum(), x.argmax()


def f_int_before_float(x):
    return x.argmax(), x.sin()


def f_view_outputs(x):
    return x[0], x.t(), x.reshape(-1)[1:4]


def f_scalar_exp(x):
    return x.exp()


def f_double(x):
    return x * 2


def f_log_sqrt(x):
    return x.log() + x.sqrt()


def f_abs(x):
    return x.abs()


def f_relu(x):
    return torch.relu(x)


def f_cube(x):
    return x ** 3


# complex builtins
def f_c_square(z):
    return z * z


def f_c_exp(z):
    return z.exp()


def f_c_conj_mul(z, w):
    return z.conj() * w


def f_c_abs(z):
    return z.abs()


def f_c_abs2_sum(z):
    return (z * z.conj()).real.sum()


def f_c_real_imag(z):
    return z.real * 2 + z.imag ** 2


def f_c_angle(z):
    return z.angle()


def f_r_to_c(x):
    return x * (1 + 2j)


def f_r_to_c_polar(r, theta):
    return torch.polar(r, theta)


def f_r_complex(x, y):
    return torch.complex(x, y)


def f_mixed(z, x):
    return z * x, (z.abs() * x).sum()


def f_c_matmul(a, b):
    return a @ b


def f_view_as_real(z):
    return torch.view_as_real(z * z)


# no differentiable outputs
def f_nodiff_depends(x):
    return x.detach() * 2


def f_nodiff_constant(x):
    return torch.ones(3, dtype=F64)


def f_nodiff_step(x):
    return (x > 0).to(F64)


def f_nodiff_int(x):
    return x.argmax()


def f_nodiff_two(x):
    return x.detach().sin(), (x.detach() > 0).sum()


def f_shape_changes(x):
    # the output's shape depends on the value: fine at x, different at x + eps
    n = 3 if float(x.detach()[0]) >= 0.5 else 2
    return x[:n] * 2


def f_none_output(x):
    return x.sin(), None


def f_sparse_output(x):
    return x.to_sparse()


def f_identity(x):
    return x


def f_same_tensor_twice(a, b):
    return a * b.exp()


def f_nested_list_input(x, lst):
    return x * lst[0]


class Box:
    """A non-iterable holder: the function reads the weight through it (a closure-like path)."""

    def __init__(self, w: torch.Tensor) -> None:
        self.w = w

    def __repr__(self) -> str:
        return "Box(w)"


def f_reads_through_box(x, w, box):
    # ignores its argument ``w`` and reads the same tensor through ``box``: only an
    # in-place perturbation of ``w`` is seen by the function
    return x * box.w.exp()


def f_nan_output(x):
    return x / 0 * 0


def f_c_square_0d(z):
    return z * z


def f_raises_when_perturbed_up(x):
    if float(x.detach()[0]) > 0.5:
        raise RuntimeError("f_raises_when_perturbed_up refuses x[0] > 0.5")
    return x * 2


def f_dtype_changes(x):
    y = x * 2
    return y if float(x.detach()[0]) <= 0.5 else y.float()


def _at_half(g):
    return (torch.tensor([0.5, 0.1, -0.2], dtype=F64).requires_grad_(),)


def f_expand_output(x):
    return x.expand(2, 3)


def f_unused_input(x, y):
    return x.sin()


def f_index_select(x, idx):
    return x.index_select(0, idx)


def _with_index(g):
    return (torch.randn(3, generator=g, dtype=F64).requires_grad_(), torch.tensor([2, 0]))


def _sparse_coo(g):
    mask = torch.tensor([[1.0, 0, 1], [0, 1, 0]], dtype=F64)
    return ((torch.randn(2, 3, generator=g, dtype=F64) * mask).to_sparse().requires_grad_(),)


def _sparse_csr(g):
    mask = torch.tensor([[1.0, 0, 1], [0, 1, 0]], dtype=F64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Sparse CSR tensor support is in beta state"
        return ((torch.randn(2, 3, generator=g, dtype=F64) * mask).to_sparse_csr().requires_grad_(),)


def f_sparse_to_dense_masked(s):
    return s.to_dense(masked_grad=True) * 2


def f_sparse_to_dense(s):
    return s.to_dense() * 2


_CLOSURE_PARAM = _const(3, seed=4321).requires_grad_()


def f_closure_param_output(x):
    # the second output requires grad but depends on no input
    return x.sin(), _CLOSURE_PARAM * 2


def f_int_in_middle(x):
    return x.sin(), x.argmax(), x.cos()


def f_empty_and_full(e, y):
    return e * 2, y.sin()


class RealAndComplexOutputs(torch.autograd.Function):
    """R -> (R, C): x -> (sin x, c x), correct backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin(), x * _CC

    @staticmethod
    def backward(ctx, g1, g2):
        (x,) = ctx.saved_tensors
        return g1 * x.cos() + (g2 * _CC.conjugate()).real


class RealAndComplexOutputsNoConj(RealAndComplexOutputs):
    @staticmethod
    def backward(ctx, g1, g2):
        (x,) = ctx.saved_tensors
        return g1 * x.cos() + (g2 * _CC).real


class MulTwoReturnsNone(MulTwo):
    @staticmethod
    def backward(ctx, g):
        return None, None


SinBwdScaled1p0105 = unary("SinBwdScaled1p0105", _sin, _cos, bwd=lambda g, x: 1.0105 * g * x.cos())
SinBwdPlus1em4 = unary("SinBwdPlus1em4", _sin, _cos, bwd=lambda g, x: g * (x.cos() + 1e-4))


# --- several bugs at once: which check reports first -----------------------------------

def _noisy_scaled_bwd(g, x):
    noise = torch.rand(x.shape, generator=_NOISE_GEN, dtype=x.dtype) * 1e-10
    return 2 * g * (x.cos() + noise)


def _item_and_constant_bwd(g, x):
    if g.abs().max().item() > 1e300:
        raise AssertionError("unreachable")
    return g * x.cos() + 1e-9


def _constant_and_undefined_bwd(g, x):
    return torch.ones_like(x) if g is None else g * x.cos() + 1e-9


SinNondetAndScaled = unary("SinNondetAndScaled", _sin, _cos, bwd=_noisy_scaled_bwd)
SinBwdAndJvpScaled = unary("SinBwdAndJvpScaled", _sin, _cos, bwd=lambda g, x: 2 * g * x.cos(),
                           jvp=lambda t, x: 3 * t * x.cos())
SinItemAndConstant = unary("SinItemAndConstant", _sin, _cos, bwd=_item_and_constant_bwd)
SinConstantAndUndefined = unary("SinConstantAndUndefined", _sin, _cos, bwd=_constant_and_undefined_bwd,
                                materialize=False)
SinItemJvpAndItemBwd = unary("SinItemJvpAndItemBwd", _sin, _cos, bwd=_item_bwd, jvp=_item_jvp)
SinBatchedDiffersBoth = unary("SinBatchedDiffersBoth", _sin, _cos, bwd=_batched_differs_bwd,
                              jvp=_batched_differs_jvp)


class MulTwoUndefTangentRaisesUndefGrad(MulTwoUndefTangent):
    @staticmethod
    def backward(ctx, g):
        if g is None:
            raise RuntimeError("MulTwoUndefTangentRaisesUndefGrad: grad_output is undefined")
        x, y = ctx.saved_tensors
        return g * y, g * x


class RToCConjJvp(RToC):
    @staticmethod
    def jvp(ctx, t):
        return t * _CC.conjugate()


def _same_twice(g):
    x = torch.randn(3, generator=g, dtype=F64).requires_grad_()
    return (x, x)


def _nonleaf(g):
    base = torch.randn(2, 3, generator=g, dtype=F64).requires_grad_()
    x = base * 2
    x._parity_base = base  # the test harness checks that base.grad stays None too
    return (x,)


def _leaf_view(g):
    base = torch.randn(4, generator=g, dtype=F64).requires_grad_()
    x = base[1:]
    x._parity_base = base
    return (x,)


def _through_box(g):
    x = torch.randn(3, generator=g, dtype=F64).requires_grad_()
    w = torch.randn(3, generator=g, dtype=F64).requires_grad_()
    return (x, w, Box(w))


def _nested_list(g):
    x = torch.randn(3, generator=g, dtype=F64).requires_grad_()
    y = torch.randn(3, generator=g, dtype=F64).requires_grad_()
    return (x, [y])


def _bare_tensor(g):
    return torch.randn(2, 3, generator=g, dtype=F64).requires_grad_()


def _list_of_inputs(g):
    return [torch.randn(3, generator=g, dtype=F64).requires_grad_(),
            torch.randn(3, generator=g, dtype=F64).requires_grad_()]


# --------------------------------------------------------------------------------------
# the catalog
# --------------------------------------------------------------------------------------

FWD = {"check_forward_ad": True}
FWD_ONLY = {"check_forward_ad": True, "check_backward_ad": False}

# --- structure: correct functions of many shapes ---------------------------------------
case("sin_builtin", f_sin, Inputs(R(3)), "structure")
case("sin_builtin_2x3", f_sin, Inputs(R(2, 3), seed=1), "structure")
case("mul_add_two_inputs", f_mul_add, Inputs(R(3), R(3), seed=2), "structure")
case("matmul", f_matmul, Inputs(R(2, 3), R(3, 2), seed=3), "structure")
case("sum", f_sum, Inputs(R(2, 3), seed=4), "structure")
case("mean_dim", f_mean_dim, Inputs(R(2, 3), seed=5), "structure")
case("prod", f_prod, Inputs(AWAY(3), seed=6), "structure")
case("norm", f_norm, Inputs(R(2, 3), seed=7), "structure")
case("logsumexp", f_logsumexp, Inputs(R(2, 3), seed=8), "structure")
case("max_dim_values_then_indices", f_max_dim, Inputs(R(2, 3), seed=9), "structure",
     note="a float output followed by an integer output")
case("three_outputs", f_three_outputs, Inputs(R(3), R(3), seed=10), "structure")
case("list_output", f_list_output, Inputs(R(3), seed=11), "structure")
case("non_tensor_passthrough", f_passthrough, Inputs(R(3), 2, 0.5, "sq", None, seed=12), "structure")
case("input_not_requiring_grad", f_weight_no_grad, Inputs(R(3), R(3, grad=False), seed=13), "structure")
case("input_not_requiring_grad_first", lambda w, x: f_weight_no_grad(x, w),
     Inputs(R(3, grad=False), R(3), seed=14), "structure")
case("output_not_requiring_grad_second", f_output_no_grad_second, Inputs(R(3), seed=15), "structure")
case("output_constant_second", f_output_constant_second, Inputs(R(3), seed=16), "structure")
case("int_outputs_after_float", f_int_after_float, Inputs(R(3), seed=17), "structure")
case("view_outputs", f_view_outputs, Inputs(R(2, 3), seed=18), "structure")
case("scalar_0d_input", f_scalar_exp, Inputs(R(), seed=19), "structure")
case("empty_input", f_double, Inputs(R(0), seed=20), "structure")
case("noncontiguous_input", f_sin, Inputs(R(2, 3, noncontig=True), seed=21), "structure")
case("log_sqrt_positive", f_log_sqrt, Inputs(POS(2, 3), seed=22), "structure")
case("abs_away_from_kink", f_abs, Inputs(AWAY(3), seed=23), "structure")
case("relu_away_from_kink", f_relu, Inputs(AWAY(2, 3), seed=24), "structure")
case("forward_ad_builtins", f_mul_add, Inputs(R(3), R(3), seed=25), "structure", kwargs=FWD)
case("forward_ad_matmul", f_matmul, Inputs(R(2, 3), R(3, 2), seed=26), "structure", kwargs=FWD)
case("forward_ad_multi_output", f_three_outputs, Inputs(R(3), R(3), seed=27), "structure", kwargs=FWD)
case("forward_ad_int_after_float", f_int_after_float, Inputs(R(3), seed=28), "structure", kwargs=FWD)
case("forward_ad_passthrough", f_passthrough, Inputs(R(3), 2, 0.5, "sq", None, seed=29), "structure", kwargs=FWD)
case("forward_ad_input_no_grad", f_weight_no_grad, Inputs(R(3), R(3, grad=False), seed=30), "structure",
     kwargs=FWD)

case("matmul_8x8_chunks", f_matmul, Inputs(R(8, 8), R(8, 8), seed=31), "structure",
     note="64 x 64 Jacobians: big enough to exercise chunked comparison")
case("identity", f_identity, Inputs(R(2, 3), seed=32), "structure")
case("same_tensor_twice", f_same_tensor_twice, Special(_same_twice, seed=33, desc="(x, x)"), "structure")
case("nonleaf_input", f_sin, Special(_nonleaf, seed=34, desc="(base * 2,)"), "structure")
case("view_of_leaf_input", f_sin, Special(_leaf_view, seed=35, desc="(base[1:],)"), "structure")
case("reads_input_through_box", f_reads_through_box, Special(_through_box, seed=36, desc="(x, w, Box(w))"),
     "structure", note="numerical gradients must perturb w in place to see the change through the box")
case("bare_tensor_inputs", f_sin, Special(_bare_tensor, seed=37, desc="a tensor, not a tuple"), "structure")
case("list_of_inputs", f_mul_add, Special(_list_of_inputs, seed=38, desc="a list, not a tuple"), "structure")
case("expand_output", f_expand_output, Inputs(R(3), seed=100_001), "structure",
     kwargs={"check_forward_ad": True, "check_batched_grad": True})
case("unused_input", f_unused_input, Inputs(R(3), R(3), seed=100_002), "structure",
     kwargs={"check_forward_ad": True, "check_batched_grad": True, "check_batched_forward_grad": True})
case("int_tensor_passthrough", f_index_select, Special(_with_index, seed=100_003, desc="(x, LongTensor)"),
     "structure", kwargs=FWD)
case("identity_forward_ad", f_identity, Inputs(R(2, 3), seed=100_004), "structure", kwargs=FWD)
case("closure_param_output", f_closure_param_output, Inputs(R(3), seed=100_005), "structure",
     watch=(_CLOSURE_PARAM,), note="an output that requires grad through a closure, not through the inputs")
case("empty_and_full_inputs", f_empty_and_full, Inputs(R(0), R(3), seed=100_006), "structure", kwargs=FWD)
case("masked_dense_input", f_sin, Inputs(R(3), seed=39), "structure", kwargs={"masked": True})

# --- complex builtins ----------------------------------------------------------------
case("c2c_square", f_c_square, Inputs(C(3), seed=40), "complex")
case("c2c_exp_2x3", f_c_exp, Inputs(C(2, 3), seed=41), "complex")
case("c2c_conj_mul_two_inputs", f_c_conj_mul, Inputs(C(3), C(3), seed=42), "complex")
case("c2c_matmul", f_c_matmul, Inputs(C(2, 3), C(3, 2), seed=43), "complex")
case("c2r_abs", f_c_abs, Inputs(C(3), seed=44), "complex")
case("c2r_abs2_sum", f_c_abs2_sum, Inputs(C(3), seed=45), "complex")
case("c2r_real_imag", f_c_real_imag, Inputs(C(3), seed=46), "complex")
case("c2r_angle", f_c_angle, Inputs(C(3), seed=47), "complex")
case("c2r_view_as_real", f_view_as_real, Inputs(C(3), seed=48), "complex")
case("r2c_scale", f_r_to_c, Inputs(R(3), seed=49), "complex")
case("r2c_polar", f_r_to_c_polar, Inputs(POS(3), R(3), seed=50), "complex")
case("r2c_complex", f_r_complex, Inputs(R(3), R(3), seed=51), "complex")
case("mixed_complex_real_inputs", f_mixed, Inputs(C(3), R(3), seed=52), "complex")
case("c2c_square_0d", f_c_square_0d, Inputs(C(), seed=57), "complex", kwargs=FWD)
case("c2c_forward_ad", f_c_square, Inputs(C(3), seed=53), "complex", kwargs=FWD)
case("c2r_forward_ad", f_c_abs, Inputs(C(3), seed=54), "complex", kwargs=FWD)
case("r2c_forward_ad", f_r_to_c_polar, Inputs(POS(3), R(3), seed=55), "complex", kwargs=FWD)
case("mixed_forward_ad", f_mixed, Inputs(C(3), R(3), seed=56), "complex", kwargs=FWD)

# --- custom Functions, correct -----------------------------------------------------------
case("custom_sin", Sin.apply, Inputs(R(3), seed=60), "scaled")
case("custom_sin_fwd", Sin.apply, Inputs(R(2, 3), seed=61), "forward_ad", kwargs=FWD)
case("custom_mul_two", MulTwo.apply, Inputs(R(3), R(3), seed=62), "multi_input", kwargs=FWD)
case("custom_sincos_two_outputs", SinCos.apply, Inputs(R(3), seed=63), "multi_output", kwargs=FWD)
case("custom_linear_w", LinearW.apply, Inputs(R(3), seed=64), "transposed", kwargs=FWD)
case("custom_matmul_square", MatMul.apply, Inputs(R(3, 3), R(3, 3), seed=65), "transposed")
case("custom_exp", Exp.apply, Inputs(R(2, 3), seed=66), "one_entry_off")
case("custom_c2c_mul", CMul.apply, Inputs(C(3), seed=67), "conj", kwargs=FWD)
case("custom_c2c_square", CSquare.apply, Inputs(C(3), seed=68), "conj", kwargs=FWD)
case("custom_c2r_realpart", CRealPart.apply, Inputs(C(3), seed=69), "conj", kwargs=FWD)
case("custom_c2r_abs2", CAbs2.apply, Inputs(C(3), seed=70), "conj")
case("custom_r2c", RToC.apply, Inputs(R(3), seed=71), "conj", kwargs=FWD)
case("custom_sumsin_scalar_output", SumSin.apply, Inputs(R(3), seed=72), "grad_output", kwargs=FWD)
case("custom_sin_grad_output", Sin.apply, Inputs(R(3), seed=73), "grad_output")
case("custom_sin_nondet_tol0", Sin.apply, Inputs(R(3), seed=74), "nondeterministic",
     kwargs={"nondet_tol": 0.0})
case("custom_handles_undefined", SinHandlesUndefined.apply, Inputs(R(3), seed=75), "undefined_grad")
case("custom_sincos_handles_undefined", SinCos.apply, Inputs(R(3), seed=76), "undefined_grad")
case("custom_sin_batched", Sin.apply, Inputs(R(3), seed=77), "batched", kwargs={"check_batched_grad": True})
case("builtin_batched", f_three_outputs, Inputs(R(3), R(3), seed=78), "batched",
     kwargs={"check_batched_grad": True})
case("builtin_batched_complex", f_c_conj_mul, Inputs(C(3), C(3), seed=79), "batched",
     kwargs={"check_batched_grad": True})
case("custom_sin_batched_forward", Sin.apply, Inputs(R(3), seed=80), "batched",
     kwargs={"check_forward_ad": True, "check_batched_forward_grad": True})
case("builtin_batched_forward", f_mul_add, Inputs(R(3), R(3), seed=81), "batched",
     kwargs={"check_forward_ad": True, "check_batched_forward_grad": True, "check_batched_grad": True})
case("custom_undef_tangent_ok", MulTwoUndefTangentOk.apply, Inputs(R(3), R(3), seed=82), "undefined_grad",
     kwargs=FWD)
case("custom_sin_grad_dtypes", Sin.apply, Inputs(R(3), seed=83), "dtypes",
     kwargs={"check_grad_dtypes": True, "check_forward_ad": True})

# --- broken: scaled backward -------------------------------------------------------------
broken("bwd_scaled_2", SinBwdScaled.apply, Inputs(R(3), seed=100), "scaled", phrase=jac(0, 0))
broken("bwd_scaled_2_2x3", SinBwdScaled.apply, Inputs(R(2, 3), seed=101), "scaled", phrase=jac(0, 0))
broken("bwd_scaled_second_input", MulTwoBadGradY.apply, Inputs(R(3), R(3), seed=102), "multi_input",
       phrase=jac(0, 1))
broken("bwd_scaled_second_output", SinCosBadSecond.apply, Inputs(R(3), seed=103), "multi_output",
       phrase=jac(1, 0))

case("custom_real_and_complex_outputs", RealAndComplexOutputs.apply, Inputs(R(3), seed=104), "multi_output")
broken("bwd_missing_conj_second_output", RealAndComplexOutputsNoConj.apply, Inputs(R(3), seed=105), "multi_output",
       phrase=jac(1, 0, part="imaginary"))
broken("bwd_returns_none", MulTwoReturnsNone.apply, Inputs(R(3), R(3), seed=106), "multi_input", phrase=jac(0, 0))

# --- broken: one entry off -----------------------------------------------------------------
broken("bwd_one_entry_off_diag", ExpOneOffDiag.apply, Inputs(R(2, 3), seed=110), "one_entry_off",
       phrase=jac(0, 0))
broken("bwd_one_entry_off_offdiag", ExpOneOff.apply, Inputs(R(3), seed=111), "one_entry_off",
       phrase=jac(0, 0))

# --- broken: transposed ----------------------------------------------------------------------
broken("bwd_transposed_linear", LinearWTransposed.apply, Inputs(R(3), seed=120), "transposed",
       phrase=jac(0, 0))
broken("bwd_transposed_matmul_grad_b", MatMulTransposedGradB.apply, Inputs(R(3, 3), R(3, 3), seed=121),
       "transposed", phrase=jac(0, 1))
broken("jvp_transposed_linear", LinearWTransposedJvp.apply, Inputs(R(3), seed=122), "transposed",
       kwargs=FWD, phrase=jac(0, 0, forward=True))

# --- broken: complex conjugation -----------------------------------------------------------
broken("c2c_missing_conj", CMulNoConj.apply, Inputs(C(3), seed=130), "conj",
       phrase=jac(0, 0, part="imaginary"))
broken("c2c_square_missing_conj", CSquareNoConj.apply, Inputs(C(3), seed=131), "conj",
       phrase=jac(0, 0, part="imaginary"))
broken("c2c_wrong_for_real_grad_output", CMulBadForRealGrad.apply, Inputs(C(3), seed=132), "conj",
       phrase=jac(0, 0, part="real"))
broken("c2c_wrong_for_imag_grad_output", CMulBadForImagGrad.apply, Inputs(C(3), seed=133), "conj",
       phrase=jac(0, 0, part="imaginary"))
broken("c2r_missing_conj", CRealPartNoConj.apply, Inputs(C(3), seed=134), "conj", phrase=jac(0, 0))
broken("c2r_abs2_conjugated", CAbs2Conj.apply, Inputs(C(3), seed=135), "conj", phrase=jac(0, 0))
broken("r2c_missing_conj", RToCNoConj.apply, Inputs(R(3), seed=136), "conj",
       phrase=jac(0, 0, part="imaginary"))
broken("c2c_jvp_conjugated", CMulConjJvp.apply, Inputs(C(3), seed=137), "conj", kwargs=FWD_ONLY,
       phrase=jac(0, 0, forward=True, part="imaginary"))
broken("c2c_jvp_wrong_imag_tangent", CMulBadJvpImagTangent.apply, Inputs(C(3), seed=138), "conj",
       kwargs=FWD_ONLY, phrase=jac(0, 0, forward=True, part="imaginary"))
broken("c2c_jvp_wrong_real_tangent", CMulBadJvpRealTangent.apply, Inputs(C(3), seed=139), "conj",
       kwargs=FWD_ONLY, phrase=jac(0, 0, forward=True, part="real"))
broken("c2c_missing_conj_with_fwd", CMulNoConj.apply, Inputs(C(3), seed=140), "conj", kwargs=FWD,
       phrase=jac(0, 0, part="imaginary"))

# --- broken: grad_output handling ----------------------------------------------------------
broken("bwd_ignores_grad_output_scalar_out", SumSinIgnoresGrad.apply, Inputs(R(3), seed=150), "grad_output",
       phrase="backward not multiplied by grad_output",
       note="the Jacobian check passes (one output element), the zero-grad_output check catches it")
broken("bwd_ignores_grad_output_vector_out", SinIgnoresGrad.apply, Inputs(R(3), seed=151), "grad_output",
       phrase=jac(0, 0), note="the Jacobian rows are all the same, so the Jacobian check catches it first")
broken("bwd_adds_tiny_constant", SinAddsTinyConstant.apply, Inputs(R(3), seed=152), "grad_output",
       phrase="backward not multiplied by grad_output")
case("bwd_adds_tiny_constant_masked", SinAddsTinyConstant.apply, Inputs(R(3), seed=153), "grad_output",
     kwargs={"masked": True, "check_undefined_grad": False}, broken=True, parity_only=True,
     note="masked=True compares grads for zero grad_output with allclose, so 1e-9 passes "
          "(the undefined-grad check, which compares exactly, is off)")

# --- broken: nondeterministic backward -----------------------------------------------------
broken("bwd_nondet_tol0", SinNondet.apply, Inputs(R(3), seed=160), "nondeterministic",
       kwargs={"nondet_tol": 0.0}, phrase="Backward is not reentrant")
broken("bwd_nondet_default_tol", SinNondet.apply, Inputs(R(2, 3), seed=161), "nondeterministic",
       phrase="Backward is not reentrant")
case("bwd_nondet_large_tol", SinNondet.apply, Inputs(R(3), seed=162), "nondeterministic",
     kwargs={"nondet_tol": 1e-6}, broken=True, parity_only=True,
     note="noise of 1e-10 is within nondet_tol=1e-6: the reentrancy check passes")

# --- broken: undefined grads ---------------------------------------------------------------
broken("bwd_raises_on_undefined", SinRaisesOnUndefined.apply, Inputs(R(3), seed=170), "undefined_grad",
       phrase="Expected backward function to handle undefined output grads")
broken("bwd_raises_on_one_undefined", SinCosRaisesOnOneUndefined.apply, Inputs(R(3), seed=171),
       "undefined_grad", expect=RAISE(RuntimeError),
       phrase="SinCosRaisesOnOneUndefined: one grad_output is undefined",
       note="the Jacobian of output 0 is computed with grad_output of output 1 undefined (None), "
            "so the backward's own RuntimeError escapes before the undefined-grad check runs")
broken("bwd_nonzero_for_undefined", SinOnesOnUndefined.apply, Inputs(R(3), seed=172), "undefined_grad",
       phrase="Expected all input grads to be undefined or zero")
case("bwd_raises_on_undefined_unchecked", SinRaisesOnUndefined.apply, Inputs(R(3), seed=173), "undefined_grad",
     kwargs={"check_undefined_grad": False}, broken=True, parity_only=True,
     note="check_undefined_grad=False skips the check that would catch it")
case("bwd_nonzero_for_undefined_unchecked", SinOnesOnUndefined.apply, Inputs(R(3), seed=174), "undefined_grad",
     kwargs={"check_undefined_grad": False}, broken=True, parity_only=True,
     note="check_undefined_grad=False skips the check that would catch it")
broken("bwd_typeerror_on_undefined", SinTypeErrorOnUndefined.apply, Inputs(R(3), seed=175), "undefined_grad",
       expect=RAISE(TypeError), phrase=None,
       note="only RuntimeError from backward becomes 'Expected backward function to handle ...'; "
            "a TypeError propagates as is")
broken("jvp_differs_for_undefined_tangent", MulTwoUndefTangent.apply, Inputs(R(3), R(3), seed=176),
       "undefined_grad", kwargs=FWD, phrase="Mismatch in tangent values for output with index")
broken("jvp_differs_for_undefined_tangent_complex", MulTwoUndefTangent.apply, Inputs(C(3), C(3), seed=178),
       "undefined_grad", kwargs=FWD, phrase="Mismatch in tangent values for output with index")
case("jvp_differs_for_undefined_tangent_unchecked", MulTwoUndefTangent.apply, Inputs(R(3), R(3), seed=177),
     "undefined_grad", kwargs={"check_forward_ad": True, "check_undefined_grad": False}, broken=True,
     parity_only=True, note="check_undefined_grad=False skips the forward-mode undefined-tangent check")

# --- broken: not vmappable / batched differs -------------------------------------------------
broken("bwd_item_not_vmappable", SinItemBackward.apply, Inputs(R(3), seed=180), "batched",
       kwargs={"check_batched_grad": True}, phrase="While computing batched gradients")
case("bwd_item_not_vmappable_unchecked", SinItemBackward.apply, Inputs(R(3), seed=181), "batched",
     broken=True, parity_only=True, note="check_batched_grad defaults to False")
broken("bwd_batched_differs", SinBatchedDiffersBackward.apply, Inputs(R(3), seed=182), "batched",
       kwargs={"check_batched_grad": True},
       phrase="gradcheck or gradgradcheck failed while testing batched gradient computation")
broken("jvp_item_not_vmappable", SinItemJvp.apply, Inputs(R(3), seed=183), "batched",
       kwargs={"check_forward_ad": True, "check_batched_forward_grad": True},
       phrase="While computing batched gradients")
broken("jvp_batched_differs", SinBatchedDiffersJvp.apply, Inputs(R(3), seed=184), "batched",
       kwargs={"check_forward_ad": True, "check_batched_forward_grad": True},
       phrase="gradcheck failed while testing batched gradient computation with forward-mode AD")
case("jvp_item_not_vmappable_unchecked", SinItemJvp.apply, Inputs(R(3), seed=185), "batched",
     kwargs=FWD, broken=True, parity_only=True, note="check_batched_forward_grad defaults to False")

# --- broken: forward AD ----------------------------------------------------------------------
broken("jvp_scaled", SinJvpScaled.apply, Inputs(R(3), seed=190), "forward_ad", kwargs=FWD,
       phrase=jac(0, 0, forward=True))
broken("jvp_scaled_fwd_only", SinJvpScaled.apply, Inputs(R(2, 3), seed=191), "forward_ad", kwargs=FWD_ONLY,
       phrase=jac(0, 0, forward=True))
broken("jvp_scaled_second_input", MulTwoBadJvpY.apply, Inputs(R(3), R(3), seed=192), "forward_ad",
       kwargs=FWD, phrase=jac(0, 1, forward=True))
case("jvp_scaled_backward_only", SinJvpScaled.apply, Inputs(R(3), seed=193), "forward_ad", broken=True,
     parity_only=True, note="check_forward_ad defaults to False: a wrong jvp goes unseen")
case("bwd_scaled_forward_only", SinBwdScaled.apply, Inputs(R(3), seed=194), "forward_ad",
     kwargs=FWD_ONLY, broken=True, parity_only=True,
     note="check_backward_ad=False: a wrong backward goes unseen")
broken("forward_ad_without_jvp", SinNoJvp.apply, Inputs(R(3), seed=195), "forward_ad", kwargs=FWD,
       expect=RAISE(NotImplementedError), phrase="You must implement the jvp function")
broken("jvp_complex_tangent_for_real_output", SinJvpComplexTangent.apply, Inputs(R(3), seed=196), "dtypes",
       kwargs={"check_forward_ad": True, "check_grad_dtypes": True},
       phrase="Forward AD gradient has dtype mismatch")
case("jvp_complex_tangent_unchecked_dtypes", SinJvpComplexTangent.apply, Inputs(R(3), seed=197), "dtypes",
     kwargs=FWD, broken=True, parity_only=True,
     note="check_grad_dtypes=False: the (zero) imaginary part is dropped and the values match")

# --- broken: gradient dtype / size (the autograd engine intervenes first) --------------------
case("bwd_grad_float32", SinGradFloat32.apply, Inputs(R(3), seed=200), "dtypes",
     kwargs={"check_grad_dtypes": True}, broken=True, parity_only=True,
     note="the engine casts a float32 grad back to float64: 'Gradient has dtype mismatch' is unreachable")
broken("bwd_grad_complex_for_real", SinGradComplex.apply, Inputs(R(3), seed=201), "dtypes",
       kwargs={"check_grad_dtypes": True}, expect=RAISE(RuntimeError),
       phrase="Expected isFloatingType(grad.scalar_type()) || (input_is_complex == grad_is_complex)",
       note="the autograd engine rejects it before gradcheck looks")
broken("bwd_grad_wrong_size", SinGradTooShort.apply, Inputs(R(3), seed=202), "dtypes",
       expect=RAISE(RuntimeError), phrase="returned an invalid gradient at index 0",
       note="the autograd engine rejects it: 'Analytical gradient has incorrect size' is unreachable")
case("bwd_grad_broadcastable_size", SinGradBroadcastable.apply, Inputs(R(3), seed=203), "dtypes",
     broken=True, parity_only=True, note="the engine sums a broadcastable grad back to the input's shape")

broken("r2c_jvp_conjugated", RToCConjJvp.apply, Inputs(R(3), seed=198), "conj", kwargs=FWD,
       phrase=jac(0, 0, forward=True), note="real inputs: no complex-part prefix in forward mode")

# --- several bugs at once: torch's check order decides the message ----------------------------
broken("order_nondet_before_jacobian", SinNondetAndScaled.apply, Inputs(R(3), seed=300), "check_order",
       kwargs={"nondet_tol": 0.0}, phrase="Backward is not reentrant",
       note="reentrancy is checked before the Jacobians are compared, although the Jacobian is wrong too")
broken("order_backward_before_forward", SinBwdAndJvpScaled.apply, Inputs(R(3), seed=301), "check_order",
       kwargs=FWD, phrase=jac(0, 0))
broken("order_batched_before_grad_output", SinItemAndConstant.apply, Inputs(R(3), seed=302), "check_order",
       kwargs={"check_batched_grad": True}, phrase="While computing batched gradients")
broken("order_grad_output_before_undefined", SinConstantAndUndefined.apply, Inputs(R(3), seed=303),
       "check_order", phrase="backward not multiplied by grad_output")
broken("order_undefined_tangent_before_undefined_grad", MulTwoUndefTangentRaisesUndefGrad.apply,
       Inputs(R(3), R(3), seed=304), "check_order", kwargs=FWD,
       phrase="Mismatch in tangent values for output with index")
broken("order_batched_forward_before_backward", SinItemJvpAndItemBwd.apply, Inputs(R(3), seed=305),
       "check_order",
       kwargs={"check_forward_ad": True, "check_batched_forward_grad": True, "check_batched_grad": True},
       phrase="check_batched_forward_grad=False",
       note="both raise 'While computing batched gradients'; the forward one names its own keyword")
broken("order_batched_forward_differs_before_backward", SinBatchedDiffersBoth.apply, Inputs(R(3), seed=306),
       "check_order",
       kwargs={"check_forward_ad": True, "check_batched_forward_grad": True, "check_batched_grad": True},
       phrase="check_batched_forward_grad=False")

# --- no differentiable outputs -----------------------------------------------------------------
broken("nodiff_depends_on_input", f_nodiff_depends, Inputs(R(3), seed=210), "no_diff_outputs",
       phrase="Numerical gradient for function expected to be zero")
broken("nodiff_depends_on_input_two_outputs", f_nodiff_two, Inputs(AWAY(3), seed=211), "no_diff_outputs",
       phrase="Numerical gradient for function expected to be zero")
case("nodiff_constant", f_nodiff_constant, Inputs(R(3), seed=212), "no_diff_outputs")
case("nodiff_step", f_nodiff_step, Inputs(AWAY(3), seed=213), "no_diff_outputs")
case("nodiff_int_only", f_nodiff_int, Inputs(R(3), seed=214), "no_diff_outputs")
broken("nodiff_depends_large_nondet_tol", f_nodiff_depends, Inputs(R(3), seed=215), "no_diff_outputs",
       kwargs={"nondet_tol": 1e3}, fast=PASS, parity_only=True,
       phrase="Numerical gradient for function expected to be zero",
       note="fast mode compares the numerical JVP with nondet_tol, slow mode with exact zero")
broken("quirk_nodiff_depends_fwd_only", f_nodiff_depends, Inputs(R(3), seed=216), "no_diff_outputs",
       kwargs=FWD_ONLY, phrase="Numerical gradient for function expected to be zero",
       fast=RAISE(IndexError), fast_phrase="", quirk=True,
       note="fast forward mode has no 'no differentiable outputs' branch and indexes an empty output list")

# --- tolerances and step sizes ------------------------------------------------------------------
broken("cube_eps_large", f_cube, Inputs(R(3), seed=220), "tolerance", kwargs={"eps": 0.1}, phrase=jac(0, 0),
       note="central differences with eps=0.1 are off by eps^2 = 1e-2")
case("cube_eps_large_atol", f_cube, Inputs(R(3), seed=221), "tolerance", kwargs={"eps": 0.1, "atol": 0.05})
case("sin_eps_small", f_sin, Inputs(R(3), seed=222), "tolerance", kwargs={"eps": 1e-8})
case("sin_tight_tolerances", f_sin, Inputs(R(2, 3), seed=223), "tolerance",
     kwargs={"atol": 1e-8, "rtol": 1e-7})
broken("bwd_scaled_1p01", SinBwdScaled1p01.apply, Inputs(R(3), seed=224), "tolerance", phrase=jac(0, 0))
case("bwd_scaled_1p01_rtol", SinBwdScaled1p01.apply, Inputs(R(3), seed=225), "tolerance",
     kwargs={"rtol": 0.02}, broken=True, parity_only=True, note="rtol=2e-2 tolerates a 1% error")
broken("bwd_scaled_2_large_nondet_tol", SinBwdScaled.apply, Inputs(R(3), seed=236), "tolerance",
       kwargs={"nondet_tol": 10.0}, phrase=jac(0, 0), note="nondet_tol only loosens the reentrancy check")
broken("rtol_relative_to_numerical", SinBwdScaled1p0105.apply, Inputs(R(3), seed=237), "tolerance",
       kwargs={"rtol": 0.0104, "atol": 0.0}, phrase=jac(0, 0),
       note="|a - n| = 0.0105 |n| > rtol |n|; it would pass if rtol multiplied |analytical| (0.0104 * 1.0105 |n|)")
case("rtol_just_enough", SinBwdScaled1p0105.apply, Inputs(R(3), seed=238), "tolerance",
     kwargs={"rtol": 0.0106, "atol": 0.0}, broken=True, parity_only=True, note="rtol just above the 1.05% error")
broken("atol_just_too_small", SinBwdPlus1em4.apply, Inputs(R(1), seed=239), "tolerance",
       kwargs={"atol": 0.8e-4, "rtol": 0.0}, phrase=jac(0, 0),
       note="one element, so fast mode's projection vectors are exactly 1 and both modes see |a - n| = 1e-4")
case("atol_just_enough", SinBwdPlus1em4.apply, Inputs(R(1), seed=240), "tolerance",
     kwargs={"atol": 1.2e-4, "rtol": 0.0}, broken=True, parity_only=True, note="atol just above the 1e-4 error")
case("bwd_scaled_2_huge_atol", SinBwdScaled.apply, Inputs(R(3), seed=226), "tolerance",
     kwargs={"atol": 10.0}, broken=True, parity_only=True, note="atol=10 tolerates anything here")

broken("nan_output", f_nan_output, Inputs(R(3), seed=227), "tolerance", phrase=jac(0, 0),
       note="NaN never compares close")
broken("eps_zero", f_sin, Inputs(R(3), seed=228), "tolerance", kwargs={"eps": 0.0}, phrase=jac(0, 0),
       parity_only=True, note="torch accepts eps=0: the numerical Jacobian is NaN and the check fails")
case("eps_negative", f_sin, Inputs(R(3), seed=229), "tolerance", kwargs={"eps": -1e-6},
     note="torch accepts a negative eps: central differences are symmetric in its sign")
case("bwd_nonlinear_in_grad_output", unary("SinAbsGrad", _sin, _cos, bwd=lambda g, x: g.abs() * x.cos()).apply,
     Inputs(R(3), seed=234), "grad_output", kwargs={"check_batched_grad": True}, broken=True, parity_only=True,
     note="backward uses |grad_output|: one-hot rows (slow), non-negative random v (fast), zero and "
          "undefined grads all give the right answer, so torch cannot see the bug")

# --- raise_exception=False ----------------------------------------------------------------------
case("raise_false_correct", Sin.apply, Inputs(R(3), seed=230), "raise_exception",
     kwargs={"raise_exception": False})
broken("raise_false_broken", SinBwdScaled.apply, Inputs(R(3), seed=231), "raise_exception",
       kwargs={"raise_exception": False}, phrase=jac(0, 0))
broken("raise_false_not_reentrant", SinNondet.apply, Inputs(R(3), seed=232), "raise_exception",
       kwargs={"raise_exception": False}, phrase="Backward is not reentrant")
broken("raise_false_invalid_inputs", f_double, Inputs(R(3, grad=False), seed=233), "raise_exception",
       kwargs={"raise_exception": False}, expect=RAISE(ValueError),
       phrase="gradcheck expects at least one input tensor to require gradient",
       note="raise_exception=False only turns GradcheckError into False")

broken("raise_false_invalid_kwargs", f_sin, Inputs(R(3), seed=235), "raise_exception",
       kwargs={"raise_exception": False, "check_backward_ad": False}, expect=RAISE(AssertionError),
       phrase="Expected at least one of check_forward_ad or check_backward_ad to be True",
       note="invalid keywords raise whatever raise_exception says")

# --- invalid arguments / inputs ------------------------------------------------------------------
broken("invalid_no_input_requires_grad", f_double, Inputs(R(3, grad=False), seed=240), "invalid",
       expect=RAISE(ValueError), phrase="gradcheck expects at least one input tensor to require gradient")
broken("invalid_stride0_input", f_double,
       Special(lambda g: (torch.randn(1, generator=g, dtype=F64).expand(3).requires_grad_(),), seed=241,
               desc="expanded (stride 0) leaf"),
       "invalid", expect=RAISE(RuntimeError), phrase="has a dimension with stride 0")
broken("invalid_no_ad_mode", f_sin, Inputs(R(3), seed=242), "invalid",
       kwargs={"check_forward_ad": False, "check_backward_ad": False}, expect=RAISE(AssertionError),
       phrase="Expected at least one of check_forward_ad or check_backward_ad to be True")
broken("invalid_batched_grad_without_backward", f_sin, Inputs(R(3), seed=243), "invalid",
       kwargs={"check_batched_grad": True, "check_backward_ad": False, "check_forward_ad": True},
       expect=RAISE(AssertionError), phrase="Setting check_batched_grad=True requires check_backward_ad to be True")
broken("invalid_batched_forward_without_forward", f_sin, Inputs(R(3), seed=244), "invalid",
       kwargs={"check_batched_forward_grad": True}, expect=RAISE(AssertionError),
       phrase="Setting check_batched_forward_grad=True requires check_forward_ad to be True")
broken("invalid_sparse_output", f_sparse_output, Inputs(R(3), seed=245), "invalid",
       expect=RAISE(ValueError), phrase="Sparse output is not supported at gradcheck yet")
broken("invalid_output_shape_changes", f_shape_changes,
       Special(lambda g: (torch.tensor([0.5, 0.1, -0.3], dtype=F64).requires_grad_(),), desc="x[0] at the switch"),
       "invalid", expect=RAISE(AssertionError),
       phrase="Expected `func` to return outputs with the same shape when inputs are perturbed",
       note="slow mode names the perturbed index, fast mode does not")
case("float32_input_large_tolerance", f_double, Inputs(R(3, dtype=torch.float32), seed=246), "invalid",
     kwargs={"atol": 0.1, "rtol": 0.1}, note="float32 inputs warn but are checked")
broken("float32_input_default_tolerance", f_double, Inputs(R(3, dtype=torch.float32), seed=247), "invalid",
       phrase=jac(0, 0), note="float32 finite differences with eps=1e-6 are far off")

broken("fn_raises_when_perturbed", f_raises_when_perturbed_up, Special(_at_half, seed=0, desc="x[0] = 0.5"),
       "invalid", expect=RAISE(RuntimeError), phrase="f_raises_when_perturbed_up refuses x[0] > 0.5",
       note="the function's own exception propagates; agcheck must still restore the input bitwise")
broken("invalid_output_dtype_changes", f_dtype_changes, Special(_at_half, seed=0, desc="x[0] = 0.5"),
       "invalid", expect=RAISE(AssertionError),
       phrase="Expected `func` to return outputs with the same dtype when inputs are perturbed")

# --- sparse inputs -----------------------------------------------------------------------------
case("sparse_coo_masked", f_sparse_to_dense_masked, Special(_sparse_coo, seed=260, desc="2x3 COO, 3 nnz"),
     "sparse", kwargs={"masked": True})
case("sparse_csr_masked", f_sparse_to_dense_masked, Special(_sparse_csr, seed=261, desc="2x3 CSR, 3 nnz"),
     "sparse", kwargs={"masked": True})
case("sparse_coo_unmasked", f_sparse_to_dense, Special(_sparse_coo, seed=262, desc="2x3 COO, 3 nnz"),
     "sparse", expect=FAIL, fast=PASS, phrase=jac(0, 0), parity_only=True,
     note="slow mode densifies the input (numerical Jacobian over all 6 entries) while to_dense's grad "
          "is masked to the 3 specified ones; fast mode's random vector only covers specified entries")

# --- torch quirks: parity with torch's surprising behaviour ---------------------------------------
broken("quirk_int_output_before_float", f_int_before_float, Inputs(R(3), seed=250), "quirks",
       expect=RAISE(IndexError), fast=PASS, phrase=None, quirk=True, parity_only=True,
       note="slow mode pairs numerical Jacobians (float outputs only) with all outputs by position")
case("quirk_nondiff_output_first", f_output_no_grad_first, Inputs(R(3), seed=251), "quirks",
     fast=FAIL, quirk=True, parity_only=True, phrase=jac(0, 0),
     note="fast mode pairs the random output vectors with the float outputs by position, "
          "so a non-differentiable float output before a differentiable one makes it fail")
broken("quirk_none_output", f_none_output, Inputs(R(3), seed=252), "quirks",
       expect=RAISE(AttributeError), phrase=None, quirk=True, parity_only=True,
       note="torch reads .requires_grad of every output")

broken("quirk_nested_list_input", f_nested_list_input, Special(_nested_list, seed=253, desc="(x, [y])"),
       "quirks", expect=RAISE(IndexError), phrase=None, quirk=True, parity_only=True,
       note="the analytical side collects tensors from nested lists, the numerical side does not")

broken("quirk_int_output_between_floats", f_int_in_middle, Inputs(R(3), seed=254), "quirks",
       expect=RAISE(IndexError), fast=PASS, phrase=None, quirk=True, parity_only=True,
       note="slow mode pairs numerical Jacobians (float outputs only) with all outputs by position")

CASES_BY_NAME: dict[str, Case] = {c.name: c for c in CASES}
CATEGORIES: list[str] = sorted({c.category for c in CASES})
