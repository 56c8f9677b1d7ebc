"""Nothing is lost when a check is interrupted: property tests (issue #7).

An exception or ``KeyboardInterrupt`` raised inside ``fn`` (or inside its backward, or
the user's ``vjp``) at *any* call must

* propagate as itself: the very exception object raised, never swallowed, never turned
  into another type (``KeyboardInterrupt`` above all);
* leave what the caller owns as it was: every input bitwise (``-0.0``, NaN payloads; a
  sparse input's indices and values), ``requires_grad``, ``.grad`` (the same object with
  the same bits), the global torch CPU and NumPy RNG states, and for JAX the
  ``jax_enable_x64`` flag.

Each property first counts how many times ``fn`` (or the backward) runs in a full,
passing check of a drawn configuration, then draws ``k`` in ``[0, total)`` and an exception
type, and runs the same check with the ``k``-th call (0-based) raising -- only that call
(``persistent=False``: a transient failure, a single Ctrl-C) or that call and every later
one (``persistent=True``: a deterministic failure).

Besides "the exception propagates", one outcome is accepted because torch does the same
(``TORCH_PARITY``): a ``RuntimeError`` comes out as a ``GradcheckError`` raised ``from`` it
when it was raised under vmap in the batched-gradient checks (by the backward in
``check_batched_grad``, by ``fn`` in ``check_batched_forward_grad``) or by the backward in
the undefined-gradient check -- exactly where ``torch.autograd.gradcheck`` wraps it.

The properties found three ways the caller's error or state was lost; all three were fixed
in commit 2d10d1b and are now pinned by ordinary tests:

* in slow mode with ``engine="auto"`` a one-off ``Exception`` raised by ``fn`` while
  ``agcheck/engine.py`` ran -- in its probe or its element-by-element rows, plain calls --
  was caught, the reference engine re-ran the check, and it passed
  (``test_transient_error_in_a_plain_engine_call_propagates``);
* a ``RuntimeError`` raised by ``fn`` itself during the undefined-gradient check became a
  ``GradcheckError`` (torch evaluates ``fn`` outside its ``try`` and lets the error through;
  ``test_fn_errors_in_the_undefined_grad_check_propagate_as_in_torch``);
* gradgradcheck's one evaluation of ``fn`` for the random ``grad_outputs`` left the NumPy
  global RNG advanced (``test_gradgradcheck_keeps_the_numpy_rng_when_fn_draws_from_it``).

One deviation remains (``KNOWN_GAPS``, counted as a hypothesis event, pinned by a strict
xfail so that a fix shows up as an XPASS): a one-off ``Exception`` raised by ``fn`` (or its
backward) *under one of the engine's vmapped evaluations* cannot be told from "this
function cannot be batched"; the engine falls back, the exact engines re-run the check,
and it passes. The property accepts a swallowed exception only when its call was under a
backend's ``evaluate_batch`` / ``vjp_batched`` / ``vjp_many`` / ``jvp_batched`` / ``jvp_rows`` (read off
the call stack), never ``KeyboardInterrupt``, never a persistent error.

Runtime (``max_examples`` 25-40, ``-n 2``): under 4 s per test, the JAX test 13-17 s (JAX
compiles its primitives for every new configuration). The examples are derandomized so
CI is deterministic. ``AGCHECK_INTERRUPT_EXAMPLES=N`` runs ``N`` random
(not derandomized) examples per test instead, to search wider.
"""
from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st
from torch.autograd.gradcheck import GradcheckError as TorchGradcheckError

import agcheck
from agcheck import GradcheckError

from .helpers import bits, property_settings

EXCEPTIONS = [KeyboardInterrupt, RuntimeError, ValueError]


def _settings(n: int):
    return property_settings(n, wide_by="AGCHECK_INTERRUPT_EXAMPLES")


# --------------------------------------------------------------------------------------
# the interrupting call counter
# --------------------------------------------------------------------------------------


#: the backends' batched evaluations: Backend.evaluate_batch (vmapped), evaluate_stacked, Trace.vjp_batched,
#: Trace.vjp_many, Backend.jvp_batched / jvp_rows (the NumPy backend's are loops of plain calls)
_BATCHED_CALLS = frozenset({"evaluate_batch", "evaluate_stacked", "vjp_batched", "vjp_many", "jvp_batched", "jvp_rows"})


