"""Parity between ``agcheck.gradcheck(..., backend="torch")`` and ``torch.autograd.gradcheck``.

For every case of ``tests/parity_cases.py`` and both values of ``fast_mode``:

- torch's verdict is measured live (``raise_exception=True``) and compared with agcheck's:
  the same pass / fail, for a failure the same kind of exception (agcheck.GradcheckError for
  torch's GradcheckError, the exact same type otherwise) and torch's key message phrase
  (for a Jacobian mismatch including the output / input indices and the complex-part prefix)
  inside agcheck's message;
- agcheck must leave the inputs bitwise unchanged, their ``.grad`` None, and the global
  torch RNG state as it found it.

``test_torch_verdict_matches_catalog`` keeps the catalog honest against torch alone (every
broken case really fails under torch), and ``test_category_halves`` runs each category's
two halves under agcheck: the correct functions pass, the broken ones fail.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Any

import pytest
import torch
from torch.autograd.gradcheck import GradcheckError as TorchGradcheckError

try:  # tests/ is a package
    from .parity_cases import CASES, CATEGORIES, FAIL, PASS, Box, Case
except ImportError:  # run from inside tests/ without the package
    from parity_cases import CASES, CATEGORIES, FAIL, PASS, Box, Case

# --------------------------------------------------------------------------------------
# key phrases
# --------------------------------------------------------------------------------------

JACOBIAN_RE = re.compile(
    r"(?:While considering the (?:real|imaginary) part of complex (?:outputs|inputs) only, )?"
    r"Jacobian (?:computed with forward mode )?mismatch for output \d+ with respect to input \d+"
)

# Fixed parts of torch's messages, most specific first (a message may contain several:
# "While computing batched gradients" is followed by the generic batched-grad text).
KEY_PHRASES = [
    "Backward is not reentrant",
    "Numerical gradient for function expected to be zero",
    "backward not multiplied by grad_output",
    "Expected backward function to handle undefined output grads",
    "Expected all input grads to be undefined or zero",
    "While computing batched gradients",
    "gradcheck failed while testing batched gradient computation with forward-mode AD",
    "gradcheck or gradgradcheck failed while testing batched gradient computation",
    "Mismatch in tangent values for output with index",
    "Forward AD gradient has dtype mismatch",
    "Gradient has dtype mismatch",
    "Analytical gradient has incorrect size",
    "grad is incorrect type",
    "grad is incorrect device",
    "grad is incorrect size",
    "grad is incorrect layout",
    "no Tensors requiring grad found in input",
    # invalid arguments / inputs (AssertionError, ValueError, RuntimeError)
    "Expected at least one of check_forward_ad or check_backward_ad to be True",
    "Setting check_batched_grad=True requires check_backward_ad to be True",
    "Setting check_batched_forward_grad=True requires check_forward_ad to be True",
    "gradcheck expects at least one input tensor to require gradient",
    "has a dimension with stride 0",
    "Sparse output is not supported at gradcheck yet",
    "MKLDNN output is not supported at gradcheck yet",
    "Expected `func` to return outputs with the same shape when inputs are perturbed",
    "Expected `func` to return outputs with the same dtype when inputs are perturbed",
]


def key_phrase(msg: str) -> str | None:
    """The first key phrase of torch's message ``msg`` (None if it has none)."""
    m = JACOBIAN_RE.search(msg)
    if m:
        return m.group(0)
    for p in KEY_PHRASES:
        if p in msg:
            return p
    return None


def fallback_phrase(msg: str) -> str:
    """For exceptions that are not gradcheck's own (raised by the user's function or by the
    autograd engine), the first line of the message: agcheck must let it through."""
    first = msg.strip().splitlines()[0] if msg.strip() else ""
    return first[:80]


