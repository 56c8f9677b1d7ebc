"""``agcheck.crosscheck``: the same function (or hand-written ports of it) across frameworks.

A library that supports several array frameworks — written once against the array API,
or ported by hand — wants proof that every port computes the same values *and
differentiates the same way*. :func:`crosscheck` evaluates the function on each backend
(inputs given once, as NumPy arrays) and compares, pair by pair against the first
backend:

* the forward values;
* reverse-mode derivatives: full Jacobians from one-hot cotangents (``i``-valued ones
  too for complex outputs), or VJPs of random cotangents in fast mode — all in torch's
  complex convention (each backend maps its own into it);
* forward-mode derivatives: full Jacobians from one-hot tangents, or JVPs of random
  tangents in fast mode;
* with ``order=2``, second derivatives through each framework's own autodiff.

Everything goes through the generic :class:`~agcheck.backend.Backend` interface
(``prepare``, ``trace().vjp``, ``jvp``, ``to_numpy``); the few framework-specific steps
(converting NumPy inputs, second derivatives, JAX's 64-bit switch) import the framework
lazily, so importing this module imports neither torch nor jax.
"""
from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from agcheck.backends.base import Backend, BackendUnavailableError

from agcheck.backends.registry import get_backend
from agcheck.gradcheck import gradcheck as _gradcheck
from agcheck.gradgradcheck import gradgradcheck as _gradgradcheck
from agcheck.report.errors import GradcheckError

__all__ = ["crosscheck", "CrosscheckResult", "Difference", "DEFAULT_TOLERANCES"]

#: (rtol, atol) by the precision of the inputs
DEFAULT_TOLERANCES = {"float64": (1e-7, 1e-10), "float32": (1e-4, 1e-6)}
#: seed of the private generator that draws fast mode's random cotangents and tangents
CROSSCHECK_SEED = 20240605
QUANTITIES = ("value", "reverse", "forward", "second")
_DESCRIPTION = {
    "value": "value",
    "reverse": "reverse-mode derivative",
    "forward": "forward-mode derivative",
    "second": "second derivative",
}
CONVENTION_NOTE = (
    "JAX's reverse-mode convention is the conjugate of torch's "
    "(torch_vjp(v) == conj(jax_vjp(conj(v)))): one port probably applies a VJP written "
    "in the other framework's convention."
)


# -- result ---------------------------------------------------------------------------------


@dataclass
class Difference:
    """One row of the comparison table: one quantity of one output (and input) on two backends."""

    quantity: str
    reference: str
    other: str
    output: int
    input: int | None = None
    input2: int | None = None
    max_abs: float = 0.0
    where: str = ""
    reference_value: Any = None
    other_value: Any = None
    n_bad: int = 0
    n_total: int = 0
    ok: bool = True
    conjugate: bool = False
    note: str = ""
    #: index of the largest difference along each axis of the compared block
    position: dict = field(default_factory=dict, repr=False)
    #: when the disagreement sits on a non-differentiable point: the one-sided slopes there
    kink: str = ""

    @property
    def label(self) -> str:
        text = f"output {self.output}"
        if self.input is not None:
            text += f" / input {self.input}"
        if self.input2 is not None:
            text += f", input {self.input2}"
        return text


class CrosscheckResult:
    """What :func:`crosscheck` compared, and how close each pair came.

    Truthy when every comparison agreed. Attributes:

    backends : tuple of str
        The backends compared (the first is the reference).
    skipped : dict
        Backends left out, with the reason.
    notes : list of str
        Quantities that could not be compared, and why.
    values, reverse, forward, second : dict
        Per backend: the outputs (NumPy), and the derivative blocks (NumPy arrays keyed
        by ``(output, input)`` or ``(output, input, input)``).
    differences : list of Difference
        The table of comparisons.
    gradchecks : dict
        With ``gradcheck=True``: per backend ``"passed"``, ``"FAILED: ..."`` or ``"skipped: ..."``.
    rtol, atol : float
        The tolerances used.
    """

    def __init__(self, backends, skipped, rtol, atol, fast_mode, order, name="fn"):
        self.backends = tuple(backends)
        self.skipped = dict(skipped)
        self.rtol, self.atol = rtol, atol
        self.fast_mode, self.order = fast_mode, order
        self.function_name = name
        self.notes: list[str] = []
        self.values: dict = {}
        self.reverse: dict = {}
        self.forward: dict = {}
        self.second: dict = {}
        self.differences: list[Difference] = []
        self.gradchecks: dict = {}

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.differences) and not self.failed_gradchecks()

    def __bool__(self) -> bool:
        return self.ok

    def disagreements(self) -> list:
        return [d for d in self.differences if not d.ok]

    def failed_gradchecks(self) -> list:
        return [n for n, s in self.gradchecks.items() if s.startswith("FAILED")]

    def summary(self) -> str:
        mode = "fast mode" if self.fast_mode else "full Jacobians"
        lines = [
            f"crosscheck of {self.function_name} on {', '.join(self.backends)} "
            f"(reference {self.backends[0]}; {mode}; order {self.order}; rtol={self.rtol:g}, atol={self.atol:g})"
        ]
        for name, reason in self.skipped.items():
            lines.append(f"  skipped {name}: {reason}")
        header = f"  {'quantity':<8} {'where':<28} {'pair':<16} {'max |diff|':>11}  verdict"
        lines.append(header)
        for d in self.differences:
            pair = f"{d.reference} vs {d.other}"
            verdict = "ok" if d.ok else f"DIFFER ({d.n_bad}/{d.n_total} entries) at {d.where}"
            if d.note and not d.ok:
                verdict += f" [{d.note}]"
            lines.append(f"  {d.quantity:<8} {d.label:<28} {pair:<16} {d.max_abs:>11.3e}  {verdict}")
        for note in self.notes:
            lines.append(f"  note: {note}")
        for name, status in self.gradchecks.items():
            lines.append(f"  gradcheck on {name}: {status}")
        lines.append("  => " + ("all backends agree" if self.ok else "DISAGREEMENT"))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        return (f"<CrosscheckResult {'ok' if self.ok else 'FAILED'}: {len(self.differences)} comparisons "
                f"over {', '.join(self.backends)}>")