def inside_batched_evaluation() -> bool:
    """Is the running call of fn (or its backward) under a backend's vmapped evaluation?"""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name in _BATCHED_CALLS and "numpy_backend" not in code.co_filename:
            return True
        frame = frame.f_back
    return False


class Interrupter:
    """Counts calls; with ``k`` set, call ``k`` (0-based) raises ``exc`` -- and every later
    call too if ``persistent``. Every exception raised is kept, to recognise it later, with
    whether it was raised under a batched (vmapped) evaluation."""

    def __init__(self, k=None, exc=None, persistent=False):
        self.k, self.exc, self.persistent = k, exc, persistent
        self.calls = 0
        self.raised: list[BaseException] = []
        self.raised_batched: list[bool] = []

    def tick(self) -> None:
        n = self.calls
        self.calls += 1
        if self.k is not None and (n == self.k or (self.persistent and n > self.k)):
            e = self.exc(f"interrupted at call {n}")
            self.raised.append(e)
            self.raised_batched.append(inside_batched_evaluation())
            raise e

    def is_ours(self, e) -> bool:
        return any(e is r for r in self.raised)


def draw_call(data, counter: Interrupter) -> int:
    """The call to interrupt, among those the counting run made: drawn as a position in
    [0, 1) -- so that what is drawn does not depend on the count, which may differ between
    runs of one example (the engine chooses loop or batch from timings) -- from two digits
    in base 100 (hypothesis draws small ranges uniformly, large ones mostly near 0)."""
    assert counter.calls > 0, "the passing check never called the function under test"
    coarse = data.draw(st.integers(0, 99), label="position of k, first base-100 digit")
    fine = data.draw(st.integers(0, 99), label="position of k, second base-100 digit")
    k = (coarse * 100 + fine) * counter.calls // 10_000
    event(f"k in quarter {4 * k // counter.calls + 1} of the calls")
    return k


