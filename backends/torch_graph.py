"""What the autograd graph of a traced evaluation tells about batching, before any
batched call is made.

- ``torch.vmap`` of ``fn`` raises on a custom ``torch.autograd.Function`` that functorch
  cannot transform: it needs the Function to override ``setup_context`` and to have one
  vmap rule (its own ``vmap`` staticmethod, or ``generate_vmap_rule = True``). Such a
  Function leaves a node on the graph. (The Function torch.library generates for a custom
  op's autograd is not one: vmap batches the op through the dispatcher.)
"""
from __future__ import annotations

import sys

import torch

__all__ = ["vmap_obstacle", "importing_node", "dynamo_pending"]

#: nodes visited at most: a graph larger than this is not searched to its end
MAX_NODES = 100_000
#: nodes whose batched backward imports torch._dynamo on its first use in a process (about
#: 1 s; of 20 common ops checked in fresh processes, torch 2.13, only sgn's)
_IMPORTING_NODES = frozenset({"SgnBackward0"})


def _nodes(outputs):
    pending = [o.grad_fn for o in outputs if isinstance(o, torch.Tensor) and o.grad_fn is not None]
    seen = set()
    while pending and len(seen) < MAX_NODES:
        node = pending.pop()
        if node in seen:
            continue
        seen.add(node)
        yield node
        pending.extend(child for child, _ in node.next_functions if child is not None)


def vmap_obstacle(outputs) -> str | None:
    """The reason ``torch.vmap`` cannot batch the function that computed ``outputs``, as
    their autograd graph shows it (a custom Function functorch cannot transform), or
    ``None`` when the graph shows none.

    Parameters
    ----------
    outputs : tuple
        Everything the function returned; tensors without a graph are skipped.
    """
    for node in _nodes(outputs):
        reason = _function_obstacle(getattr(node, "_forward_cls", None))
        if reason is not None:
            return reason
    return None


def dynamo_pending() -> bool:
    """Whether this process has yet to import torch._dynamo (about 1 s; it brings sympy)."""
    return "torch._dynamo" not in sys.modules


def importing_node(outputs) -> str | None:
    """The name of a node in ``outputs``' graph whose batched backward first imports
    torch._dynamo, or ``None``."""
    return next((type(node).__name__ for node in _nodes(outputs) if type(node).__name__ in _IMPORTING_NODES), None)


def _function_obstacle(cls) -> str | None:
    if not (isinstance(cls, type) and issubclass(cls, torch.autograd.Function)):
        return None
    if cls.__module__.startswith("torch._library"):
        return None  # the autograd of a torch.library custom op: vmap reaches the op, not this class
    base = torch.autograd.Function
    name = cls.__qualname__
    if cls.setup_context is base.setup_context:
        return f"custom Function {name} does not override setup_context"
    own_rule = cls.vmap is not base.vmap
    if cls.generate_vmap_rule == own_rule:
        return f"custom Function {name} has {'two vmap rules' if own_rule else 'no vmap rule'}"
    return None