# -- blocks: arrays with described axes ----------------------------------------------------


class _Block:
    """A NumPy array of derivative (or value) entries with a description of each axis.

    ``axes`` is a list of ``(label, shape_or_names)``: a tuple is an array shape (the axis
    runs over its flattened elements), a list names the entries of the axis.
    """

    def __init__(self, data: np.ndarray, axes: list):
        self.data = np.asarray(data)
        self.axes = axes

    def indices(self, flat: int) -> dict:
        """``{axis label: index along that axis}`` of the flat entry ``flat``."""
        sizes = [len(s) if isinstance(s, list) else int(np.prod(s, dtype=np.int64)) for _, s in self.axes]
        if not sizes:
            return {}
        return {label: int(i) for (label, _), i in zip(self.axes, np.unravel_index(flat, sizes))}

    def describe(self, flat: int) -> str:
        sizes = [len(s) if isinstance(s, list) else int(np.prod(s, dtype=np.int64)) for _, s in self.axes]
        if not sizes:
            return "the scalar"
        idx = np.unravel_index(flat, sizes)
        parts = []
        for (label, spec), i in zip(self.axes, idx):
            if isinstance(spec, list):
                parts.append(f"{label} {spec[int(i)]}")
            elif not spec:
                parts.append(label.replace(" element ", "").strip() + " (a scalar)")
            else:
                where = tuple(int(v) for v in np.unravel_index(int(i), spec))
                parts.append(f"{label}{list(where)}")
        return ", ".join(parts)


def _scalar(v):
    v = v.item() if isinstance(v, np.generic) else v
    return v


# -- the per-backend side -------------------------------------------------------------------


class _Side:
    """One backend: its port of ``fn``, its copies of the inputs, and what it computed."""

    def __init__(self, name: str, be: Backend, port: Callable, np_inputs: tuple, checked: list, use_x64: bool):
        self.name, self.be, self.port = name, be, port
        self.np_inputs, self.checked, self.use_x64 = np_inputs, checked, use_x64

    def context(self):
        return _framework_context(self.name, self.use_x64)

    def fresh_args(self) -> tuple:
        return tuple(
            _from_numpy(self, a, k in self.checked) if isinstance(a, np.ndarray) else a
            for k, a in enumerate(self.np_inputs)
        )

    def setup(self):
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


def _backend_array(side: _Side, arr: np.ndarray, like):
    """``arr`` (NumPy) as an array of ``side``'s framework, with ``like``'s dtype."""
    dtype = np.asarray(side.be.to_numpy(like)).dtype if side.be.is_array(like) else arr.dtype
    return _from_numpy(side, np.asarray(arr, dtype=dtype), False)


def _from_numpy(side: _Side, x: np.ndarray, checked: bool):
    be, name = side.be, side.name
    if name == "torch":
        import torch

        t = torch.from_numpy(np.array(x, copy=True))
        return t.requires_grad_(True) if checked else t
    if name == "jax":
        import jax.numpy as jnp

        return jnp.asarray(x)
    if hasattr(be, "from_numpy"):  # the numpy backend, and any backend that says how
        return be.from_numpy(x, checked=checked)
    raise TypeError(
        f"crosscheck does not know how to make {name!r} arrays from NumPy arrays; give the "
        "backend a from_numpy(x, checked=False) method"
    )


def _framework_context(name: str, use_x64: bool):
    """JAX computes in 32 bits unless told otherwise: 64-bit inputs switch x64 on for the
    duration of the JAX side (restored afterwards)."""
    if name == "jax" and use_x64:
        import jax

        switch = getattr(jax, "enable_x64", None)  # a context manager in recent JAX
        if switch is not None:
            return switch(True)
        from jax.experimental import enable_x64  # older JAX

        return enable_x64()
    return contextlib.nullcontext()


# -- the quantities ------------------------------------------------------------------------


def _grads_numpy(side: _Side, grads, checked_args) -> list:
    be = side.be
    result = []
    for g, x in zip(grads, checked_args):
        if g is None:
            result.append(np.zeros(int(np.prod(x.shape, dtype=np.int64)), dtype=np.asarray(be.to_numpy(x)).dtype))
        else:
            result.append(np.asarray(be.to_numpy(be.to_dense(g) if hasattr(be, "to_dense") else g)).reshape(-1))
    return result