def run(check):
    """The check's result, or the exception it raised (KeyboardInterrupt included)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return check()
    except BaseException as e:  # noqa: BLE001 - the exception *is* the outcome
        return e


# outcomes besides "our exception propagated", each accepted only where named
TORCH_PARITY = "RuntimeError reported as a GradcheckError raised from it, where torch does so"
#: (where it was raised, the check that reports it) -> torch wraps a RuntimeError there too:
#: vmap in the batched checks (_test_batched_grad / _test_batched_grad_forward_ad), and
#: autograd.grad in the undefined-grad check (_test_undefined_backward_mode)
_TORCH_WRAPS = {("backward", "batched_grad"), ("backward", "undefined_grad"), ("forward", "batched_forward_grad")}
KNOWN_GAPS = {
    "transient_swallowed_by_engine":
        "slow mode, engine='auto': a one-off exception of fn inside a batched (vmapped) "
        "evaluation is taken for 'cannot batch'; the exact engines then re-run the check",
}


def assert_interrupted(outcome, counter: Interrupter, *, where="forward", engine_runs=False):
    """``outcome`` (of :func:`run`) is what an interrupted check must give.

    ``where``: "forward" (``fn`` raises) or "backward" (its backward / vjp raises).
    ``engine_runs``: the check runs ``agcheck/engine.py`` (slow mode, engine "auto"), which
    takes an ``Exception`` under its vmapped evaluations for "cannot batch"
    (KNOWN_GAPS["transient_swallowed_by_engine"]).
    """
    if not counter.raised:
        # the k-th call never came: the batched engine's choices (loop or batch) follow
        # timings, so a run may call the backward fewer times than the counting run did
        event("interrupting call not reached")
        assert outcome is True, f"an uninterrupted check must pass, got {outcome!r}"
        return
    exc = counter.exc
    if isinstance(outcome, BaseException):
        if counter.is_ours(outcome):
            assert type(outcome) is exc
            event(f"propagated {exc.__name__}")
            return
        if isinstance(outcome, GradcheckError) and exc is RuntimeError and counter.is_ours(outcome.__cause__):
            check = getattr(outcome, "check", None)
            if (where, check) in _TORCH_WRAPS:
                event(f"{TORCH_PARITY} ({check})")
                return
        raise AssertionError(
            f"{exc.__name__} raised inside {where} came out as {type(outcome).__name__}: {outcome!s:.300}"
        ) from outcome
    # the check returned: only a transient Exception raised under a vmapped evaluation of
    # the engine (taken for "cannot batch"; the exact engines then re-ran the check) may
    # end like that
    assert exc is not KeyboardInterrupt, "KeyboardInterrupt was swallowed"
    assert engine_runs and not counter.persistent and counter.raised_batched == [True], (
        f"{exc.__name__} raised inside {where} ({'under vmap' if any(counter.raised_batched) else 'a plain call'}) "
        f"was swallowed; the check returned {outcome!r}"
    )
    assert outcome is True, f"after swallowing {exc.__name__} the check must still pass, got {outcome!r}"
    event("KNOWN GAP: " + KNOWN_GAPS["transient_swallowed_by_engine"])


# --------------------------------------------------------------------------------------
# what the caller owns (torch)
# --------------------------------------------------------------------------------------


def _components(t: torch.Tensor) -> list:
    if t.layout == torch.sparse_coo:
        return [t._indices(), t._values()]
    return [t]


def _raw(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return bits(t) if (t.is_floating_point() or t.is_complex()) else t.clone()


class Owned:
    """Inputs' bits (a COO input: indices and values), ``requires_grad``, ``.grad`` (object
    and bits), the torch CPU and NumPy global RNG states."""

    def __init__(self, inputs):
        self.inputs = [x for x in inputs if isinstance(x, torch.Tensor)]
        self.bits = [[_raw(c) for c in _components(x)] for x in self.inputs]
        self.requires_grad = [x.requires_grad for x in self.inputs]
        self.grads = [x.grad for x in self.inputs]
        self.grad_bits = [None if g is None else bits(g) for g in self.grads]
        self.torch_rng = torch.get_rng_state()
        self.np_rng = np.random.get_state()

    def assert_unchanged(self):
        for i, x in enumerate(self.inputs):
            now = [_raw(c) for c in _components(x)]
            assert len(now) == len(self.bits[i])
            for a, b in zip(now, self.bits[i]):
                assert a.shape == b.shape and torch.equal(a, b), f"input {i} changed"
            assert x.requires_grad == self.requires_grad[i], f"input {i}: requires_grad changed"
            assert x.grad is self.grads[i], f"input {i}: .grad replaced"
            if self.grads[i] is not None:
                assert torch.equal(bits(x.grad), self.grad_bits[i]), f"input {i}: .grad values changed"
        assert torch.equal(torch.get_rng_state(), self.torch_rng), "torch CPU RNG state changed"
        assert_np_state_equal(np.random.get_state(), self.np_rng)


def np_states_equal(a, b) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and a[2:] == b[2:]


def assert_np_state_equal(now, then):
    assert np_states_equal(now, then), "NumPy global RNG state changed"


def np_state_after_one_draw():
    """The global NumPy RNG state one ``np.random.random()`` from now (state untouched)."""
    before = np.random.get_state()
    np.random.random()
    after = np.random.get_state()
    np.random.set_state(before)
    return after


NAN_WITH_PAYLOAD = 0x7FF8_0000_0000_1234  # a quiet NaN whose payload must survive


def plant_specials(t: torch.Tensor) -> None:
    """-0.0 at flat element 0 and a NaN with a payload at the last element of ``t`` (in
    place; the real parts of a complex ``t``). The functions leave the last element out."""
    with torch.no_grad():
        r = (torch.view_as_real(t) if t.is_complex() else t).detach().view(-1)
        r[0] = -0.0
        r.view(torch.int64)[-2 if t.is_complex() else -1] = NAN_WITH_PAYLOAD


def seeded(shape, dtype, seed, requires_grad=True):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, dtype=dtype, generator=gen).requires_grad_(requires_grad)


# --------------------------------------------------------------------------------------
# torch: fn raises
# --------------------------------------------------------------------------------------


def body(inputs, specials=False):
    """A smooth function of one or two inputs (real or complex); with ``specials``, of all
    their elements but the last (the planted NaN)."""
    if specials:
        inputs = [t.reshape(-1)[:-1] for t in inputs]
    x = inputs[0]
    out = x.sin() * 2
    if len(inputs) > 1:
        out = out + x * inputs[1].cos()
    return out


def forward_fn(counter: Interrupter, draws_rng: bool, specials: bool = False):
    def fn(*inputs):
        counter.tick()
        if draws_rng:  # the caller's RNG states must be restored even so
            torch.rand(())
            np.random.random()
        return body(inputs, specials)

    return fn


@st.composite
def torch_configs(draw):
    fast_mode = draw(st.booleans())
    forward_ad = draw(st.booleans())
    draws_rng = draw(st.booleans())
    shape = draw(st.sampled_from([(), (3,), (4, 5)]))
    return dict(
        shape=shape,
        specials=shape != () and draw(st.booleans()),
        dtype=draw(st.sampled_from([torch.float64, torch.complex128])),
        n_inputs=draw(st.sampled_from([1, 2])),
        second_requires_grad=draw(st.booleans()),
        with_grad=draw(st.booleans()),
        draws_rng=draws_rng,
        kw=dict(
            fast_mode=fast_mode,
            engine=draw(st.sampled_from(["auto", "reference"])),
            check_forward_ad=forward_ad,
            check_batched_grad=draw(st.booleans()),
            # vmap refuses random operations (torch.rand in fn): no batched forward check then
            check_batched_forward_grad=forward_ad and not draws_rng and draw(st.booleans()),
        ),
    )


def torch_inputs(cfg, seed=0):
    x = seeded(cfg["shape"], cfg["dtype"], seed)
    inputs = [x]
    if cfg["n_inputs"] > 1:
        inputs.append(seeded(cfg["shape"], cfg["dtype"], seed + 1, requires_grad=cfg["second_requires_grad"]))
    if cfg.get("specials"):
        for t in inputs:
            plant_specials(t)
    if cfg["with_grad"]:
        x.grad = torch.full_like(x, -0.0)  # a .grad that must survive, bits and all
    return tuple(inputs)


def engine_runs(kw) -> bool:
    """Does the check run agcheck/engine.py (slow mode, engine "auto")?"""
    return not kw.get("fast_mode", False) and kw.get("engine", "auto") == "auto"


@_settings(40)
@given(cfg=torch_configs(), exc=st.sampled_from(EXCEPTIONS), persistent=st.booleans(),
       seed=st.integers(0, 2**16), data=st.data())
def test_torch_fn_raising_at_any_call(cfg, exc, persistent, seed, data):
    counter = Interrupter()
    assert run(lambda: agcheck.gradcheck(forward_fn(counter, cfg["draws_rng"], cfg["specials"]), torch_inputs(cfg), **cfg["kw"])) is True
    k = draw_call(data, counter)

    inputs = torch_inputs(cfg)
    torch.manual_seed(seed)
    np.random.seed(seed)
    owned = Owned(inputs)
    interrupter = Interrupter(k, exc, persistent)
    outcome = run(lambda: agcheck.gradcheck(forward_fn(interrupter, cfg["draws_rng"], cfg["specials"]), inputs, **cfg["kw"]))
    assert_interrupted(outcome, interrupter, engine_runs=engine_runs(cfg["kw"]))
    owned.assert_unchanged()


# --------------------------------------------------------------------------------------
# torch: the backward raises (a custom autograd.Function)
# --------------------------------------------------------------------------------------


def backward_raising_fn(counter: Interrupter, n_inputs: int, specials: bool = False):
    """``body`` as a custom Function whose backward ticks ``counter``. The backward is
    written with differentiable ops, so gradgradcheck can differentiate it again."""

    class Sin(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin() * 2

        @staticmethod
        def backward(ctx, g):
            counter.tick()
            (x,) = ctx.saved_tensors
            return g * (x.cos() * 2).conj()

    class MulCos(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(x, y)
            return x * y.cos()

        @staticmethod
        def backward(ctx, g):
            counter.tick()
            x, y = ctx.saved_tensors
            return g * y.cos().conj(), -g * (x * y.sin()).conj()

    def fn(*inputs):
        if specials:
            inputs = [t.reshape(-1)[:-1] for t in inputs]
        out = Sin.apply(inputs[0])
        if n_inputs > 1:
            out = out + MulCos.apply(inputs[0], inputs[1])
        return out

    return fn


@_settings(40)
@given(cfg=torch_configs(), exc=st.sampled_from(EXCEPTIONS), persistent=st.booleans(),
       seed=st.integers(0, 2**16), data=st.data())
def test_torch_backward_raising_at_any_call(cfg, exc, persistent, seed, data):
    kw = dict(cfg["kw"], check_forward_ad=False, check_batched_forward_grad=False)  # no jvp defined
    counter = Interrupter()
    assert run(lambda: agcheck.gradcheck(backward_raising_fn(counter, cfg["n_inputs"], cfg["specials"]), torch_inputs(cfg), **kw)) is True
    k = draw_call(data, counter)

    inputs = torch_inputs(cfg)
    torch.manual_seed(seed)
    owned = Owned(inputs)
    interrupter = Interrupter(k, exc, persistent)
    outcome = run(lambda: agcheck.gradcheck(backward_raising_fn(interrupter, cfg["n_inputs"], cfg["specials"]), inputs, **kw))
    assert_interrupted(outcome, interrupter, where="backward", engine_runs=engine_runs(kw))
    owned.assert_unchanged()


# --------------------------------------------------------------------------------------
# torch: gradgradcheck (fn or its backward raises while the VJP is checked)
# --------------------------------------------------------------------------------------


@_settings(30)
@given(shape=st.sampled_from([(3,), (4, 5)]), dtype=st.sampled_from([torch.float64, torch.complex128]),
       n_inputs=st.sampled_from([1, 2]), fast_mode=st.booleans(), where=st.sampled_from(["forward", "backward"]),
       check_batched_grad=st.booleans(), draws_rng=st.booleans(),
       exc=st.sampled_from(EXCEPTIONS), persistent=st.booleans(), seed=st.integers(0, 2**16), data=st.data())
def test_gradgradcheck_interrupted_at_any_call(shape, dtype, n_inputs, fast_mode, where, check_batched_grad,
                                               draws_rng, exc, persistent, seed, data):
    cfg = dict(shape=shape, dtype=dtype, n_inputs=n_inputs, second_requires_grad=True, with_grad=False)
    kw = dict(fast_mode=fast_mode, check_batched_grad=check_batched_grad)

    def make_fn(counter):
        return forward_fn(counter, draws_rng) if where == "forward" else backward_raising_fn(counter, n_inputs)

    counter = Interrupter()
    assert run(lambda: agcheck.gradgradcheck(make_fn(counter), torch_inputs(cfg), **kw)) is True
    k = draw_call(data, counter)

    inputs = torch_inputs(cfg)
    torch.manual_seed(seed)
    np.random.seed(seed)
    owned = Owned(inputs)
    interrupter = Interrupter(k, exc, persistent)
    outcome = run(lambda: agcheck.gradgradcheck(make_fn(interrupter), inputs, **kw))
    assert_interrupted(outcome, interrupter, where=where, engine_runs=engine_runs(kw))
    owned.assert_unchanged()


# --------------------------------------------------------------------------------------
# torch: a sparse COO input (indices and values unchanged)
# --------------------------------------------------------------------------------------

_MASK = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 1]], dtype=torch.bool)


def sparse_input(dtype, uncoalesced, seed=0):
    gen = torch.Generator().manual_seed(seed)
    d = torch.randn(4, 4, dtype=dtype, generator=gen) * _MASK
    s = d.to_sparse()
    if uncoalesced:  # a repeated entry: its element is the sum of the two
        i, v = s._indices(), s._values()
        s = torch.sparse_coo_tensor(torch.cat([i, i[:, :1]], 1), torch.cat([v, v[:1] * 0.5]), s.shape)
    return s.requires_grad_()


def sparse_fn(counter: Interrupter, where: str):
    class ToDenseSin(torch.autograd.Function):
        @staticmethod
        def forward(ctx, s):
            ctx.save_for_backward(s)
            return s.to_dense().sin()

        @staticmethod
        def backward(ctx, g):
            counter.tick()
            (s,) = ctx.saved_tensors
            dense = s.detach().to_dense()
            return g * dense.cos().conj()  # a dense gradient for every element (unmasked)

    def fn(s):
        if where == "forward":
            counter.tick()
            return s.to_dense(masked_grad=False).sin()
        return ToDenseSin.apply(s)

    return fn


@_settings(30)
@given(dtype=st.sampled_from([torch.float64, torch.complex128]), uncoalesced=st.booleans(),
       fast_mode=st.booleans(), where=st.sampled_from(["forward", "backward"]),
       exc=st.sampled_from(EXCEPTIONS), persistent=st.booleans(), data=st.data())
def test_sparse_coo_input_interrupted_at_any_call(dtype, uncoalesced, fast_mode, where, exc, persistent, data):
    kw = dict(fast_mode=fast_mode, masked=False)
    if where == "backward":
        kw["check_undefined_grad"] = False  # torch rejects the undefined-grad check here
    counter = Interrupter()
    assert run(lambda: agcheck.gradcheck(sparse_fn(counter, where), (sparse_input(dtype, uncoalesced),), **kw)) is True
    k = draw_call(data, counter)

    s = sparse_input(dtype, uncoalesced)
    owned = Owned([s])
    interrupter = Interrupter(k, exc, persistent)
    outcome = run(lambda: agcheck.gradcheck(sparse_fn(interrupter, where), (s,), **kw))
    assert_interrupted(outcome, interrupter, where=where)  # the engine leaves sparse inputs alone
    owned.assert_unchanged()
    assert s.is_coalesced() == (not uncoalesced)


# --------------------------------------------------------------------------------------
# the pinned deviations (KNOWN_GAPS): strict xfails, so that a fix shows up here
# --------------------------------------------------------------------------------------


def _raising_once_at(k, exc):
    counter = Interrupter(k, exc, persistent=False)

    def fn(x):
        counter.tick()
        return x.sin()

    return fn, counter


@pytest.mark.parametrize("shape,k,kw", [
    # call 0 is the first evaluation, call 1 the probe's batched evaluation of the moved
    # input, call 2 one of the probe's plain evaluations that it is compared with (an
    # ordinary evaluation: its error is the caller's, not a reason to stop batching)
    ((5, 7), 2, {}),
    # a scalar is never batched: the forward-mode engine tries one batched JVP (call 3),
    # then moves it element by element, and call 4 is one of those plain evaluations
    ((), 4, dict(check_forward_ad=True)),
], ids=["probe", "looped-forward"])
def test_transient_error_in_a_plain_engine_call_propagates(shape, k, kw, monkeypatch):
    from agcheck.engine import cost

    # the engine runs however cheap the loop would be: the calls are counted on its path
    # (with "auto" a check this small may take the loop, or have its first call timed again)
    monkeypatch.setattr(cost, "ENGINE_FROM_CALLS", 0)
    fn, counter = _raising_once_at(k, ValueError)
    with pytest.raises(ValueError) as info:
        agcheck.gradcheck(fn, (seeded(shape, torch.float64, 0),), **kw)
    assert counter.is_ours(info.value)


@pytest.mark.xfail(strict=True, reason=KNOWN_GAPS["transient_swallowed_by_engine"])
def test_known_gap_transient_error_in_a_batched_evaluation():
    # call 0 is the first evaluation, call 1 the probe's batched evaluation of the moved
    # input (calls 2-3 are the probe's plain ones). engine="batched": with "auto", a check
    # this small goes to the reference engine at once
    fn, counter = _raising_once_at(1, ValueError)
    with pytest.raises(ValueError):
        agcheck.gradcheck(fn, (seeded((5, 7), torch.float64, 0),), engine="batched")


def test_raises_under_vmap_are_told_from_plain_ones():
    # what the property's allowance rests on: call 1 is the probe's batched evaluation,
    # call 2 one of its plain evaluations (engine="batched", as above)
    for k, batched in ((1, True), (2, False)):
        fn, counter = _raising_once_at(k, ValueError)
        run(lambda: agcheck.gradcheck(fn, (seeded((5, 7), torch.float64, 0),), engine="batched"))
        assert counter.raised_batched == [batched]


def test_transient_error_propagates_from_the_reference_engine():
    fn, counter = _raising_once_at(1, ValueError)
    with pytest.raises(ValueError) as info:
        agcheck.gradcheck(fn, (seeded((5, 7), torch.float64, 0),), engine="reference")
    assert counter.is_ours(info.value)


def test_gradgradcheck_keeps_the_numpy_rng_when_fn_draws_from_it():
    np.random.seed(0)
    before = np.random.get_state()

    def fn(x):
        np.random.random()
        return x.sin()

    assert agcheck.gradgradcheck(fn, (seeded((3,), torch.float64, 0),))
    assert_np_state_equal(np.random.get_state(), before)


def _undefined_grad_check_call(check=agcheck.gradcheck) -> int:
    """The 0-based call of ``fn`` that the undefined-grad check makes (the last one)."""
    counter = Interrupter()
    check(forward_fn(counter, False), (seeded((3,), torch.float64, 0),))
    return counter.calls - 1


def test_torch_lets_fn_errors_in_its_undefined_grad_check_through():
    interrupter = Interrupter(_undefined_grad_check_call(torch.autograd.gradcheck), RuntimeError)
    with pytest.raises(RuntimeError) as info:
        torch.autograd.gradcheck(forward_fn(interrupter, False), (seeded((3,), torch.float64, 0),))
    assert interrupter.is_ours(info.value) and not isinstance(info.value, TorchGradcheckError)


def test_fn_errors_in_the_undefined_grad_check_propagate_as_in_torch():
    interrupter = Interrupter(_undefined_grad_check_call(), RuntimeError)
    with pytest.raises(RuntimeError) as info:
        agcheck.gradcheck(forward_fn(interrupter, False), (seeded((3,), torch.float64, 0),), raise_exception=False)
    assert interrupter.is_ours(info.value)


# --------------------------------------------------------------------------------------
# JAX: the inputs (immutable anyway) and jax_enable_x64 unchanged
# --------------------------------------------------------------------------------------


def _jax():
    return pytest.importorskip("jax"), pytest.importorskip("jax.numpy")


@_settings(25)
@given(x64=st.booleans(), complex_input=st.booleans(),
       n_inputs=st.sampled_from([1, 2]), where=st.sampled_from(["forward", "backward"]),
       fast_mode=st.booleans(), forward_ad=st.booleans(), check_batched_grad=st.booleans(),
       exc=st.sampled_from(EXCEPTIONS), persistent=st.booleans(), data=st.data())
def test_jax_interrupted_at_any_call(x64, complex_input, n_inputs, where, fast_mode, forward_ad,
                                     check_batched_grad, exc, persistent, data):
    jax, jnp = _jax()
    shape = (4, 5)  # one shape: JAX compiles every primitive anew for each shape (seconds)
    before_flag = bool(jax.config.jax_enable_x64)

    def inputs():
        rng = np.random.default_rng(3)
        vals = [rng.standard_normal(shape) + (1j * rng.standard_normal(shape) if complex_input else 0)
                for _ in range(n_inputs)]
        dtype = (np.complex128 if complex_input else np.float64) if x64 else (np.complex64 if complex_input else np.float32)
        return tuple(jnp.asarray(v.astype(dtype)) for v in vals)

    def make_fn(counter):
        @jax.custom_vjp
        def sin2(x):
            return jnp.sin(x) * 2

        def sin2_fwd(x):
            return sin2(x), x

        def sin2_bwd(x, g):
            counter.tick()
            return (g * jnp.cos(x) * 2,)  # JAX's convention for holomorphic f: g * f'(x)

        sin2.defvjp(sin2_fwd, sin2_bwd)

        def fn(*xs):
            if where == "forward":
                counter.tick()
                out = jnp.sin(xs[0]) * 2
            else:
                out = sin2(xs[0])
            if len(xs) > 1:
                out = out + xs[0] * jnp.cos(xs[1])
            return out

        return fn

    # custom_vjp has no forward mode: the forward-AD checks run only when fn raises
    kw = dict(fast_mode=fast_mode, check_batched_grad=check_batched_grad,
              check_forward_ad=forward_ad and where == "forward")
    if not x64:
        kw.update(eps=1e-2, atol=1e-2, rtol=1e-2)
    with jax.enable_x64(x64):
        counter = Interrupter()
        assert run(lambda: agcheck.gradcheck(make_fn(counter), inputs(), backend="jax", **kw)) is True
        k = draw_call(data, counter)
        xs = inputs()
        before = [np.asarray(x).tobytes() for x in xs]
        np_rng = np.random.get_state()
        interrupter = Interrupter(k, exc, persistent)
        outcome = run(lambda: agcheck.gradcheck(make_fn(interrupter), xs, backend="jax", **kw))
        assert bool(jax.config.jax_enable_x64) == x64, "jax_enable_x64 changed inside the check"
        assert_interrupted(outcome, interrupter, where=where, engine_runs=engine_runs(kw))
        assert [np.asarray(x).tobytes() for x in xs] == before, "a JAX input changed"
        assert_np_state_equal(np.random.get_state(), np_rng)
    assert bool(jax.config.jax_enable_x64) == before_flag


# --------------------------------------------------------------------------------------
# NumPy backend: fn or the user's vjp raises; the arrays (mutable!) unchanged
# --------------------------------------------------------------------------------------


@_settings(25)
@given(shape=st.sampled_from([(), (3,), (4, 5)]), complex_input=st.booleans(), n_inputs=st.sampled_from([1, 2]),
       where=st.sampled_from(["forward", "backward"]), fast_mode=st.booleans(), check_batched_grad=st.booleans(),
       specials=st.booleans(), exc=st.sampled_from(EXCEPTIONS), persistent=st.booleans(), data=st.data())
def test_numpy_interrupted_at_any_call(shape, complex_input, n_inputs, where, fast_mode, check_batched_grad,
                                       specials, exc, persistent, data):
    def inputs():
        rng = np.random.default_rng(5)
        xs = []
        for _ in range(n_inputs):
            v = rng.standard_normal(shape)
            if complex_input:
                v = v + 1j * rng.standard_normal(shape)
            xs.append(np.asarray(v))
        if specials and n_inputs > 1 and xs[1].size:
            xs[1].reshape(-1)[0] = -0.0  # y enters through cos, even: -0.0 is harmless
        return tuple(xs)

    def make(counter):
        def fn(*xs):
            if where == "forward":
                counter.tick()
            np.random.random()  # the global NumPy RNG must be restored even so
            out = np.sin(xs[0]) * 2
            if len(xs) > 1:
                out = out + xs[0] * np.cos(xs[1])
            return out

        def vjp(xs, cots):
            if where == "backward":
                counter.tick()
            (g,) = cots
            gx = g * np.conj(np.cos(xs[0]) * 2)
            if len(xs) == 1:
                return (gx,)
            gx = gx + g * np.conj(np.cos(xs[1]))
            return gx, -g * np.conj(xs[0] * np.sin(xs[1]))

        return fn, vjp

    kw = dict(fast_mode=fast_mode, check_batched_grad=check_batched_grad)
    counter = Interrupter()
    fn, vjp = make(counter)
    assert run(lambda: agcheck.gradcheck(fn, inputs(), backend="numpy", vjp=vjp, **kw)) is True
    k = draw_call(data, counter)

    xs = inputs()
    before = [(x.tobytes(), x.flags.writeable) for x in xs]
    np_rng = np.random.get_state()
    interrupter = Interrupter(k, exc, persistent)
    fn, vjp = make(interrupter)
    outcome = run(lambda: agcheck.gradcheck(fn, xs, backend="numpy", vjp=vjp, **kw))
    assert_interrupted(outcome, interrupter, where=where, engine_runs=engine_runs(kw))
    assert [(x.tobytes(), x.flags.writeable) for x in xs] == before, "a NumPy input changed"
    assert_np_state_equal(np.random.get_state(), np_rng)
