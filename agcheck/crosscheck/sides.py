"""One backend's side of a crosscheck: its port of ``fn``, its copies of the inputs, and the
values and derivatives it computes, as NumPy arrays with labelled axes (through the
backend's verbs only: ``from_numpy``, ``precision``, ``prepare``, ``trace().vjp``, ``jvp``,
``vjp_of_vjp``, ``to_numpy``)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from agcheck.backends.base import Backend
from agcheck.crosscheck.labelled import LabelledArray

__all__ = ["BackendPort", "CROSSCHECK_SEED", "labelled_value", "value_arrays", "reverse_derivatives",
           "forward_derivatives", "second_derivatives", "second_order_unsupported", "draw_probes"]

#: seed of the private generator that draws fast mode's random cotangents and tangents
CROSSCHECK_SEED = 20240605


class BackendPort:
    """One backend: its port of ``fn``, its copies of the inputs, and what it computed."""

    def __init__(self, name: str, be: Backend, port: Callable, np_inputs: tuple, checked: list, double: bool):
        self.name, self.be, self.port = name, be, port
        self.np_inputs, self.checked, self.double = np_inputs, checked, double

    def context(self):
        """The framework's precision for this crosscheck (JAX: 64-bit mode for 64-bit data)."""
        return self.be.precision(self.double)

    def arguments(self, np_inputs: tuple, checked=()) -> tuple:
        """``np_inputs`` as this backend's arrays (pass-through values as they are)."""
        return tuple(self.be.from_numpy(a, checked=k in checked) if isinstance(a, np.ndarray) else a
                     for k, a in enumerate(np_inputs))

    def fresh_args(self) -> tuple:
        """New copies of the inputs, the checked ones marked for differentiation."""
        return self.arguments(self.np_inputs, self.checked)

    def to_backend(self, values: np.ndarray, like):
        """``values`` (NumPy) as an array of this backend, with ``like``'s dtype."""
        return self.be.from_numpy(values, like=like if self.be.is_array(like) else None)

    def setup(self):
        """Evaluate the port once, ready for reverse mode."""
        self.fn, self.args = self.be.prepare(self.port, self.fresh_args())
        if len(self.args) != len(self.np_inputs):
            raise ValueError(f"the {self.name!r} backend rearranged the inputs; pass flat arrays to crosscheck")
        self.trace = self.be.trace(self.fn, self.args, self.checked)
        self.outputs = tuple(self.trace.outputs)

    def output_numpy(self, o):
        return np.asarray(self.be.to_numpy(o)) if self.be.is_array(o) else o

    def inexact_outputs(self) -> list:
        return [k for k, o in enumerate(self.outputs) if self.be.is_array(o) and self.be.is_floating_or_complex(o)]

    def can(self, capability: str) -> bool:
        caps = getattr(self.be, "capabilities", frozenset())
        return not caps or capability in caps

    def checked_inputs(self) -> list:
        return [self.args[p] for p in self.checked]

    def values_at(self, np_inputs: tuple) -> tuple:
        """The port's outputs at other inputs (NumPy arrays; other values as they are)."""
        return tuple(self.output_numpy(o) for o in self.be.as_tuple(self.port(*self.arguments(np_inputs))))

    def gradient_at(self, np_inputs: tuple, k: int, r: int, j: int) -> np.ndarray:
        """d(output ``k`` element ``r``)/d(checked input ``j``) at other inputs (flat NumPy, torch's convention)."""
        fn, args = self.be.prepare(self.port, self.arguments(np_inputs, self.checked))
        trace = self.be.trace(fn, args, self.checked)
        g = trace.vjp([k], [self.be.one_hot(trace.outputs[k], r)])[j]
        return np.zeros(_size(args[self.checked[j]].shape)) if g is None else self.flat_numpy(g)

    def flat_numpy(self, x) -> np.ndarray:
        """A (possibly sparse) array of this backend as a flat NumPy array."""
        be = self.be
        return np.asarray(be.to_numpy(be.to_dense(x) if hasattr(be, "to_dense") else x)).reshape(-1)


def labelled_value(v, k: int) -> LabelledArray:
    """Output ``k``'s value ``v`` (a non-array one as a one-entry object array)."""
    data = v if isinstance(v, np.ndarray) else np.array([v], dtype=object)
    return LabelledArray(data, [(f"output {k} element ", tuple(np.shape(v)))])


def value_arrays(side: BackendPort) -> dict:
    """The outputs, keyed by ``(output,)``."""
    return {(k,): labelled_value(side.output_numpy(o), k) for k, o in enumerate(side.outputs)}