def _reverse(side: _Side, fast: bool, probes: dict) -> dict:
    be, trace = side.be, side.trace
    inputs = [side.args[p] for p in side.checked]
    blocks = {}
    for k in side.inexact_outputs():
        o = side.outputs[k]
        out_np = side.output_numpy(o)
        n_out = out_np.size
        in_shapes = [tuple(int(s) for s in x.shape) for x in inputs]
        differentiable = be.is_differentiable_output(o)
        complex_out = np.iscomplexobj(out_np)

        def pull(cot):
            if not differentiable:
                return [np.zeros(int(np.prod(s, dtype=np.int64)), dtype=np.asarray(be.to_numpy(x)).dtype)
                        for s, x in zip(in_shapes, inputs)]
            return _grads_numpy(side, trace.vjp([k], [cot]), inputs)

        if fast:
            # a complex output gets a real and an imaginary random cotangent, so that a
            # convention mix-up shows as a conjugate (see _convention_mixup)
            v = probes[("reverse", k)]
            cots = [v[0], 1j * v[1]] if complex_out else [v]
            per_part = [pull(_backend_array(side, c, o)) for c in cots]
            for j in range(len(inputs)):
                axes = [(f"input {j} element ", in_shapes[j])]
                if complex_out:
                    axes.insert(0, ("cotangent", ["v (real random cotangent)", "1j*w (imaginary random cotangent)"]))
                    data = np.stack([g[j] for g in per_part], 0)
                else:
                    data = per_part[0][j]
                blocks[(k, j)] = _Block(data, axes)
            continue
        parts = ["e (real one-hot cotangent)", "1j*e (imaginary one-hot cotangent)"] if complex_out else None
        rows = [[[] for _ in range(2 if complex_out else 1)] for _ in inputs]
        for r in range(n_out):
            e = be.one_hot(o, r)
            cots = [e, e * 1j] if complex_out else [e]
            for part, cot in enumerate(cots):
                for j, g in enumerate(pull(cot)):
                    rows[j][part].append(g)
        for j in range(len(inputs)):
            n_in = int(np.prod(in_shapes[j], dtype=np.int64))
            data = np.stack([np.stack(r, 0) if r else np.zeros((0, n_in)) for r in rows[j]], 0)
            axes = [(f"output {k} element ", tuple(out_np.shape)), (f"input {j} element ", in_shapes[j])]
            if parts:
                axes.insert(0, ("cotangent", parts))
            else:
                data = data[0]
            blocks[(k, j)] = _Block(data, axes)
    return blocks


def _forward(side: _Side, fast: bool, probes: dict) -> dict:
    be = side.be
    inputs = [side.args[p] for p in side.checked]
    floats = side.inexact_outputs()
    zeros = [be.zeros_like(x) for x in inputs]
    blocks = {}

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

    for j, x in enumerate(inputs):
        x_np = np.asarray(be.to_numpy(x))
        in_shape = tuple(x_np.shape)
        if fast:
            t = _backend_array(side, probes[("forward", j)], x)
            for k, v in push(j, t).items():
                blocks[(k, j)] = _Block(v, [(f"output {k} element ", tuple(side.output_numpy(side.outputs[k]).shape))])
            continue
        complex_in = np.iscomplexobj(x_np)
        per_output: dict = {k: [[] for _ in range(2 if complex_in else 1)] for k in floats}
        for i in range(x_np.size):
            e = be.one_hot(x, i)
            for part, t in enumerate([e, e * 1j] if complex_in else [e]):
                for k, v in push(j, t).items():
                    per_output[k][part].append(v)
        for k in floats:
            out_shape = tuple(side.output_numpy(side.outputs[k]).shape)
            n_out = int(np.prod(out_shape, dtype=np.int64))
            data = np.stack([np.stack(r, 0) if r else np.zeros((0, n_out)) for r in per_output[k]], 0)
            axes = [(f"input {j} element ", in_shape), (f"output {k} element ", out_shape)]
            if complex_in:
                axes.insert(0, ("tangent", ["e (real one-hot tangent)", "1j*e (imaginary one-hot tangent)"]))
            else:
                data = data[0]
            blocks[(k, j)] = _Block(data, axes)
    return blocks


# -- second derivatives, through each framework's own autodiff --------------------------------


def _second_plan(side: _Side, fast: bool, probes: dict):
    """For each inexact output ``k``: the list of output cotangents ``w`` (NumPy) and how
    to describe them; then for each gradient component the list of its cotangents."""
    plan = {}
    for k in side.inexact_outputs():
        out_np = side.output_numpy(side.outputs[k])
        if fast:
            plan[k] = ([probes[("second-w", k)]], None)
            continue
        ws, labels = [], []
        for r in range(out_np.size):
            e = np.zeros(out_np.size, dtype=out_np.dtype)
            e[r] = 1
            ws.append(e.reshape(out_np.shape))
            labels.append(r)
            if np.iscomplexobj(out_np):
                ws.append(ws[-1] * 1j)
                labels.append(r)
        plan[k] = (ws, labels)
    return plan