# --------------------------------------------------------------------------------------
# running both checkers
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    kind: str  # "pass", "fail" or "raise:<ExceptionName>"
    message: str = ""
    exc: BaseException | None = None
    value: Any = None

    def short(self) -> str:
        msg = self.message.strip().replace("\n", " | ")
        return f"{self.kind}" + (f" [{type(self.exc).__name__}: {msg[:300]}]" if self.exc else "")


def run_torch(case: Case, fast_mode: bool, *, raise_exception: bool = True) -> Outcome:
    kw = dict(case.kwargs)
    kw["raise_exception"] = raise_exception
    kw["fast_mode"] = fast_mode
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            r = torch.autograd.gradcheck(case.fn, case.make_inputs(), **kw)
        except TorchGradcheckError as e:
            return Outcome(FAIL, str(e), e)
        except Exception as e:  # noqa: BLE001 - the exception type is the verdict
            return Outcome(f"raise:{type(e).__name__}", str(e), e)
    if r is True:
        return Outcome(PASS, value=r)
    if r is False and not raise_exception:
        return Outcome(FAIL, value=r)
    return Outcome(f"returned {r!r}", value=r)


def _agcheck():
    import agcheck

    return agcheck


def run_agcheck(case: Case, fast_mode: bool, inputs: tuple, *, raise_exception: bool | None = None) -> Outcome:
    agcheck = _agcheck()
    kw = dict(case.kwargs)
    if raise_exception is not None:
        kw["raise_exception"] = raise_exception
    raising = kw.get("raise_exception", True)
    kw["fast_mode"] = fast_mode
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            r = agcheck.gradcheck(case.fn, inputs, backend="torch", **kw)
        except agcheck.GradcheckError as e:
            return Outcome(FAIL, str(e), e)
        except TorchGradcheckError as e:  # the same kind, but agcheck must raise its own
            return Outcome("raise:torch.autograd.gradcheck.GradcheckError", str(e), e)
        except Exception as e:  # noqa: BLE001
            return Outcome(f"raise:{type(e).__name__}", str(e), e)
    if r is True:
        return Outcome(PASS, value=r)
    if r is False and not raising:
        return Outcome(FAIL, value=r)
    return Outcome(f"returned {r!r}", value=r)


def fn_name(fn: Any) -> str:
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, type):  # SomeFunction.apply
        return f"{owner.__name__}.{fn.__name__}"
    return getattr(fn, "__qualname__", repr(fn))