def _size(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _grads_numpy(side: BackendPort, grads, checked_args) -> list:
    """Flat NumPy gradients, zeros of the input's dtype for a ``None`` one."""
    return [np.zeros(_size(x.shape), dtype=np.asarray(side.be.to_numpy(x)).dtype) if g is None
            else side.flat_numpy(g) for g, x in zip(grads, checked_args)]


def _pullback(side: BackendPort, k: int):
    """``cotangent -> [flat NumPy gradient per checked input]`` for output ``k``."""
    inputs = side.checked_inputs()
    in_shapes = [tuple(int(s) for s in x.shape) for x in inputs]
    differentiable = side.be.is_differentiable_output(side.outputs[k])

    def pull(cot):
        grads = side.trace.vjp([k], [cot]) if differentiable else [None] * len(inputs)
        return _grads_numpy(side, grads, inputs)

    return pull, in_shapes


def _reverse_fast(side: BackendPort, k: int, probe, blocks: dict) -> None:
    # a real and an imaginary cotangent for a complex output: a convention mix-up shows as a conjugate
    o = side.outputs[k]
    pull, in_shapes = _pullback(side, k)
    complex_out = np.iscomplexobj(side.output_numpy(o))
    cots = [probe[0], 1j * probe[1]] if complex_out else [probe]
    per_part = [pull(side.to_backend(c, o)) for c in cots]
    for j, shape in enumerate(in_shapes):
        axes = [(f"input {j} element ", shape)]
        if complex_out:
            axes.insert(0, ("cotangent", ["v (real random cotangent)", "1j*w (imaginary random cotangent)"]))
            data = np.stack([g[j] for g in per_part], 0)
        else:
            data = per_part[0][j]
        blocks[(k, j)] = LabelledArray(data, axes)


def _reverse_full(side: BackendPort, k: int, blocks: dict) -> None:
    """Full Jacobians from one-hot cotangents (``1j``-valued ones too for a complex output)."""
    o = side.outputs[k]
    out_np = side.output_numpy(o)
    pull, in_shapes = _pullback(side, k)
    complex_out = np.iscomplexobj(out_np)
    rows = [[[] for _ in range(2 if complex_out else 1)] for _ in in_shapes]
    for r in range(out_np.size):
        e = side.be.one_hot(o, r)
        for part, cot in enumerate([e, e * 1j] if complex_out else [e]):
            for j, g in enumerate(pull(cot)):
                rows[j][part].append(g)
    for j, shape in enumerate(in_shapes):
        data = np.stack([np.stack(r, 0) if r else np.zeros((0, _size(shape))) for r in rows[j]], 0)
        axes = [(f"output {k} element ", tuple(out_np.shape)), (f"input {j} element ", shape)]
        if complex_out:
            axes.insert(0, ("cotangent", ["e (real one-hot cotangent)", "1j*e (imaginary one-hot cotangent)"]))
        else:
            data = data[0]
        blocks[(k, j)] = LabelledArray(data, axes)


def reverse_derivatives(side: BackendPort, fast: bool, probes: dict) -> dict:
    """Reverse-mode derivatives keyed by ``(output, input)``, in torch's convention."""
    blocks = {}
    for k in side.inexact_outputs():
        if fast:
            _reverse_fast(side, k, probes[("reverse", k)], blocks)
        else:
            _reverse_full(side, k, blocks)
    return blocks


def _pushforward(side: BackendPort):
    """``(j, tangent) -> {output: flat NumPy tangent}`` for the checked input ``j``."""
    be = side.be
    zeros = [be.xp(x).zeros_like(x) for x in side.checked_inputs()]
    floats = side.inexact_outputs()

    def push(j, t):
        tangents = list(zeros)
        tangents[j] = t
        results = be.jvp(side.fn, side.args, side.checked, tangents)
        out = {}
        for k, (primal, tangent) in zip(floats, results):
            p_np = side.output_numpy(primal)
            out[k] = (np.zeros(p_np.size, dtype=p_np.dtype) if tangent is None
                      else np.asarray(be.to_numpy(tangent)).reshape(-1))
        return out

    return push


def _forward_full(side: BackendPort, j: int, push, blocks: dict) -> None:
    """Full Jacobians from one-hot tangents (``1j``-valued ones too for a complex input)."""
    x = side.checked_inputs()[j]
    x_np = np.asarray(side.be.to_numpy(x))
    floats = side.inexact_outputs()
    complex_in = np.iscomplexobj(x_np)
    per_output: dict = {k: [[] for _ in range(2 if complex_in else 1)] for k in floats}
    for i in range(x_np.size):
        e = side.be.one_hot(x, i)
        for part, t in enumerate([e, e * 1j] if complex_in else [e]):
            for k, v in push(j, t).items():
                per_output[k][part].append(v)
    for k in floats:
        out_shape = tuple(side.output_numpy(side.outputs[k]).shape)
        data = np.stack([np.stack(r, 0) if r else np.zeros((0, _size(out_shape))) for r in per_output[k]], 0)
        axes = [(f"input {j} element ", tuple(x_np.shape)), (f"output {k} element ", out_shape)]
        if complex_in:
            axes.insert(0, ("tangent", ["e (real one-hot tangent)", "1j*e (imaginary one-hot tangent)"]))
        else:
            data = data[0]
        blocks[(k, j)] = LabelledArray(data, axes)


def forward_derivatives(side: BackendPort, fast: bool, probes: dict) -> dict:
    """Forward-mode derivatives keyed by ``(output, input)``."""
    push = _pushforward(side)
    blocks = {}
    for j, x in enumerate(side.checked_inputs()):
        if not fast:
            _forward_full(side, j, push, blocks)
            continue
        for k, v in push(j, side.to_backend(probes[("forward", j)], x)).items():
            shape = tuple(side.output_numpy(side.outputs[k]).shape)
            blocks[(k, j)] = LabelledArray(v, [(f"output {k} element ", shape)])
    return blocks


def second_order_unsupported(side: BackendPort) -> str | None:
    """Why second derivatives cannot be compared on ``side`` (``None``: they can)."""
    if type(side.be).vjp_of_vjp is not Backend.vjp_of_vjp:
        return None
    if side.name == "numpy":
        return ("the numpy backend has only the first-order vjp/jvp you supply; second "
                "derivatives need a framework with autodiff")
    return f"crosscheck has no second-order support for the {side.name!r} backend"


def _one_hots(like: np.ndarray) -> list:
    """One-hot arrays shaped like ``like`` (each followed by its ``1j`` multiple if complex)."""
    ones = []
    for i in range(like.size):
        e = np.zeros(like.size, dtype=like.dtype)
        e[i] = 1
        ones.append(e.reshape(like.shape))
        if np.iscomplexobj(like):
            ones.append(ones[-1] * 1j)
    return ones


def _output_cotangents(side: BackendPort, fast: bool, probes: dict) -> dict:
    """For each inexact output: the cotangents ``w`` (NumPy) of the first derivative."""
    return {k: [probes[("second-w", k)]] if fast else _one_hots(side.output_numpy(side.outputs[k]))
            for k in side.inexact_outputs()}


def _second_axes(k: int, out_np: np.ndarray, j1: int, x1: np.ndarray, x2: np.ndarray, j2: int) -> list:
    """The axes of a full second-derivative block: output entries, gradient entries, input."""
    def entries(a: np.ndarray) -> list:  # "" for a scalar: LabelledArray.describe says so
        at = [str([int(v) for v in np.unravel_index(i, a.shape)]) if a.shape else "" for i in range(a.size)]
        return [e for s in at for e in ([s, (s + " (1j)").strip()] if np.iscomplexobj(a) else [s])]

    out_axis, g_axis = entries(out_np), entries(x1)
    return [(f"output {k} element", out_axis), (f"gradient of input {j1} element", g_axis),
            (f"input {j2} element ", tuple(x2.shape))]


def second_derivatives(side: BackendPort, fast: bool, probes: dict) -> dict:
    """Second derivatives keyed by ``(output, input, input)``: ``d/dx_j2 <c, d<w, f_k>/dx_j1>``
    for one-hot (fast mode: random) ``w`` and ``c``, in torch's convention."""
    inputs_np = [np.asarray(side.np_inputs[p]) for p in side.checked]
    g_cots = [[probes.get(("second-c", j))] if fast else _one_hots(x) for j, x in enumerate(inputs_np)]
    blocks = {}
    for k, ws in _output_cotangents(side, fast, probes).items():
        out_np = side.output_numpy(side.outputs[k])
        per_w = [side.be.vjp_of_vjp(side.port, side.fresh_args(), side.checked, k, w, g_cots) for w in ws]
        for j1, x1 in enumerate(inputs_np):
            for j2, x2 in enumerate(inputs_np):
                data = np.stack([pw[(j1, j2)] for pw in per_w], 0)
                if fast:
                    blocks[(k, j1, j2)] = LabelledArray(data.reshape(-1), [(f"input {j2} element ", tuple(x2.shape))])
                else:
                    blocks[(k, j1, j2)] = LabelledArray(data, _second_axes(k, out_np, j1, x1, x2, j2))
    return blocks


def draw_probes(side: BackendPort, np_inputs, checked) -> dict:
    """Fast mode's random cotangents and tangents, drawn once (NumPy) for every backend."""
    gen = np.random.Generator(np.random.PCG64(CROSSCHECK_SEED))
    probes = {}

    def draw(like_np):
        shape = like_np.shape
        if np.iscomplexobj(like_np):
            return (gen.standard_normal(shape) + 1j * gen.standard_normal(shape)).astype(like_np.dtype)
        return gen.standard_normal(shape).astype(like_np.dtype)

    for k in side.inexact_outputs():
        o_np = side.output_numpy(side.outputs[k])
        if np.iscomplexobj(o_np):
            real = np.real(o_np)
            probes[("reverse", k)] = (draw(real), draw(real))
        else:
            probes[("reverse", k)] = draw(o_np)
        probes[("second-w", k)] = draw(o_np)
    for j, p in enumerate(checked):
        probes[("forward", j)] = draw(np.asarray(np_inputs[p]))
        probes[("second-c", j)] = draw(np.asarray(np_inputs[p]))
    return probes