def _g_cotangents(x_np: np.ndarray, fast: bool, probe):
    if fast:
        return [probe]
    cots = []
    for i in range(x_np.size):
        e = np.zeros(x_np.size, dtype=x_np.dtype)
        e[i] = 1
        cots.append(e.reshape(x_np.shape))
        if np.iscomplexobj(x_np):
            cots.append(cots[-1] * 1j)
    return cots


def _second_torch(side: _Side, k: int, w: np.ndarray, g_cots: list) -> dict:
    """``d/dx_j2 <c, d<w, f_k>/dx_j1>`` with torch: double backward (torch's convention)."""
    import torch

    args = side.fresh_args()
    inputs = [args[p] for p in side.checked]
    out = side.be.as_tuple(side.port(*args))[k]
    result = {}
    if not (isinstance(out, torch.Tensor) and out.requires_grad):
        for j1, x1 in enumerate(inputs):
            for j2, x2 in enumerate(inputs):
                result[(j1, j2)] = np.zeros((len(g_cots[j1]), x2.numel()), dtype=x2.detach().numpy().dtype)
        return result
    w_t = torch.from_numpy(np.asarray(w, dtype=out.detach().numpy().dtype).copy())
    grads = torch.autograd.grad(out, inputs, w_t, create_graph=True, allow_unused=True)
    for j1, g in enumerate(grads):
        for j2, x2 in enumerate(inputs):
            rows = []
            for c in g_cots[j1]:
                if g is None or not g.requires_grad:
                    rows.append(np.zeros(x2.numel(), dtype=x2.detach().numpy().dtype))
                    continue
                c_t = torch.from_numpy(np.asarray(c, dtype=g.detach().numpy().dtype).copy())
                (h,) = torch.autograd.grad(g, [x2], c_t, retain_graph=True, allow_unused=True)
                rows.append(np.zeros(x2.numel(), dtype=x2.detach().numpy().dtype) if h is None
                            else h.detach().resolve_conj().numpy().reshape(-1))
            result[(j1, j2)] = np.stack(rows, 0)
    return result


def _second_jax(side: _Side, k: int, w: np.ndarray, g_cots: list) -> dict:
    """The same with JAX, mapped into torch's convention at both levels:
    ``torch_vjp(v) == conj(jax_vjp(conj(v)))``."""
    import jax
    import jax.numpy as jnp

    args = side.fresh_args()
    checked = side.checked
    primals = [args[p] for p in checked]

    def f_k(*xs):
        full = list(args)
        for p, x in zip(checked, xs):
            full[p] = x
        return side.be.as_tuple(side.port(*full))[k]

    out = f_k(*primals)
    w_j = jnp.asarray(np.asarray(w, dtype=np.asarray(out).dtype))

    def grad_torch(*xs):
        _, pull = jax.vjp(f_k, *xs)
        return tuple(jnp.conj(g) for g in pull(jnp.conj(w_j)))

    result = {}
    for j1 in range(len(primals)):
        _, pull2 = jax.vjp(lambda *xs, j1=j1: grad_torch(*xs)[j1], *primals)
        g_dtype = np.asarray(primals[j1]).dtype
        rows = {j2: [] for j2 in range(len(primals))}
        for c in g_cots[j1]:
            hs = pull2(jnp.conj(jnp.asarray(np.asarray(c, dtype=g_dtype))))
            for j2, h in enumerate(hs):
                rows[j2].append(np.asarray(jnp.conj(h)).reshape(-1))
        for j2 in rows:
            result[(j1, j2)] = np.stack(rows[j2], 0)
    return result


_SECOND_ORDER = {"torch": _second_torch, "jax": _second_jax}


def _second(side: _Side, fast: bool, probes: dict) -> dict:
    compute = getattr(side.be, "crosscheck_second_order", None) or _SECOND_ORDER[side.name]
    inputs_np = [np.asarray(side.np_inputs[p]) for p in side.checked]
    g_cots = [_g_cotangents(x, fast, probes.get(("second-c", j))) for j, x in enumerate(inputs_np)]
    blocks = {}
    for k, (ws, labels) in _second_plan(side, fast, probes).items():
        out_np = side.output_numpy(side.outputs[k])
        per_w = [compute(side, k, w, g_cots) for w in ws]
        for j1, x1 in enumerate(inputs_np):
            for j2, x2 in enumerate(inputs_np):
                data = np.stack([pw[(j1, j2)] for pw in per_w], 0)
                if fast:
                    axes = [(f"input {j2} element ", tuple(x2.shape))]
                    data = data.reshape(-1)
                else:
                    out_axis = [f"{[int(v) for v in np.unravel_index(r, out_np.shape)] if out_np.shape else []}"
                                + (" (1j)" if np.iscomplexobj(out_np) and n % 2 else "")
                                for n, r in enumerate(labels)]
                    g_axis = []
                    for i in range(x1.size):
                        at = [int(v) for v in np.unravel_index(i, x1.shape)] if x1.shape else []
                        g_axis.append(f"{at}")
                        if np.iscomplexobj(x1):
                            g_axis.append(f"{at} (1j)")
                    axes = [(f"output {k} element", out_axis), (f"gradient of input {j1} element", g_axis),
                            (f"input {j2} element ", tuple(x2.shape))]
                blocks[(k, j1, j2)] = _Block(data, axes)
    return blocks


