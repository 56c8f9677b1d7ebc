"""Small shared helpers of agcheck's tests: inputs from private generators, snapshots."""
import os
import time

import pytest
import torch


def property_settings(examples: int, wide_by: str = "AGCHECK_PROPERTY_EXAMPLES"):
    """Hypothesis settings of a property test: ``examples`` derandomized examples, the same
    on every run (CI); with the environment variable ``wide_by`` set to ``N``, ``N`` random
    ones instead, to search wider (docs/verification.md)."""
    from hypothesis import HealthCheck, settings

    wide = os.environ.get(wide_by)
    return settings(max_examples=int(wide) if wide else examples, derandomize=not wide, deadline=None,
                    database=None, suppress_health_check=list(HealthCheck))


def make(*shape, dtype=torch.float64, seed=0, requires_grad=True, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tuple(shape), dtype=dtype, generator=gen).to(device)
    return x.requires_grad_(requires_grad)


def torch_text(error) -> str:
    """The torch-compatible text of an error agcheck raised (``error.report.message``: its
    message without agcheck's summary, which follows torch's first line), or the whole
    message of any other error; without its final newline."""
    report = getattr(error, "report", None)
    return (report.message if report is not None and report.message else str(error)).rstrip("\n")


def first_paragraph(check, fn, args, **kw) -> str:
    """The first paragraph of torch's text in the error ``check(fn, args, **kw)`` raises."""
    import pytest

    with pytest.raises(RuntimeError) as info:
        check(fn, args, **kw)
    return torch_text(info.value).split("\n\n")[0]


def torch_message(fn, args) -> str:
    """The message of the error ``torch.autograd.gradcheck(fn, args)`` raises, without its
    final newline."""
    import pytest

    with pytest.raises(RuntimeError) as info:
        torch.autograd.gradcheck(fn, args)
    return str(info.value).rstrip("\n")


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a dense tensor, so that equality is bitwise (NaN payloads, -0.0)."""
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(width).clone()


class Snapshot:
    """What the caller owns: input bits, requires_grad, .grad, the global RNG state."""

    def __init__(self, inputs):
        self.inputs = [x for x in inputs if isinstance(x, torch.Tensor)]
        self.bits = [bits(x) for x in self.inputs]
        self.requires_grad = [x.requires_grad for x in self.inputs]
        self.grads = [x.grad for x in self.inputs]
        self.rng = torch.get_rng_state()

    def assert_unchanged(self):
        for x, b, rg, g in zip(self.inputs, self.bits, self.requires_grad, self.grads):
            assert torch.equal(bits(x), b), "input values changed"
            assert x.requires_grad == rg, "requires_grad changed"
            assert x.grad is g, ".grad changed"
        assert torch.equal(torch.get_rng_state(), self.rng), "global RNG state changed"


def busy(seconds: float) -> None:
    """Work (not wait) for ``seconds`` of this thread's CPU time: a slow step simulated
    busy, never asleep, costs the same on a loaded machine as on an idle one."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def digest_kept_waiting(monkeypatch, call: int = 6, seconds: float = 0.05) -> list:
    """Make the torch backend's ``content_digest`` wait ``seconds`` (asleep, as a process
    the scheduler preempted on a busy machine) on its ``call``-th call; returns the list
    the calls are counted in."""
    import agcheck

    backend = type(agcheck.get_backend("torch"))
    digest, calls = backend.content_digest, []

    def kept_waiting(self, x):
        calls.append(1)
        if len(calls) == call:
            time.sleep(seconds)
        return digest(self, x)

    monkeypatch.setattr(backend, "content_digest", kept_waiting)
    return calls


