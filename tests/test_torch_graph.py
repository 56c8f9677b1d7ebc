"""What the autograd graph of a traced evaluation tells about batching
(agcheck.backends.torch_graph), checked against torch itself: every Function it flags
makes torch.vmap raise and every one it lets pass is batched by torch.vmap; the graphs
whose batched backward it says imports torch._dynamo do, in a fresh process, and the
others do not."""
import warnings

import pytest
import torch

from agcheck.backends.torch_graph import vmap_obstacle

from .helpers import ScaledSin as OldStyle, make


class _NewStyle(torch.autograd.Function):
    @staticmethod
    def forward(x):
        return x.sin()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos()


class NoRule(_NewStyle):
    pass


class GeneratedRule(_NewStyle):
    generate_vmap_rule = True


class OwnRule(_NewStyle):
    @staticmethod
    def vmap(info, in_dims, x):
        return OwnRule.apply(x), in_dims[0]


class TwoRules(OwnRule):
    generate_vmap_rule = True


@torch.library.custom_op("agcheck_tests::library_sin", mutates_args=())
def _library_sin(x: torch.Tensor) -> torch.Tensor:
    return x.sin()


_library_sin.register_fake(lambda x: torch.empty_like(x))
_library_sin.register_autograd(lambda ctx, g: g * ctx.saved_tensors[0].cos(),
                               setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]))


class LibraryOp:
    """A torch.library custom op with its autograd registered: torch generates an old-style
    Function for it, yet vmap batches the op (through the dispatcher's fallback)."""

    apply = staticmethod(_library_sin)


@pytest.mark.parametrize("function, flagged", [
    (OldStyle, "does not override setup_context"), (NoRule, "no vmap rule"), (TwoRules, "two vmap rules"),
    (GeneratedRule, None), (OwnRule, None), (LibraryOp, None),
])
def test_the_graph_flags_exactly_the_functions_vmap_cannot_batch(function, flagged):
    fn = lambda x: torch.tanh(function.apply(x * 2)).sum(0)  # noqa: E731 - the Function deep in the graph
    x = make(3, 4)
    reason = vmap_obstacle((fn(x), 7))
    stacked = torch.stack([x.detach(), x.detach() + 1])
    if flagged is None:
        assert reason is None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no batching rule for the library op: a loop, with a warning
            batched = torch.vmap(fn)(stacked)
        assert torch.equal(batched[1], fn(stacked[1]).detach())
    else:
        assert function.__name__ in reason and flagged in reason
        with pytest.raises(RuntimeError):
            torch.vmap(fn)(stacked)


def test_outputs_without_a_graph_show_no_obstacle():
    x = make(3).detach()
    assert vmap_obstacle((OldStyle.apply(x), x.sin(), None)) is None


def _fresh_process(code):
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return run.stdout.split()


_SMALL_CHECK_WITH_SGN = """
import sys, torch, agcheck
import torch.fx.experimental.symbolic_shapes  # the other one-time import, already paid
class Scaled(torch.autograd.Function):
    factor = {factor}
    generate_vmap_rule = True
    @staticmethod
    def forward(y):
        return y * 3
    @staticmethod
    def setup_context(ctx, inputs, output):
        pass
    @staticmethod
    def backward(ctx, g):
        return g * 3 * Scaled.factor
w = torch.randn(120, 120, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
fn = lambda x: Scaled.apply(torch.tanh(w @ (x.sgn() * x * x)))
x = torch.randn(120, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
from agcheck.core.run import CheckRun
from agcheck.gradcheck import all_checks
from agcheck.options import GradcheckOptions
run = CheckRun(fn, (x,), agcheck.get_backend("torch"), GradcheckOptions())
try:
    all_checks(run)
    verdict = True
except agcheck.GradcheckError:
    verdict = False
refused = any("SgnBackward0's batched backward would import torch._dynamo" in e.detail for e in run.engine_log)
print(verdict, torch.autograd.gradcheck(fn, (x,), raise_exception=False), "torch._dynamo" in sys.modules, refused)
"""


@pytest.mark.parametrize("factor", [1.0, 1.01])
def test_a_small_check_through_sgn_does_not_import_dynamo_for_its_batched_vjps(factor):
    # 240 VJPs (a dense Jacobian, and the reentrancy pass) of a fraction of a millisecond
    # each: batching them would first import torch._dynamo (about 1 s) through sgn's
    # batched backward; torch's trace refuses batched VJPs of so small an output while
    # the import is pending (torch_trace.IMPORT_FROM_ELEMENTS), and the engine loops them
    verdict, torch_verdict, imported, refused = _fresh_process(_SMALL_CHECK_WITH_SGN.format(factor=factor))
    assert verdict == torch_verdict == str(factor == 1.0)
    assert imported == "False" and refused == "True"


_SMALL_GRADGRADCHECK = """
import sys, torch, agcheck
from agcheck.core.run import CheckRun
from agcheck.gradcheck import all_checks
from agcheck.gradgradcheck import _vjp_problem
from agcheck.options import GradcheckOptions
class Square(torch.autograd.Function):
    generate_vmap_rule = True
    @staticmethod
    def forward(t):
        return t * t
    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
    @staticmethod
    def backward(ctx, g):
        t, = ctx.saved_tensors
        return 2 * g * (t.detach() if {broken} else t)
fn = lambda t: Square.apply(t).sin()
x = torch.randn(30, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
be = agcheck.get_backend("torch")
for loaded in (False, True):
    if loaded:
        import torch._dynamo
    assert ("torch._dynamo" in sys.modules) is loaded
    vjp_fn, args = _vjp_problem(be, fn, (x,), None, False, 0)
    run = CheckRun(vjp_fn, args, be, GradcheckOptions(raise_exception=False))
    try:
        all_checks(run)
        verdict = True
    except agcheck.GradcheckError:
        verdict = False
    via = [e.via or e.decision for e in run.engine_log if e.path == "numerical" and e.subject == 1]
    print(verdict, torch.autograd.gradgradcheck(fn, (x,), raise_exception=False), ",".join(via))
"""


@pytest.mark.parametrize("broken", [False, True])
def test_a_small_vjp_functions_cotangents_are_vmapped_once_dynamo_is_loaded(broken):
    # 30 cotangent elements, below VMAPPED_COTANGENTS_FROM_ELEMENTS: looped while vmapping
    # them would first import torch._dynamo, vmapped once the process has imported it
    out = _fresh_process(_SMALL_GRADGRADCHECK.format(broken=broken))
    before, after = out[:3], out[3:]
    for verdict, torch_verdict, _ in (before, after):
        assert verdict == torch_verdict == str(not broken)
    assert before[2] == "looped" and after[2] == "vmap"