def _supports_second(side: _Side) -> str | None:
    if hasattr(side.be, "crosscheck_second_order") or side.name in _SECOND_ORDER:
        return None
    if side.name == "numpy":
        return ("the numpy backend has only the first-order vjp/jvp you supply; second "
                "derivatives need a framework with autodiff")
    return f"crosscheck has no second-order support for the {side.name!r} backend"


# -- comparison ------------------------------------------------------------------------------


def _compare(quantity, ref: str, other: str, key: tuple, a: _Block, b: _Block, rtol, atol, exact=False) -> Difference:
    output = key[0]
    inp = key[1] if len(key) > 1 else None
    inp2 = key[2] if len(key) > 2 else None
    d = Difference(quantity, ref, other, output, inp, inp2)
    x, y = a.data, b.data
    if x.shape != y.shape:
        d.ok, d.where = False, f"shapes {x.shape} ({ref}) and {y.shape} ({other})"
        d.max_abs = float("inf")
        d.note = "different shapes"
        return d
    d.n_total = int(x.size)
    if x.size == 0:
        return d
    if x.dtype == object or y.dtype == object:
        bad = ~np.array([u == v for u, v in zip(x.reshape(-1), y.reshape(-1))])
        d.n_bad = int(bad.sum())
        d.ok = d.n_bad == 0
        return d
    xf, yf = x.reshape(-1), y.reshape(-1)
    both_nan = np.isnan(xf) & np.isnan(yf) if np.issubdtype(np.result_type(xf, yf), np.inexact) else np.zeros(xf.shape, bool)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(xf.astype(np.result_type(xf, yf, np.float64)) - yf)
        equal = (xf == yf) | both_nan
        tol = 0.0 if exact else atol + rtol * np.abs(xf)
        bad = ~(equal | (diff <= tol))
        score = np.where(equal, 0.0, np.where(np.isnan(diff), np.inf, diff))
    worst = int(np.argmax(score))
    d.max_abs = float(diff[worst]) if np.isnan(diff[worst]) else float(score[worst])
    d.n_bad = int(bad.sum())
    d.ok = d.n_bad == 0
    d.where = a.describe(worst)
    d.position = a.indices(worst)
    d.reference_value, d.other_value = _scalar(xf[worst]), _scalar(yf[worst])
    if not d.ok:
        if (np.iscomplexobj(xf) or np.iscomplexobj(yf)) and _close(xf, np.conj(yf), rtol, atol):
            d.conjugate = True
            d.note = f"{other}'s result is the complex conjugate of {ref}'s"
        elif quantity == "reverse" and _convention_mixup(a, x, y, rtol, atol):
            d.conjugate = True
            d.note = f"{other}'s result is {ref}'s in the other complex convention"
    return d


def _close(x, y, rtol, atol) -> bool:
    with np.errstate(invalid="ignore", over="ignore"):
        return bool(np.all((np.abs(x - y) <= atol + rtol * np.abs(x)) | (x == y)))


def _convention_mixup(block: _Block, x, y, rtol, atol) -> bool:
    """Is ``y`` what ``x`` becomes in the other reverse-mode convention?

    A VJP in the other convention gives ``conj(vjp(conj(v)))``: the conjugate for a real
    cotangent and minus the conjugate for an imaginary one (the VJP is real-linear)."""
    if not block.axes or block.axes[0][0] != "cotangent" or x.shape[0] != 2:
        return False
    return _close(x[0], np.conj(y[0]), rtol, atol) and _close(x[1], -np.conj(y[1]), rtol, atol)


def _kink_hint(side: _Side, d: Difference) -> str:
    """One-sided finite differences (on ``side``) at the entry where two backends disagree.

    Different left and right slopes mean the input sits on a kink (``abs`` or ``relu`` at 0,
    ``clip`` at a bound, ``max`` at a tie), where each framework picks its own subgradient.
    """
    if d.quantity not in ("reverse", "forward") or d.input is None:
        return ""
    out_label, in_label = f"output {d.output} element ", f"input {d.input} element "
    if out_label not in d.position or in_label not in d.position:
        return ""
    r, i = d.position[out_label], d.position[in_label]
    p = side.checked[d.input]
    x = np.asarray(side.np_inputs[p])
    if np.iscomplexobj(x):
        return ""
    h = 1e-6 * max(1.0, abs(float(x.reshape(-1)[i])))

    def at(delta):
        moved = np.array(x, copy=True)
        moved.reshape(-1)[i] += delta
        inputs = list(side.np_inputs)
        inputs[p] = moved
        args = tuple(_from_numpy(side, a, False) if isinstance(a, np.ndarray) else a for a in inputs)
        out = side.be.as_tuple(side.port(*args))[d.output]
        return np.asarray(side.be.to_numpy(out)).reshape(-1)[r]

    try:
        with side.context(), np.errstate(all="ignore"):
            f0, fp, fm = at(0.0), at(h), at(-h)
    except Exception:  # the probe is a hint only
        return ""
    if np.iscomplexobj(f0):
        return ""
    left, right = float((f0 - fm) / h), float((fp - f0) / h)
    if not (np.isfinite(left) and np.isfinite(right)):
        return ""
    if abs(right - left) <= 1e-3 * (1 + max(abs(left), abs(right))):
        return ""
    in_at = list(np.unravel_index(i, x.shape)) if x.shape else []
    return (f"input {d.input} element {[int(v) for v in in_at]} sits on a kink of output {d.output}: "
            f"the one-sided slopes there are {left:.6g} (left) and {right:.6g} (right), so the "
            f"derivative is not defined and each framework picks its own subgradient "
            f"({d.reference}: {d.reference_value!r}, {d.other}: {d.other_value!r}). Check the "
            f"derivatives away from the kink, or decide which subgradient the ports must share.")