class NoisySin(torch.autograd.Function):
    """sin whose backward differs from run to run by 1e-8 relative (within gradcheck's
    tolerances, outside ``nondet_tol=0``): a backward that is not reentrant."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        NoisySin.calls += 1
        return grad * x.cos() * (1 + 1e-8 * NoisySin.calls)


class ScaledSin(torch.autograd.Function):
    """sin with a backward scaled by ``ScaledSin.factor`` (1.0 is correct), without a vmap
    rule; its backward calls are counted in ``ScaledSin.calls``."""

    factor = 1.0
    calls = 0

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, grad):
        ScaledSin.calls += 1
        (x,) = ctx.saved_tensors
        return grad * x.cos() * ScaledSin.factor


class SinWithJvp(torch.autograd.Function):
    """sin in forward mode only, its JVP scaled by ``SinWithJvp.factor`` (1.0 is right)
    and working ``SinWithJvp.jvp_seconds`` per call (a JVP far dearer than an evaluation,
    as a complex input's are in torch)."""

    factor, jvp_seconds = 1.0, 0.0

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_forward(x)
        return x.sin()

    @staticmethod
    def jvp(ctx, t):
        busy(SinWithJvp.jvp_seconds)
        (x,) = ctx.saved_tensors
        return t * x.cos() * SinWithJvp.factor


class OneEntryOff(torch.autograd.Function):
    """sin, its backward 1% off in entry 5 (vmappable)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return x.sin()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        out = (grad * x.cos()).clone()
        out[..., 5] += 0.01 * grad[..., 5]
        return out


class Square(torch.autograd.Function):
    """``z * z`` (real or complex), its backward scaled by ``Square.factor``."""

    factor = 1.0

    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        return z * z

    @staticmethod
    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        return g * (2 * z).conj() * Square.factor


class Cube(torch.autograd.Function):
    """``z ** 3`` (real or complex), forwards counted in ``Cube.calls``; its right
    backward, ``g * conj(3 z^2)``, goes through :class:`Square`, so its second derivative
    is as right as ``Square``'s backward."""

    calls = 0

    @staticmethod
    def forward(ctx, z):
        Cube.calls += 1
        ctx.save_for_backward(z)
        return z ** 3

    @staticmethod
    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        return g * (3 * Square.apply(z)).conj()


def assert_gradgradcheck_verdicts(fn, inputs, passes: bool):
    """torch's gradgradcheck and agcheck's reference engine both pass ``fn`` at ``inputs``
    (``passes``), or both raise a Jacobian mismatch."""
    import agcheck

    if passes:
        assert torch.autograd.gradgradcheck(fn, inputs)
        assert agcheck.gradgradcheck(fn, inputs, engine="reference")
    else:
        with pytest.raises(RuntimeError, match="Jacobian mismatch"):
            torch.autograd.gradgradcheck(fn, inputs)
        with pytest.raises(agcheck.GradcheckError, match="Jacobian mismatch"):
            agcheck.gradgradcheck(fn, inputs, engine="reference")


def run_check(fn, inputs, backend="torch", **options):
    """One gradcheck run kept for inspection: its engine log (``run.engine_log``), the
    undecided outcomes it handed back (``run.engine_fallbacks``) and its verdict
    (``run.verdict``: False when it raised a GradcheckError)."""
    import agcheck
    from agcheck.core.run import CheckRun
    from agcheck.gradcheck import all_checks
    from agcheck.options import GradcheckOptions

    run = CheckRun(fn, inputs, agcheck.get_backend(backend), GradcheckOptions(**options))
    try:
        all_checks(run)
        run.verdict = True
    except agcheck.GradcheckError:
        run.verdict = False
    return run


def tensorflow_or_skip():
    """TensorFlow, loaded as agcheck's backend loads it (triton first where triton is
    installed: TensorFlow loaded before it makes torch's later import of triton crash the
    process), or a skip of the calling test or module where it is not installed."""
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("needs tensorflow", allow_module_level=True)
    from agcheck.backends.tensorflow_loading import import_tensorflow

    return import_tensorflow()


def reference_takes(monkeypatch) -> dict:
    """Per input position, the row blocks ``[(start, stop, rows)]`` the reference engine
    takes from the run's rows (computed by the engine as it computes them), at its latest
    comparison from now on."""
    from agcheck.checks import jacobian

    taken, original = {}, jacobian._numerical_jacobians

    def spied(run, piece, moved, p, whole):
        kept = run.rows.of(piece.fn, piece.args, p)
        taken[p] = [] if kept is None else kept.blocks(exact_only=not whole)
        return original(run, piece, moved, p, whole)

    monkeypatch.setattr(jacobian, "_numerical_jacobians", spied)
    return taken
