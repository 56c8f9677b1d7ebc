"""Sparse (COO, CSR, CSC, BSR, BSC) and MKL-DNN inputs: agcheck against torch.autograd.gradcheck.

The parity matrix runs every layout x ``masked`` (True / False / None) x mode (slow / fast)
on correct functions and on broken ones, and asserts torch's outcome: pass, a failed check
(with torch's key phrase), or the same exception type. torch's verdicts differ between slow
and fast mode for some sparse cases (fast mode probes only the specified elements even when
unmasked); agcheck matches each. Inputs are compared bitwise (indices and values) after every
check, also when ``fn`` raises. See docs/sparse.md.
"""
from __future__ import annotations

import warnings

import pytest
import torch
from torch.autograd.gradcheck import GradcheckError as TorchGradcheckError

import agcheck
from agcheck.core import jacobian as jac
from agcheck.backend import get_backend
from agcheck.backends import torch_sparse

LAYOUTS = ["coo", "csr", "csc", "bsr", "bsc"]
MASKED = [True, False, None]
MODES = [False, True]  # fast_mode

# 4 x 4, six specified elements; with 2 x 2 blocks: two blocks (eight stored values)
MASK = torch.tensor([[1, 1, 0, 0],
                     [1, 0, 0, 0],
                     [0, 0, 0, 1],
                     [0, 0, 1, 1]], dtype=torch.bool)
W = torch.linspace(-1.0, 1.0, 12, dtype=torch.float64).reshape(4, 3)


def sparse(layout: str, *, dtype=torch.float64, seed: int = 0, requires_grad: bool = True) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    d = torch.randn(4, 4, dtype=dtype, generator=gen) * MASK
    s = {
        "coo": lambda: d.to_sparse(),
        "csr": d.to_sparse_csr,
        "csc": d.to_sparse_csc,
        "bsr": lambda: d.to_sparse_bsr((2, 2)),
        "bsc": lambda: d.to_sparse_bsc((2, 2)),
    }[layout]()
    return s.requires_grad_(requires_grad)