def _disagreement_message(result: CrosscheckResult, first: Difference, gradchecks: dict) -> str:
    what = _DESCRIPTION[first.quantity]
    if first.quantity == "value":
        subject = f"the value of output {first.output}"
    elif first.quantity == "second":
        subject = (f"the {what} of output {first.output} with respect to input {first.input} "
                   f"and input {first.input2}")
    else:
        subject = f"the {what} of output {first.output} with respect to input {first.input}"
    lines = [f"crosscheck: {first.reference} and {first.other} disagree on {subject} [{first.quantity}]."]
    if first.note == "different shapes":
        lines.append(f"The results have different {first.where}.")
    else:
        lines.append(
            f"Largest difference {first.max_abs:.6g} at {first.where}: {first.reference} gives "
            f"{first.reference_value!r}, {first.other} gives {first.other_value!r} "
            f"({first.n_bad} of {first.n_total} entries outside rtol={result.rtol:g}, atol={result.atol:g})."
        )
    if first.kink:
        lines.append(first.kink)
    if first.conjugate and "convention" in first.note:
        lines.append(f"The {first.other} result is exactly the {first.reference} result in the other complex "
                     f"convention (the conjugate for real cotangents, minus the conjugate for imaginary "
                     f"ones), not an unrelated error: {CONVENTION_NOTE}")
    elif first.conjugate:
        lines.append(f"The {first.other} result is exactly the complex conjugate of the {first.reference} "
                     f"result (within tolerance): {CONVENTION_NOTE}")
    elif _is_complex_pair(first) and first.note != "different shapes":
        lines.append("The two results are not complex conjugates of each other either.")
    others = [d for d in result.disagreements() if d is not first]
    if others:
        lines.append(f"{len(others)} more disagreement(s): "
                     + "; ".join(f"{d.quantity} {d.label} ({d.reference} vs {d.other})" for d in others[:6])
                     + ("; ..." if len(others) > 6 else ""))
    if gradchecks:
        verdicts = "; ".join(f"{n}: {s}" for n, s in gradchecks.items())
        lines.append(f"gradcheck on each backend: {verdicts}")
        failed = [n for n, s in gradchecks.items() if s.startswith("FAILED")]
        passed = [n for n, s in gradchecks.items() if s == "passed"]
        if failed and passed:
            lines.append(f"=> finite differences side with {', '.join(passed)}: the derivatives of "
                         f"{', '.join(failed)} are the wrong ones.")
    lines.append("")
    lines.append(result.summary())
    return "\n".join(lines)


def _is_complex_pair(d: Difference) -> bool:
    return isinstance(d.reference_value, complex) or isinstance(d.other_value, complex)


# -- the entry point -----------------------------------------------------------------------------


def _precision(np_inputs, checked) -> str:
    low = [np_inputs[p] for p in checked if np_inputs[p].dtype in (np.float32, np.float16, np.complex64)]
    return "float32" if low else "float64"


def _as_inputs(inputs) -> tuple:
    if isinstance(inputs, list):
        inputs = tuple(inputs)
    if not isinstance(inputs, tuple):
        inputs = (inputs,)
    return tuple(np.asarray(a) if isinstance(a, np.generic) else a for a in inputs)


def _resolve_backends(backends, backend_options, wrt) -> tuple[list, dict]:
    """``(name, Backend)`` pairs for the usable backends, and the skipped ones with reasons.

    With ``wrt`` given, backends that take a ``wrt=`` keyword (all but torch, whose
    checked inputs are the tensors that require grad) are configured with it, so that
    ``gradcheck=True`` checks the same inputs."""
    resolved, skipped, seen = [], {}, set()
    if isinstance(backends, (str, Backend)):
        backends = (backends,)
    for spec in backends:
        if isinstance(spec, Backend):
            name, be = spec.name, spec
        elif isinstance(spec, str):
            name = spec
            try:
                be = get_backend(spec)
            except BackendUnavailableError as e:
                skipped[spec] = f"not available ({e})"
                continue
        else:
            raise TypeError(f"backends must be names or Backend instances, got {spec!r}")
        if name in seen:
            raise ValueError(f"backend {name!r} is listed twice")
        seen.add(name)
        options = dict(backend_options.get(name, {}))
        if options:
            be = be.with_options(**options)
        if wrt is not None and name != "torch":
            try:
                be = be.with_options(wrt=tuple(wrt))
            except TypeError:
                pass  # the backend has no wrt=: crosscheck passes the positions itself
        resolved.append((name, be))
    return resolved, skipped