def describe(case: Case, fast_mode: bool, torch_out: Outcome | None = None, ag_out: Outcome | None = None) -> str:
    lines = [
        f"case {case.name} (category {case.category}, fast_mode={fast_mode})",
        f"  fn={fn_name(case.fn)} inputs={case.make_inputs!r}",
        f"  kwargs={dict(case.kwargs)!r}",
    ]
    if case.note:
        lines.append(f"  note: {case.note}")
    if torch_out is not None:
        lines.append(f"  torch:   {torch_out.short()}")
    if ag_out is not None:
        lines.append(f"  agcheck: {ag_out.short()}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# input integrity
# --------------------------------------------------------------------------------------


def _dense_bits(t: torch.Tensor) -> torch.Tensor:
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.contiguous().reshape(-1).view(torch.uint8).clone()


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a tensor (for sparse tensors: of its indices and values)."""
    t = t.detach()
    if t.layout == torch.sparse_coo:
        parts = [t._indices(), t._values()]
    elif t.layout in (torch.sparse_csr, torch.sparse_bsr):
        parts = [t.crow_indices(), t.col_indices(), t.values()]
    elif t.layout in (torch.sparse_csc, torch.sparse_bsc):
        parts = [t.ccol_indices(), t.row_indices(), t.values()]
    else:
        return _dense_bits(t)
    return torch.cat([_dense_bits(p) for p in parts])


def _stride(t: torch.Tensor):
    return t.stride() if t.layout == torch.strided else None


def as_tuple(inputs: Any) -> tuple:
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    return tuple(inputs)


def snapshot(inputs: Any) -> list:
    snap = []
    for x in as_tuple(inputs):
        if isinstance(x, torch.Tensor):
            snap.append(("tensor", x, _bits(x), x.shape, _stride(x), x.dtype, x.requires_grad, x.is_leaf))
        else:
            snap.append(("object", x))
    return snap


def assert_unchanged(inputs: Any, snap: list, where: str) -> None:
    inputs = as_tuple(inputs)
    assert len(inputs) == len(snap)
    for i, (x, s) in enumerate(zip(inputs, snap)):
        if s[0] == "object":
            assert x is s[1], f"{where}: non-tensor input {i} was replaced"
            continue
        _, orig, bits, shape, stride, dtype, rg, leaf = s
        assert x is orig, f"{where}: input {i} was replaced"
        assert x.shape == shape and _stride(x) == stride and x.dtype == dtype, f"{where}: input {i} metadata changed"
        assert x.requires_grad == rg and x.is_leaf == leaf, f"{where}: input {i} requires_grad/is_leaf changed"
        assert torch.equal(_bits(x), bits), f"{where}: input {i} is not bitwise unchanged"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # .grad of a non-leaf warns
            assert x.grad is None, f"{where}: input {i} has .grad {x.grad!r}"
        base = getattr(x, "_parity_base", None)
        if base is not None:
            assert base.grad is None, f"{where}: the leaf behind input {i} has .grad {base.grad!r}"


# --------------------------------------------------------------------------------------
# parametrization
# --------------------------------------------------------------------------------------

MODES = [pytest.param(False, id="slow"), pytest.param(True, id="fast")]
CASE_PARAMS = [pytest.param(c, id=c.name) for c in CASES]


# --------------------------------------------------------------------------------------
# the catalog against torch alone
# --------------------------------------------------------------------------------------


def test_catalog_is_well_formed():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))
    for c in CASES:
        for mode in (False, True):
            exp = c.expected(mode)
            assert exp in (PASS, FAIL) or exp.startswith("raise:"), c.name
        if c.broken and not c.parity_only:
            # a broken case torch passes is useless unless it is a deliberate parity case
            assert c.slow != PASS and c.fast != PASS, c.name
        if c.parity_only:
            assert c.note, f"{c.name}: a parity-only case must say why it is there"


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_inputs_are_fresh_and_deterministic(case: Case):
    rng = torch.get_rng_state()
    a, b = case.make_inputs(), case.make_inputs()
    assert torch.equal(torch.get_rng_state(), rng), "making inputs must not touch the global RNG"
    a, b = as_tuple(a), as_tuple(b)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, (list, Box)):
            continue
        if isinstance(x, torch.Tensor):
            assert x is not y
            assert torch.equal(_bits(x), _bits(y)) and _stride(x) == _stride(y)
            if x.requires_grad:
                assert x.dtype in (torch.float64, torch.complex128, torch.float32)
        else:
            assert x == y


@pytest.mark.parametrize("fast_mode", MODES)
@pytest.mark.parametrize("case", CASE_PARAMS)
def test_torch_verdict_matches_catalog(case: Case, fast_mode: bool):
    out = run_torch(case, fast_mode)
    assert out.kind == case.expected(fast_mode), describe(case, fast_mode, out)
    if out.kind == PASS:
        return
    phrase = case.expected_phrase(fast_mode)
    if phrase is not None:
        assert phrase in out.message, describe(case, fast_mode, out)
    if out.kind == FAIL:
        # the extractor must know every gradcheck failure message of the catalog
        assert key_phrase(out.message) is not None, describe(case, fast_mode, out)
        # raise_exception=False turns exactly these into False
        assert run_torch(case, fast_mode, raise_exception=False).value is False
    elif not case.kwargs.get("raise_exception", True):
        assert run_torch(case, fast_mode, raise_exception=False).kind == out.kind


# --------------------------------------------------------------------------------------
# parity
# --------------------------------------------------------------------------------------


def assert_same_outcome(case: Case, fast_mode: bool, torch_out: Outcome, ag_out: Outcome) -> None:
    report = describe(case, fast_mode, torch_out, ag_out)
    assert ag_out.kind == torch_out.kind, "verdicts differ\n" + report
    if torch_out.kind == PASS:
        return
    if torch_out.kind == FAIL:
        if ag_out.exc is not None:
            agcheck = _agcheck()
            assert isinstance(ag_out.exc, agcheck.GradcheckError) and isinstance(ag_out.exc, RuntimeError), report
        phrase = key_phrase(torch_out.message)
        assert phrase is not None, "torch's message has no known key phrase\n" + report
    else:
        assert type(ag_out.exc) is type(torch_out.exc), report
        if case.quirk:
            return  # the type is the parity; the message of a quirk is torch's accident
        phrase = key_phrase(torch_out.message) or fallback_phrase(torch_out.message)
    if ag_out.exc is None:
        return  # raise_exception=False: False is all there is to compare
    assert phrase in ag_out.message, f"key phrase {phrase!r} missing from agcheck's message\n" + report
    # the catalog's own phrase (where the generic key phrase does not tell two checks apart)
    extra = case.expected_phrase(fast_mode)
    if extra and extra in torch_out.message:
        assert extra in ag_out.message, f"phrase {extra!r} missing from agcheck's message\n" + report


# Where agcheck deliberately gives another outcome than torch: case name -> (outcome per
# mode (slow, fast) as Outcome.kind, the reason). Listed in docs/semantics.md too.
DELIBERATE = {
    "eps_zero": (("raise:CheckInputError",) * 2, "eps=0 is rejected up front with a message naming eps (a "
                 "ValueError, and a RuntimeError as torch's failed check is)"),
    "quirk_none_output": (("raise:OutputTypeError",) * 2,
                          "a clear error naming the output; OutputTypeError is also an AttributeError"),
    "quirk_int_output_before_float": (("pass", "pass"),
                                      "torch pairs Jacobians with outputs by position and crashes (IndexError)"),
    "quirk_int_output_between_floats": (("pass", "pass"),
                                        "torch pairs Jacobians with outputs by position and crashes (IndexError)"),
    "quirk_nested_list_input": (("pass", "pass"),
                                "only top-level tensors are inputs; torch crashes on tensors nested in a list"),
    "quirk_nodiff_depends_fwd_only": (("fail", "fail"),
                                      "torch crashes (IndexError) in fast forward mode; agcheck reports the mismatch"),
}


@pytest.mark.parametrize("fast_mode", MODES)
@pytest.mark.parametrize("case", CASE_PARAMS)
def test_parity(case: Case, fast_mode: bool):
    if case.name in DELIBERATE:
        outcomes, reason = DELIBERATE[case.name]
        inputs = case.make_inputs()
        snap = snapshot(inputs)
        got = run_agcheck(case, fast_mode, inputs)
        assert got.kind == outcomes[fast_mode], f"{reason}\n" + describe(case, fast_mode, None, got)
        assert_unchanged(inputs, snap, describe(case, fast_mode, None, got))
        return
    torch_out = run_torch(case, fast_mode)
    if case.kwargs.get("raise_exception", True) is False and torch_out.kind == FAIL:
        torch_ret = run_torch(case, fast_mode, raise_exception=False)
        assert torch_ret.value is False

    inputs = case.make_inputs()
    snap = snapshot(inputs)
    watched = [_bits(t) for t in case.watch]
    rng = torch.get_rng_state()
    ag_out = run_agcheck(case, fast_mode, inputs)
    rng_after = torch.get_rng_state()

    assert_same_outcome(case, fast_mode, torch_out, ag_out)
    assert_unchanged(inputs, snap, describe(case, fast_mode, torch_out, ag_out))
    for t, bits in zip(case.watch, watched):
        assert torch.equal(_bits(t), bits), "a tensor the function closes over changed\n" + describe(case, fast_mode)
        assert t.grad is None, "agcheck left .grad on a tensor the function closes over\n" + describe(case, fast_mode)
    assert torch.equal(rng, rng_after), "agcheck changed the global torch RNG state\n" + describe(
        case, fast_mode, torch_out, ag_out)


FAILING_PARAMS = [
    pytest.param(c, mode, id=f"{c.name}-{'fast' if mode else 'slow'}")
    for c in CASES
    for mode in (False, True)
    if c.expected(mode) == FAIL and c.kwargs.get("raise_exception", True)
    and c.name not in DELIBERATE
]


@pytest.mark.parametrize(("case", "fast_mode"), FAILING_PARAMS)
def test_raise_exception_false_returns_false(case: Case, fast_mode: bool):
    """Every GradcheckError failure becomes a plain False with raise_exception=False."""
    torch_out = run_torch(case, fast_mode, raise_exception=False)
    assert torch_out.value is False, describe(case, fast_mode, torch_out)
    inputs = case.make_inputs()
    snap = snapshot(inputs)
    ag_out = run_agcheck(case, fast_mode, inputs, raise_exception=False)
    assert ag_out.value is False, describe(case, fast_mode, torch_out, ag_out)
    assert_unchanged(inputs, snap, describe(case, fast_mode, torch_out, ag_out))


# --------------------------------------------------------------------------------------
# two halves per category, under agcheck
# --------------------------------------------------------------------------------------

HALVES = [
    cat for cat in CATEGORIES
    if any(c.category == cat and not c.broken for c in CASES)
    and any(c.category == cat and c.broken and not c.parity_only for c in CASES)
]


def test_every_bug_category_has_two_halves():
    expected = {"scaled", "one_entry_off", "transposed", "conj", "grad_output", "nondeterministic",
                "undefined_grad", "batched", "forward_ad", "no_diff_outputs", "multi_input", "multi_output",
                "tolerance", "raise_exception", "dtypes"}
    assert expected <= set(HALVES), expected - set(HALVES)


@pytest.mark.parametrize("category", HALVES)
def test_category_halves(category: str):
    """Correct functions of the category pass under agcheck (both modes); broken ones fail
    with the outcome torch gives them (as recorded in the catalog)."""
    problems = []
    for c in CASES:
        if c.category != category or (c.broken and c.parity_only) or c.quirk:
            continue
        if c.name in DELIBERATE:
            continue  # checked against its deliberate outcome in test_parity
        for mode in (False, True):
            out = run_agcheck(c, mode, c.make_inputs())
            want = c.expected(mode)
            if out.kind != want:
                problems.append(f"{c.name} [{'fast' if mode else 'slow'}]: want {want}, agcheck {out.short()}")
            elif want != PASS and out.exc is not None:
                phrase = c.expected_phrase(mode)
                if phrase and phrase not in out.message:
                    problems.append(f"{c.name} [{'fast' if mode else 'slow'}]: phrase {phrase!r} missing: "
                                    f"{out.short()}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("fast_mode", [False, True])
def test_the_reentrancy_sentence_is_torchs_byte_for_byte(fast_mode):
    import agcheck

    from .helpers import NoisySin

    x = torch.linspace(0.1, 1, 5, dtype=torch.float64, requires_grad=True)
    with pytest.raises(TorchGradcheckError) as theirs:
        torch.autograd.gradcheck(NoisySin.apply, (x,), fast_mode=fast_mode)
    with pytest.raises(agcheck.GradcheckError) as ours:
        agcheck.gradcheck(NoisySin.apply, (x,), fast_mode=fast_mode)
    sentence = str(theirs.value).split("\n")[0]
    assert sentence.startswith("Backward is not reentrant") and "gradient.The tolerance" in sentence
    assert str(ours.value).split("\n")[0] == sentence  # agcheck's own facts follow on lines of their own
    # a calm backward passes both
    assert agcheck.gradcheck(torch.sin, (x,), fast_mode=fast_mode)
