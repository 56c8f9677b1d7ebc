"""What the autograd graph of a traced evaluation tells about vmapping fn
(agcheck.backends.torch_graph): every Function it flags makes torch.vmap raise, and
every one it lets pass is batched by torch.vmap."""
import pytest
import torch

from agcheck.backends.torch_graph import vmap_obstacle

from .helpers import make


class OldStyle(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos()


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


@pytest.mark.parametrize("function, flagged", [
    (OldStyle, "does not override setup_context"), (NoRule, "no vmap rule"), (TwoRules, "two vmap rules"),
    (GeneratedRule, None), (OwnRule, None),
])
def test_the_graph_flags_exactly_the_functions_vmap_cannot_batch(function, flagged):
    fn = lambda x: torch.tanh(function.apply(x * 2)).sum(0)  # noqa: E731 - the Function deep in the graph
    x = make(3, 4)
    reason = vmap_obstacle((fn(x), 7))
    stacked = torch.stack([x.detach(), x.detach() + 1])
    if flagged is None:
        assert reason is None
        assert torch.equal(torch.vmap(fn)(stacked)[1], fn(stacked[1]).detach())
    else:
        assert function.__name__ in reason and flagged in reason
        with pytest.raises(RuntimeError):
            torch.vmap(fn)(stacked)


def test_outputs_without_a_graph_show_no_obstacle():
    x = make(3).detach()
    assert vmap_obstacle((OldStyle.apply(x), x.sin(), None)) is None