def crosscheck(
    fn,
    inputs,
    *,
    backends: Sequence = ("torch", "jax"),
    rtol: float | None = None,
    atol: float | None = None,
    fast_mode: bool = False,
    check_forward_ad: bool = True,
    check_backward_ad: bool = True,
    order: int = 1,
    raise_exception: bool = True,
    gradcheck: bool = False,
    wrt=None,
    backend_options: Mapping[str, Mapping] | None = None,
):
    """Check that ``fn`` computes the same values and derivatives on several backends.

    Parameters
    ----------
    fn : callable or mapping
        One function written against the array API (it receives each backend's arrays
        and may call ``array_api_compat.array_namespace`` on them), or a mapping
        ``{backend_name: callable}`` of hand-written ports.
    inputs : NumPy array or tuple
        The arguments, as NumPy arrays (converted for each backend: a torch tensor that
        requires grad, a ``jax.numpy`` array, ...); other values are passed through.
        The floating point and complex arrays are differentiated (or those at ``wrt``).
    backends : sequence
        Backend names (or configured :class:`~agcheck.backend.Backend` instances). The
        first is the reference the others are compared with. Backends whose framework is
        not installed are skipped (noted in the result); fewer than two left raise.
    rtol, atol : float, optional
        ``|other - reference| <= atol + rtol * |reference|``. Defaults by the inputs'
        precision: float64/complex128 ``rtol=1e-7, atol=1e-10``; float32/complex64
        ``rtol=1e-4, atol=1e-6``.
    fast_mode : bool
        Compare VJPs/JVPs of random cotangents/tangents (one per output / input) instead
        of full Jacobians.
    check_forward_ad, check_backward_ad : bool
        Compare forward-mode / reverse-mode derivatives.
    order : {1, 2}
        ``2`` also compares second derivatives (torch and JAX, through their own autodiff).
    raise_exception : bool
        Raise :class:`~agcheck.GradcheckError` on a disagreement (else return ``False``).
    gradcheck : bool
        Also run :func:`agcheck.gradcheck` (and with ``order=2``
        :func:`agcheck.gradgradcheck`) on every backend, so that a disagreement says
        which side is wrong.
    wrt : int or sequence of int, optional
        Positions of the inputs to differentiate (default: every floating/complex array).
    backend_options : mapping, optional
        Per backend name, the keywords of that backend (``{"numpy": {"vjp": ..., "jvp": ...}}``).

    Returns
    -------
    CrosscheckResult
        Truthy; per-backend values and derivatives and the table of differences
        (``print(result)`` shows it). ``False`` on a disagreement with ``raise_exception=False``.

    Raises
    ------
    GradcheckError
        Two backends disagree (the message names them, the quantity, the output and
        input, the largest difference and where), or a backend failed ``gradcheck``.
    BackendUnavailableError
        Fewer than two of the requested backends are installed.
    """
    if isinstance(order, bool) or order not in (1, 2):
        raise ValueError(f"order must be 1 or 2, got {order!r}")
    backend_options = dict(backend_options or {})
    np_inputs = _as_inputs(inputs)
    arrays = [k for k, a in enumerate(np_inputs) if isinstance(a, np.ndarray)]
    if wrt is None:
        checked = [k for k in arrays if np.issubdtype(np_inputs[k].dtype, np.inexact)]
    else:
        positions = (wrt,) if isinstance(wrt, int) else tuple(wrt)
        checked = sorted({p % len(np_inputs) for p in positions})
        for p in checked:
            if p not in arrays or not np.issubdtype(np_inputs[p].dtype, np.inexact):
                raise ValueError(f"wrt position {p} is not a floating point or complex NumPy array")
    if not checked:
        raise ValueError("crosscheck expects at least one floating point or complex NumPy array among the inputs")
    precision = _precision(np_inputs, checked)
    default_rtol, default_atol = DEFAULT_TOLERANCES[precision]
    rtol = default_rtol if rtol is None else float(rtol)
    atol = default_atol if atol is None else float(atol)
    use_x64 = any(np_inputs[k].dtype in (np.float64, np.complex128, np.int64) for k in arrays)

    resolved, skipped = _resolve_backends(backends, backend_options, None if wrt is None else checked)
    sides = []
    for name, be in resolved:
        if isinstance(fn, Mapping):
            if name not in fn:
                skipped[name] = "no port of fn given for this backend"
                continue
            port = fn[name]
        else:
            port = fn
        if not callable(port):
            raise TypeError(f"fn for backend {name!r} must be callable, got {type(port).__name__}")
        sides.append(_Side(name, be, port, np_inputs, checked, use_x64))
    if len(sides) < 2:
        requested = [n for n, _ in resolved] + list(skipped)
        reasons = "; ".join(f"{n}: {r}" for n, r in skipped.items()) or "only one backend requested"
        error = BackendUnavailableError if any(r.startswith("not available") for r in skipped.values()) else ValueError
        raise error(f"crosscheck needs at least two backends, {len(sides)} of {requested} usable ({reasons})")

    name = getattr(fn, "__name__", None) if not isinstance(fn, Mapping) else "the ports of fn"
    result = CrosscheckResult([s.name for s in sides], skipped, rtol, atol, fast_mode, order, name or "fn")

    computed = {q: {} for q in QUANTITIES}
    for side in sides:  # values first: they fix the shapes of fast mode's probes
        with side.context():
            side.setup()
        computed["value"][side.name] = {
            (k,): _Block(_value_array(side.output_numpy(o)),
                         [(f"output {k} element ", tuple(np.shape(side.output_numpy(o))))])
            for k, o in enumerate(side.outputs)
        }
        result.values[side.name] = tuple(side.output_numpy(o) for o in side.outputs)
    probes = _draw_probes(sides[0], np_inputs, checked) if fast_mode else {}

    for side in sides:
        with side.context():
            if check_backward_ad:
                if side.can("reverse"):
                    computed["reverse"][side.name] = _reverse(side, fast_mode, probes)
                else:
                    result.notes.append(f"{side.name}: reverse-mode derivatives not compared (no vjp given)")
            if check_forward_ad:
                if side.can("forward"):
                    computed["forward"][side.name] = _forward(side, fast_mode, probes)
                else:
                    result.notes.append(f"{side.name}: forward-mode derivatives not compared (no jvp given)")
            if order == 2:
                reason = _supports_second(side)
                if reason is None:
                    computed["second"][side.name] = _second(side, fast_mode, probes)
                else:
                    result.notes.append(f"{side.name}: second derivatives not compared ({reason})")
    for q in ("reverse", "forward", "second"):
        for n, blocks in computed[q].items():
            getattr(result, q)[n] = {key: b.data for key, b in blocks.items()}

    _fill_table(result, computed, sides)

    if gradcheck:
        result.gradchecks = _run_gradchecks(sides, fast_mode, check_forward_ad, check_backward_ad, order)

    if result.ok:
        return result
    if not raise_exception:
        return False
    bad = result.disagreements()
    if bad:
        first = bad[0]
        raise GradcheckError(
            _disagreement_message(result, first, result.gradchecks),
            check="crosscheck",
            details={"quantity": first.quantity, "backends": (first.reference, first.other),
                     "output": first.output, "input": first.input, "max_abs_diff": first.max_abs,
                     "where": first.where, "conjugate": first.conjugate, "result": result},
        )
    failed = result.failed_gradchecks()
    raise GradcheckError(
        "crosscheck: the backends agree with each other, but gradcheck failed on "
        + ", ".join(failed) + " (the ports may share the same wrong derivative):\n"
        + "\n".join(f"  {n}: {result.gradchecks[n]}" for n in failed) + "\n\n" + result.summary(),
        check="crosscheck_gradcheck",
        details={"failed": failed, "result": result},
    )