def outcome(check, fn, inputs, **kw):
    """("pass" | "fail" | exception type name, message)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ok = check(fn, inputs, **kw)
            return ("pass" if ok else "fail"), ""
        except (TorchGradcheckError, agcheck.GradcheckError) as e:
            return "fail", str(e)
        except Exception as e:  # noqa: BLE001 - any other exception is an outcome
            return type(e).__name__, str(e)


def key_phrase(message: str) -> str:
    first = message.strip().splitlines()[0]
    return first.split(",")[0].strip()


def assert_parity(fn, make_inputs, **kw):
    t_inputs, a_inputs = make_inputs(), make_inputs()  # deterministic: the same inputs twice
    before = [components_of(t) for t in a_inputs]
    t_kind, t_msg = outcome(torch.autograd.gradcheck, fn, t_inputs, **kw)
    a_kind, a_msg = outcome(agcheck.gradcheck, fn, a_inputs, **kw)
    # agcheck names a usage error torch fails on with a RuntimeError of its own
    # (CheckInputError, a RuntimeError: torch's except clauses catch it)
    named = t_kind == "RuntimeError" and a_kind == "CheckInputError"
    assert a_kind == t_kind or named, f"torch: {t_kind}: {t_msg[:300]}\nagcheck: {a_kind}: {a_msg[:300]}"
    if t_kind == "fail" and t_msg:
        assert key_phrase(t_msg) in a_msg, f"torch's phrase {key_phrase(t_msg)!r} not in agcheck's message"
    for t, snap in zip(a_inputs, before):
        assert_same_bits(components_of(t), snap)
    return t_kind


def components_of(t):
    if not isinstance(t, torch.Tensor):
        return None
    if t.layout == torch.strided:
        return (t.detach().clone(),)
    if t.layout == torch._mkldnn:
        return (t.detach().to_dense(),)
    return tuple(c.detach().clone() for c in torch_sparse.components(t))


def _bits(t):
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype.is_floating_point:
        return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def assert_same_bits(now, then):
    if then is None:
        return
    assert len(now) == len(then)
    for a, b in zip(now, then):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert torch.equal(_bits(a), _bits(b)), "an input's indices or values changed"


# --------------------------------------------------------------------------------------
# functions: correct and broken
# --------------------------------------------------------------------------------------


def _mask_like(g, s):
    return g.sparse_mask(s.coalesce() if s.layout == torch.sparse_coo else s)


class ScaledToDense(torch.autograd.Function):
    """``2 * s.to_dense()`` with a sparse backward scaled by ``factor`` (1.0 is correct)."""

    @staticmethod
    def forward(ctx, s, factor):
        ctx.save_for_backward(s)
        ctx.factor = factor
        return s.to_dense() * 2

    @staticmethod
    def backward(ctx, g):
        (s,) = ctx.saved_tensors
        return _mask_like(g * 2 * ctx.factor, s), None


class IgnoresGradOutput(torch.autograd.Function):
    """``2 * s.to_dense()`` whose backward returns 2 at every specified element."""

    @staticmethod
    def forward(ctx, s):
        ctx.save_for_backward(s)
        return s.to_dense() * 2

    @staticmethod
    def backward(ctx, g):
        (s,) = ctx.saved_tensors
        return _mask_like(torch.full_like(g, 2.0), s)


def _values(s):
    return (s.coalesce() if s.layout == torch.sparse_coo else s).values()


CORRECT = {
    "to_dense_masked_grad": lambda s: s.to_dense(masked_grad=True) * 2,
    "to_dense_full_grad": lambda s: s.to_dense(masked_grad=False) * 2,
    "to_dense_sin": lambda s: s.to_dense().sin(),
    "matmul": lambda s: s @ W,
    "sparse_mm": lambda s: torch.sparse.mm(s, W),
    "values": lambda s: _values(s) * 3,
    "custom_function": lambda s: ScaledToDense.apply(s, 1.0),
}
BROKEN = {
    "scaled_backward": lambda s: ScaledToDense.apply(s, 1.5),
    "ignores_grad_output": IgnoresGradOutput.apply,
}


@pytest.mark.parametrize("fast_mode", MODES, ids=["slow", "fast"])
@pytest.mark.parametrize("masked", MASKED, ids=lambda m: f"masked={m}")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", list(CORRECT) + list(BROKEN))
def test_parity_matrix(name, layout, masked, fast_mode):
    fn = CORRECT.get(name) or BROKEN[name]
    kind = assert_parity(fn, lambda: (sparse(layout),), masked=masked, fast_mode=fast_mode)
    if name in BROKEN:
        assert kind != "pass", "torch passed a broken function (the catalog is wrong)"


@pytest.mark.parametrize("fast_mode", MODES, ids=["slow", "fast"])
@pytest.mark.parametrize("masked", MASKED, ids=lambda m: f"masked={m}")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_custom_function_without_undefined_grad_check(layout, masked, fast_mode):
    # torch tests undefined output grads with eq(0) on the raw (sparse) gradient and raises;
    # without that check, the correct custom function passes and the broken one fails
    for fn, expected in ((lambda s: ScaledToDense.apply(s, 1.0), None), (BROKEN["scaled_backward"], "fail")):
        kind = assert_parity(fn, lambda: (sparse(layout),), masked=masked, fast_mode=fast_mode,
                             check_undefined_grad=False)
        if expected:
            assert kind == expected


@pytest.mark.parametrize("fast_mode", MODES, ids=["slow", "fast"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_slow_and_fast_verdicts_differ_like_torch(layout, fast_mode):
    # unmasked, a masked-gradient function fails in slow mode (the unspecified elements move
    # numerically, the analytical gradient is zero there) and passes in fast mode (the probe
    # is zero at the unspecified elements)
    kind = assert_parity(lambda s: s.to_dense(masked_grad=True) * 2, lambda: (sparse(layout),), masked=False,
                         fast_mode=fast_mode)
    assert kind == ("pass" if fast_mode else "fail")


@pytest.mark.parametrize("fast_mode", MODES, ids=["slow", "fast"])
@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("layout", ["coo", "csr", "bsc"])
def test_complex_sparse_inputs(layout, masked, fast_mode):
    for fn in (lambda s: s.to_dense() * (2 - 1j), lambda s: (s.to_dense() * 2).abs(),
               lambda s: ScaledToDense.apply(s, 1.5)):
        assert_parity(fn, lambda: (sparse(layout, dtype=torch.complex128),), masked=masked, fast_mode=fast_mode)


# --------------------------------------------------------------------------------------
# other shapes of sparse input
# --------------------------------------------------------------------------------------


def hybrid_coo():
    gen = torch.Generator().manual_seed(1)
    d = torch.randn(4, 3, 2, dtype=torch.float64, generator=gen)
    d[1] = 0
    d[3] = 0
    return (d.to_sparse(sparse_dim=1).requires_grad_(),)


def uncoalesced_coo():
    i = torch.tensor([[0, 1, 0, 2], [1, 2, 1, 0]])
    v = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    return (torch.sparse_coo_tensor(i, v, (3, 3)).requires_grad_(),)


def hybrid_csr():
    gen = torch.Generator().manual_seed(2)
    d = torch.randn(3, 4, 2, dtype=torch.float64, generator=gen)
    d[1] = 0
    d[0, 2] = 0
    return (d.to_sparse_csr(dense_dim=1).requires_grad_(),)


@pytest.mark.parametrize("fast_mode", MODES, ids=["slow", "fast"])
@pytest.mark.parametrize("masked", MASKED, ids=lambda m: f"masked={m}")
@pytest.mark.parametrize("make", [hybrid_coo, uncoalesced_coo, hybrid_csr], ids=lambda f: f.__name__)
def test_hybrid_and_uncoalesced(make, masked, fast_mode):
    assert_parity(lambda s: s.to_dense() * 2, make, masked=masked, fast_mode=fast_mode)
    assert_parity(lambda s: s.to_dense(masked_grad=False) ** 2, make, masked=masked, fast_mode=fast_mode)
    if make is uncoalesced_coo:
        assert_parity(lambda s: s.coalesce().values() * 2, make, masked=masked, fast_mode=fast_mode)


@pytest.mark.parametrize("fast_mode", MODES, ids=["slow", "fast"])
@pytest.mark.parametrize("masked", MASKED, ids=lambda m: f"masked={m}")
@pytest.mark.parametrize("layout", ["coo", "csr", "bsc"])
def test_sparse_beside_dense_inputs(layout, masked, fast_mode):
    dense = lambda: torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))  # noqa: E731
    # both differentiable
    assert_parity(lambda s, w: (s.to_dense() * w).sum(0), lambda: (sparse(layout), dense().requires_grad_()),
                  masked=masked, fast_mode=fast_mode)
    # a sparse argument that is not differentiated (densified for the numerical side too)
    assert_parity(lambda s, w: s.to_dense() @ w, lambda: (sparse(layout, requires_grad=False), dense().requires_grad_()),
                  masked=masked, fast_mode=fast_mode)


@pytest.mark.parametrize("fast_mode", MODES, ids=["slow", "fast"])
@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_closure_sees_the_move_as_in_torch(layout, masked, fast_mode):
    # slow masked: the input itself is moved in place (the closure sees it, torch fails);
    # fast mode moves a clone, unmasked checks move the densified copy (the closure does not)
    def run(check):
        s = sparse(layout)
        return outcome(check, lambda a: a.to_dense() + s.detach().to_dense(), (s,), masked=masked,
                       fast_mode=fast_mode)[0]

    assert run(agcheck.gradcheck) == run(torch.autograd.gradcheck)


# --------------------------------------------------------------------------------------
# the other checks meeting sparse inputs
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("fast_mode", MODES, ids=["slow", "fast"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kw", [
    {"check_forward_ad": True},  # torch cannot make a sparse dual: NotImplementedError / RuntimeError
    {"check_forward_ad": True, "check_backward_ad": False, "check_undefined_grad": False},
    {"check_batched_grad": True},
    {"check_grad_dtypes": True},
    {"raise_exception": False},
], ids=["forward_ad", "forward_only", "batched_grad", "grad_dtypes", "no_raise"])
def test_other_checks(layout, fast_mode, kw):
    for fn in (lambda s: s.to_dense() * 2, BROKEN["scaled_backward"]):
        assert_parity(fn, lambda: (sparse(layout),), masked=True, fast_mode=fast_mode, **kw)


@pytest.mark.parametrize("fast_mode", MODES, ids=["slow", "fast"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_no_differentiable_outputs(layout, fast_mode):
    assert_parity(lambda s: s.to_dense().detach() * 2, lambda: (sparse(layout),), fast_mode=fast_mode)
    assert_parity(lambda s: torch.zeros(3, dtype=torch.float64), lambda: (sparse(layout),), fast_mode=fast_mode)


def test_stride_zero_values_are_rejected_like_torch():
    i = torch.tensor([[0, 1, 2], [1, 0, 2]])
    v = torch.tensor([1.5], dtype=torch.float64).expand(3)
    make = lambda: (torch.sparse_coo_tensor(i, v, (3, 3)).requires_grad_(),)  # noqa: E731
    assert assert_parity(lambda s: s.to_dense(), make) == "RuntimeError"
    with pytest.raises(RuntimeError, match="has a dimension with stride 0"):
        agcheck.gradcheck(lambda s: s.to_dense(), make())


def test_sparse_output_is_rejected_like_torch():
    assert assert_parity(lambda s: s * 2, lambda: (sparse("coo"),)) == "ValueError"
    with pytest.raises(ValueError, match="Sparse output is not supported at gradcheck yet"):
        agcheck.gradcheck(lambda s: s * 2, (sparse("coo"),))


# --------------------------------------------------------------------------------------
# the caller's inputs and state
# --------------------------------------------------------------------------------------


class Boom(Exception):
    pass


@pytest.mark.parametrize("fast_mode", MODES, ids=["slow", "fast"])
@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_inputs_restored_when_fn_raises(layout, masked, fast_mode):
    s = sparse(layout)
    before = components_of(s)
    calls = {"n": 0}

    def fn(a):
        calls["n"] += 1
        if calls["n"] == 3:  # in the middle of the finite differences
            raise Boom("fn failed")
        return a.to_dense() * 2

    with pytest.raises(Boom):
        agcheck.gradcheck(fn, (s,), masked=masked, fast_mode=fast_mode)
    assert_same_bits(components_of(s), before)
    assert s.grad is None and s.requires_grad


@pytest.mark.parametrize("layout", LAYOUTS)
def test_values_alias_survives_and_rng_untouched(layout):
    s = sparse(layout)
    values_ptr = torch_sparse.stored_values(s).data_ptr()
    rng = torch.get_rng_state()
    for fast in MODES:
        agcheck.gradcheck(lambda a: a.to_dense().sin(), (s,), masked=True, fast_mode=fast)
    assert torch_sparse.stored_values(s).data_ptr() == values_ptr
    assert torch.equal(torch.get_rng_state(), rng)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fn_modifying_its_sparse_input_is_caught_and_undone(layout):
    s = sparse(layout)
    before = components_of(s)

    def fn(a):
        torch_sparse.stored_values(a).mul_(2)  # writes into the caller's tensor
        return a.to_dense()

    with pytest.raises(ValueError, match="fn modified input 0 in place"):
        agcheck.gradcheck(fn, (s,), masked=True)
    assert_same_bits(components_of(s), before)


# --------------------------------------------------------------------------------------
# the pieces: stored elements, dense rows, densification, probes
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS + ["hybrid_coo", "uncoalesced_coo", "hybrid_csr"])
def test_dense_positions_name_the_specified_elements(layout):
    s = {"hybrid_coo": hybrid_coo, "uncoalesced_coo": uncoalesced_coo, "hybrid_csr": hybrid_csr}.get(layout)
    s = s()[0] if s else sparse(layout)
    positions = torch_sparse.dense_positions(s)
    values = torch_sparse.stored_values(s).reshape(-1)
    rebuilt = torch.zeros(s.numel(), dtype=s.dtype).index_put_((positions,), values, accumulate=True)
    assert torch.equal(rebuilt, s.detach().to_dense().reshape(-1))


@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_numerical_jacobian_rows_land_at_dense_elements(layout, masked):
    be = get_backend("torch")
    s = sparse(layout)
    moved = s if masked else be.densify(s)
    fn = lambda a: a.to_dense() * 3  # noqa: E731
    outputs = (fn(s),)
    J = jac.numerical_jacobians(be, fn, (moved,), 0, outputs, 1e-6)[0]
    assert J.shape == (16, 16)
    stored = torch.zeros(16, dtype=torch.bool)
    stored[torch_sparse.dense_positions(moved)] = True
    expected = torch.diag(stored.to(torch.float64) * 3)
    torch.testing.assert_close(J, expected, rtol=0, atol=1e-8)


@pytest.mark.parametrize("layout", LAYOUTS + ["hybrid_coo", "uncoalesced_coo", "hybrid_csr"])
def test_densify_specifies_every_element(layout):
    s = {"hybrid_coo": hybrid_coo, "uncoalesced_coo": uncoalesced_coo, "hybrid_csr": hybrid_csr}.get(layout)
    s = s()[0] if s else sparse(layout)
    full = torch_sparse.densify(s)
    assert full.layout == s.layout and full.requires_grad == s.requires_grad and full.shape == s.shape
    assert torch_sparse.stored_values(full).numel() == s.numel()
    assert torch.equal(full.detach().to_dense(), s.detach().to_dense())
    if layout in ("bsr", "bsc"):
        assert full.values().shape[1:3] == s.values().shape[1:3]
    # torch's own densification agrees on what the numerical side sees
    from torch.autograd.gradcheck import _densify

    theirs = _densify(s)
    assert torch.equal(torch_sparse.dense_positions(full), torch_sparse.dense_positions(theirs))
    assert torch.equal(torch_sparse.stored_values(full), torch_sparse.stored_values(theirs))


@pytest.mark.parametrize("layout", LAYOUTS + ["uncoalesced_coo"])
def test_probe_vectors_are_torchs(layout):
    from torch.autograd.gradcheck import _make_vectors

    s = uncoalesced_coo()[0] if layout == "uncoalesced_coo" else sparse(layout)
    out = torch.zeros(5, dtype=torch.float64)
    be = get_backend("torch")
    all_v, all_u = jac.random_vectors(be, [s], [out])
    torch_v, _, torch_u_dense = _make_vectors([s], [out], use_forward_ad=False)
    torch.testing.assert_close(all_u[0], torch_u_dense[0], rtol=0, atol=0)
    torch.testing.assert_close(all_v[0], torch_v[0], rtol=0, atol=0)


def test_engine_leaves_sparse_to_the_reference_engine():
    from agcheck.core.piece import Piece
    from agcheck.engine import batched as engine
    from agcheck.core.run import CheckRun
    from agcheck.options import GradcheckOptions

    be = get_backend("torch")
    s = sparse("csr")
    run = CheckRun(lambda a: a.to_dense(), (s,), be, GradcheckOptions())
    trace = be.trace(run.fn, run.args, [0])
    outcome = engine.compare_slow_reverse(run, Piece.of(be, run.fn, run.args, [0], trace))
    assert not outcome.passed and "sparse_csr" in outcome.reason
    for eng in ("auto", "reference"):
        assert agcheck.gradcheck(lambda a: a.to_dense().sin(), (sparse("coo"),), masked=True, engine=eng)


def test_batched_compressed_inputs_are_moved_correctly():
    # torch's slow masked iteration crashes on batched CSR (IndexError in its own loop);
    # agcheck perturbs it (docs/sparse.md) and then meets torch autograd's own limits
    d = torch.randn(2, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    d[:, 1] = 0
    s = d.to_sparse_csr().requires_grad_()
    positions = torch_sparse.dense_positions(s)
    rebuilt = torch.zeros(s.numel(), dtype=s.dtype).index_put_((positions,), s.detach().values().reshape(-1))
    assert torch.equal(rebuilt, d.reshape(-1))
    kind, _ = outcome(agcheck.gradcheck, lambda a: a.to_dense() * 2, (s,), masked=True)
    assert kind == "RuntimeError"  # torch's backward of to_dense for batched CSR is unsupported


# --------------------------------------------------------------------------------------
# MKL-DNN
# --------------------------------------------------------------------------------------

mkldnn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no MKL-DNN")


class BadMkldnn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, m):
        return m.to_dense() * 2

    @staticmethod
    def backward(ctx, g):
        return (g * 3).to_mkldnn()


def mkldnn_input():
    return (torch.randn(3, 4, generator=torch.Generator().manual_seed(5)).to_mkldnn().requires_grad_(),)


LOOSE = {"atol": 1e-2, "rtol": 1e-2, "eps": 1e-3}  # MKL-DNN tensors are float32


@mkldnn
@pytest.mark.parametrize("fast_mode", MODES, ids=["slow", "fast"])
@pytest.mark.parametrize("kw", [LOOSE, {}, dict(LOOSE, check_forward_ad=True), dict(LOOSE, check_batched_grad=True)],
                         ids=["loose", "defaults", "forward_ad", "batched_grad"])
def test_mkldnn_parity(fast_mode, kw):
    for fn in (lambda m: m.to_dense() ** 2, lambda m: torch.relu(m).to_dense(), BadMkldnn.apply):
        assert_parity(fn, mkldnn_input, fast_mode=fast_mode, **kw)
    kind = assert_parity(BadMkldnn.apply, mkldnn_input, fast_mode=fast_mode, **kw)
    assert kind != "pass"


@mkldnn
def test_mkldnn_beside_dense_and_untouched():
    w = torch.randn(3, 4, generator=torch.Generator().manual_seed(6)).requires_grad_()
    assert_parity(lambda m, w: m.to_dense() * w, lambda: (*mkldnn_input(), w), **LOOSE)
    (m,) = mkldnn_input()
    before = m.to_dense()
    agcheck.gradcheck(lambda a: a.to_dense() ** 2, (m,), **LOOSE)
    assert torch.equal(m.to_dense(), before)


# --------------------------------------------------------------------------------------
# gradgradcheck
# --------------------------------------------------------------------------------------


def gg_outcome(check, fn, inputs, **kw):
    return outcome(check, fn, inputs, **kw)[0]


GG_FUNCTIONS = {
    # the first derivative is sparse: the VJP function has a sparse output (torch: ValueError)
    "to_dense_squared": lambda s: s.to_dense() ** 2,
    # the first derivative is dense (mm's gradient w.r.t. the sparse matrix)
    "matmul_sin": lambda s: torch.sin(s @ W),
    "values_squared": lambda s: _values(s) ** 2,
}


@pytest.mark.parametrize("fast_mode", MODES, ids=["slow", "fast"])
@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", list(GG_FUNCTIONS))
def test_gradgradcheck_parity(name, layout, masked, fast_mode):
    fn = GG_FUNCTIONS[name]
    t = gg_outcome(torch.autograd.gradgradcheck, fn, (sparse(layout),), masked=masked, fast_mode=fast_mode)
    s = sparse(layout)
    before = components_of(s)
    a = gg_outcome(agcheck.gradgradcheck, fn, (s,), masked=masked, fast_mode=fast_mode)
    assert a == t
    assert_same_bits(components_of(s), before)


class DetachedSquare(torch.autograd.Function):
    """``s.to_dense() ** 2`` whose backward is right but not differentiable (detaches s)."""

    @staticmethod
    def forward(ctx, s):
        ctx.save_for_backward(s)
        return s.to_dense() ** 2

    @staticmethod
    def backward(ctx, g):
        (s,) = ctx.saved_tensors
        return _mask_like(g * 2 * s.detach().to_dense(), s)


@pytest.mark.parametrize("fast_mode", MODES, ids=["slow", "fast"])
def test_gradgradcheck_sparse_vjp_dense_goes_beyond_torch(fast_mode):
    # torch (and agcheck by default) reject the sparse gradient of the VJP function;
    # sparse_vjp="dense" checks the second derivatives on the specified elements
    s = sparse("coo")
    with pytest.raises(ValueError, match="Sparse output is not supported"):
        agcheck.gradgradcheck(lambda a: a.to_dense() ** 2, (s,), masked=True, fast_mode=fast_mode)
    for layout in LAYOUTS:
        assert agcheck.gradgradcheck(lambda a: a.to_dense().sin(), (sparse(layout),), masked=True,
                                     fast_mode=fast_mode, sparse_vjp="dense")
    with pytest.raises(agcheck.GradcheckError, match="Jacobian mismatch"):
        agcheck.gradgradcheck(DetachedSquare.apply, (sparse("coo"),), masked=True, fast_mode=fast_mode,
                              sparse_vjp="dense")


def test_sparse_vjp_option_is_validated():
    with pytest.raises(ValueError, match="sparse_vjp must be"):
        agcheck.gradgradcheck(lambda a: a.to_dense() ** 2, (sparse("coo"),), sparse_vjp="yes")
    with pytest.raises(TypeError, match="unexpected keyword argument\(s\) 'wrt'.*'torch' backend takes sparse_vjp= only"):
        agcheck.gradcheck(lambda a: a.to_dense(), (sparse("coo"),), wrt=0)