def _value_array(v):
    if isinstance(v, np.ndarray):
        return v
    return np.array([v], dtype=object)


def _draw_probes(side: _Side, np_inputs, checked) -> dict:
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


def _fill_table(result: CrosscheckResult, computed: dict, sides: list) -> None:
    ref = sides[0].name
    value_ref = computed["value"][ref]
    for side in sides[1:]:
        other = computed["value"][side.name]
        if len(other) != len(value_ref):
            d = Difference("value", ref, side.name, 0, ok=False, max_abs=float("inf"),
                           where=f"{len(value_ref)} outputs ({ref}) and {len(other)} outputs ({side.name})",
                           note="different shapes")
            result.differences.append(d)
            continue
        for key in value_ref:
            a, b = value_ref[key], other[key]
            exact = not (np.issubdtype(a.data.dtype, np.inexact) and np.issubdtype(b.data.dtype, np.inexact))
            result.differences.append(_compare("value", ref, side.name, key, a, b, result.rtol, result.atol, exact))
    for q in ("reverse", "forward", "second"):
        have = [s.name for s in sides if s.name in computed[q]]
        if len(have) < 2:
            if len(have) == 1:
                result.notes.append(f"{_DESCRIPTION[q]}s computed on {have[0]} only: nothing to compare them with")
            continue
        base = have[0]
        for n in have[1:]:
            for key, block in computed[q][base].items():
                other = computed[q][n].get(key)
                if other is None:
                    result.differences.append(Difference(q, base, n, key[0], key[1], key[2] if len(key) > 2 else None,
                                                         ok=False, max_abs=float("inf"),
                                                         where=f"missing on {n}", note="different shapes"))
                    continue
                d = _compare(q, base, n, key, block, other, result.rtol, result.atol)
                if not d.ok:
                    d.kink = _kink_hint(sides[0], d)
                    if d.kink and not d.note:
                        d.note = "kink"
                result.differences.append(d)


def _run_gradchecks(sides, fast_mode, check_forward_ad, check_backward_ad, order) -> dict:
    verdicts = {}
    for side in sides:
        fwd = check_forward_ad and side.can("forward")
        bwd = check_backward_ad and side.can("reverse")
        if not (fwd or bwd):
            verdicts[side.name] = "skipped: neither reverse nor forward derivatives available"
            continue
        with side.context():
            try:
                _gradcheck(side.port, side.fresh_args(), backend=side.be, fast_mode=fast_mode,
                           check_forward_ad=fwd, check_backward_ad=bwd)
                status = "passed"
                if order == 2 and _supports_second(side) is None:
                    _gradgradcheck(side.port, side.fresh_args(), backend=side.be, fast_mode=fast_mode)
                    status = "passed (gradcheck and gradgradcheck)"
            except GradcheckError as e:
                first = str(e).strip().splitlines()[0].rstrip(",") if str(e).strip() else type(e).__name__
                status = f"FAILED: {first}"
        verdicts[side.name] = status
    return verdicts
