"""The JAX backend: dense real and complex JAX arrays, pytree inputs, ``wrt=``.

JAX arrays are immutable and carry no ``requires_grad`` flag, so three things differ from
the torch backend:

* *which inputs are checked*: every inexact (floating or complex) JAX array among the
  leaves of the inputs, or the leaves of the arguments named by ``wrt=`` (an ``int`` or a
  tuple of ints, like ``jax.grad``'s ``argnums``);
* *perturbation*: ``fn`` is evaluated on a new argument tuple whose moved input is a new
  array (``x.at[idx].subtract(step)`` / ``.add(step)``, the same arithmetic as torch's
  in-place ``x[idx] - step``); nothing needs restoring;
* *complex numbers*: JAX's VJP is the conjugate of torch's,
  ``torch_vjp(v) == conj(jax_vjp(conj(v)))``, while JVPs agree. Every VJP this backend
  hands to the core is mapped into torch's convention, so the core's complex checks
  (and crosscheck) mean the same thing on both backends.

JAX has no undefined gradients or tangents: unused inputs get zero gradients, an
undefined tangent is a zero tangent, and undefined output gradients are JAX's symbolic
zeros (a custom VJP receives them instantiated as zeros).
"""
from __future__ import annotations

import contextlib
import hashlib
from contextlib import contextmanager
from functools import cached_property

import jax
import jax.numpy as jnp
import numpy as np

from agcheck.backends.wrt import TakesWrt, normalize_wrt, resolve_wrt
from agcheck.backends.base import Backend, Perturber, Trace, summary_edges
from agcheck.backends.batched_forms import BatchedForms
from agcheck.backends.host_checks import HostNamespace
from agcheck.warn import warn_caller

__all__ = ["JaxBackend", "JaxTrace", "JaxPerturber", "BACKEND_CLASS", "owns"]

X64_HINT = (
    "JAX's 64-bit mode is off (jax_enable_x64 is False), so JAX makes float32/complex64 "
    "arrays even from float64 data. Enable it before creating the inputs, either globally "
    "with jax.config.update(\"jax_enable_x64\", True) (or the environment variable "
    "JAX_ENABLE_X64=1), or for a block of code with `with jax.enable_x64(True): ...`."
)


def owns(x) -> bool:
    """Is ``x`` a JAX array (a concrete array or a tracer)?"""
    return isinstance(x, jax.Array)


def _is_inexact(x) -> bool:
    return owns(x) and jnp.issubdtype(x.dtype, jnp.inexact)


def _is_complex_dtype(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.complexfloating)


def _x64_enabled() -> bool:
    return bool(jax.config.jax_enable_x64)


def _device_of(x):
    """The single device of a concrete array (None for tracers or sharded arrays)."""
    try:
        devices = x.devices()
    except Exception:
        return None
    return next(iter(devices)) if len(devices) == 1 else None


def _host(x):
    """A NumPy view of ``x`` when it is a concrete JAX array on the CPU, else None.

    JAX compiles every primitive for every new shape when run eagerly (tens of ms each);
    the bookkeeping algebra of a check (reshapes, stacks, comparisons) is therefore done
    on such NumPy views (zero-copy), and results go back by ``jax.device_put``, which
    compiles nothing. Tracers and arrays on accelerators take the ``jax.numpy`` path and
    stay on their device.
    """
    if isinstance(x, np.ndarray):
        return x
    if not owns(x) or isinstance(x, jax.core.Tracer):
        return None
    device = _device_of(x)
    if device is None or device.platform != "cpu":
        return None
    return np.asarray(x)


def _back(values, like=None):
    """A NumPy result as a JAX array, on ``like``'s device when ``like`` is committed to one.

    ``jax.device_put`` rather than ``jnp.asarray``: the latter stages a copy that is
    compiled anew for every shape.
    """
    return jax.device_put(np.asarray(values), _committed_device(like))


#: the core's algebra: NumPy on the views of CPU arrays, jax.numpy for the others (see _host)
_XP = HostNamespace(_host, lambda values, like, dtype: _back(values, like), native=jnp)


def _committed_device(like):
    """``like``'s device where ``like`` is a concrete array committed to one, else None
    (the default device, uncommitted): a committed argument is a new cache key for every
    jitted function it meets, so each would compile again."""
    if like is None or not owns(like) or isinstance(like, jax.core.Tracer) or not getattr(like, "committed", True):
        return None
    return _device_of(like)


def _moved_entries(entries: np.ndarray, step, sign):
    """``entries - step`` or ``entries + step`` in their dtype, the step rounded to that dtype
    first, as JAX rounds a weak scalar (the element move of slow mode, on the host)."""
    delta = entries.dtype.type(step)
    return entries - delta if sign < 0 else entries + delta


def _joined(on_host, on_device, arrays, axis):
    """``arrays`` joined along ``axis``: by NumPy where all are on the host, else by JAX."""
    arrays = list(arrays)
    hosts = [_host(a) for a in arrays]
    if all(h is not None for h in hosts):
        return _back(on_host(hosts, axis=axis), arrays[0])
    return on_device(arrays, axis=axis)


def _conj(x):
    h = _host(x)
    if h is not None:
        return _back(np.conj(h), x)
    return jnp.conj(x)


def _astype(x, dtype):
    h = _host(x)
    if h is not None:
        return _back(h.astype(np.dtype(dtype)), x)
    return x.astype(dtype)


def _to_torch_convention(g):
    """A gradient from JAX's VJP, conjugated into torch's convention (None for float0)."""
    if g is None or g.dtype == jax.dtypes.float0:
        return None
    return _conj(g) if _is_complex_dtype(g.dtype) else g


def _zero_cotangent(o):
    """A zero cotangent for output ``o``: float0 for integer and boolean outputs."""
    if jnp.issubdtype(o.dtype, jnp.inexact):
        return _zeros_like(o)
    return np.zeros(o.shape, dtype=jax.dtypes.float0)


def _as_cotangent(c, o):
    """The cotangent ``c`` of output ``o``, in JAX's convention (conjugated) and dtype."""
    if not jnp.issubdtype(o.dtype, jnp.inexact):
        return np.zeros(o.shape, dtype=jax.dtypes.float0)
    if not owns(c):
        c = jnp.asarray(c)
    if c.dtype != o.dtype:
        c = _astype(c, o.dtype)
    return _conj(c) if _is_complex_dtype(c.dtype) else c


def _zeros_like(x):
    h = _host(x)
    return _back(np.zeros(h.shape, h.dtype), x) if h is not None else jnp.zeros_like(x)


def _tangent_for(t, x):
    """A tangent for primal ``x``: zeros for an undefined (None) tangent, ``x``'s dtype."""
    if t is None:
        return _zeros_like(x)
    if not owns(t):
        t = jnp.asarray(t)
    if t.dtype != x.dtype:
        t = _astype(t, x.dtype)
    if tuple(t.shape) != tuple(x.shape):
        t = jnp.reshape(t, x.shape)
    return t


def _output_tangent(primal, tangent):
    """A JVP result as an array of the primal's dtype (float0 tangents become zeros)."""
    if tangent is None or tangent.dtype == jax.dtypes.float0:
        return _zeros_like(primal)
    return tangent


class _Outputs:
    """Splits ``fn``'s outputs into the arrays JAX differentiates and everything else.

    JAX transformations only accept arrays as outputs; anything else ``fn`` returns is
    recorded on the side (the function is traced once, eagerly) and put back into place,
    so that the core reports a non-array output as torch does.
    """

    def __init__(self, as_tuple):
        self.as_tuple = as_tuple
        self.positions: list[int] | None = None
        self.others: dict[int, object] = {}
        self.n = 0

    def arrays_of(self, outs) -> tuple:
        outs = self.as_tuple(outs)
        self.n = len(outs)
        self.positions = [k for k, o in enumerate(outs) if owns(o)]
        self.others = {k: o for k, o in enumerate(outs) if not owns(o)}
        return tuple(outs[k] for k in self.positions)

    def rebuild(self, arrays) -> tuple:
        full = [None] * self.n
        for k, a in zip(self.positions, arrays):
            full[k] = a
        for k, o in self.others.items():
            full[k] = o
        return tuple(full)


def _is_none(value) -> bool:
    return value is None


def _with_replaced(args: tuple, positions, values) -> tuple:
    new = list(args)
    for p, v in zip(positions, values):
        new[p] = v
    return tuple(new)


class JaxTrace(Trace):
    """``fn``'s outputs and its JAX pullback at the traced point.

    ``vjp`` returns gradients in torch's convention: ``conj(pullback(conj(v)))``.
    """

    def __init__(self, outputs: tuple, array_positions: list, primal_outputs: tuple, pullback):
        super().__init__(outputs)
        self._array_positions = array_positions
        self._primal_outputs = primal_outputs
        self._pullback = pullback

    def _cotangents(self, given: dict) -> tuple:
        return tuple(
            _as_cotangent(given[k], o) if k in given else _zero_cotangent(o)
            for k, o in zip(self._array_positions, self._primal_outputs)
        )

    def vjp(self, output_positions, cotangents) -> list:
        given = dict(zip(output_positions, cotangents))
        grads = self._pullback(self._cotangents(given))
        return [_to_torch_convention(g) for g in grads]

    def vjp_batched(self, output_position, stacked_cotangents) -> list:
        def single(c):
            grads = self._pullback(self._cotangents({output_position: c}))
            return tuple(jnp.conj(g) if _is_complex_dtype(g.dtype) else g for g in grads)

        return list(jax.vmap(single)(jnp.asarray(stacked_cotangents)))


#: dtypes whose finite differences are combined on the host (IEEE arithmetic, in the dtype itself)
_HOST_ARITHMETIC = frozenset(np.dtype(name) for name in ("float32", "float64"))
#: dtypes in which one addition or subtraction rounds alike in NumPy and XLA (IEEE-754,
#: correctly rounded); the others' moved entries are computed by JAX
_HOST_MOVED = frozenset(np.dtype(name) for name in ("float32", "float64", "complex64", "complex128"))


class JaxPerturber(Perturber):
    """Evaluates ``fn`` on a new argument tuple with ``args[position]`` replaced by a
    moved copy; the original array is never touched (JAX arrays are immutable)."""

    def __init__(self, args: tuple, position: int, as_tuple):
        self.args = args
        self.position = position
        self.x = args[position]
        self.shape = tuple(self.x.shape)
        self.numel = int(self.x.size)
        self._as_tuple = as_tuple

    def index(self, flat: int) -> tuple:
        return tuple(int(i) for i in np.unravel_index(flat, self.shape)) if self.shape else ()

    def _call(self, fn, moved) -> tuple:
        return self._as_tuple(fn(*_with_replaced(self.args, [self.position], [moved])))

    def evaluate_element(self, fn, flat, step, sign) -> tuple:
        # the same arithmetic as torch's in-place move: x[idx] - step, x[idx] + step, in
        # x's dtype; moved on the host where NumPy rounds it as XLA does (an eager scatter
        # costs milliseconds per element)
        index = self.index(flat)
        host = self._host
        if host is None:
            at = self.x.at[index]
            return self._call(fn, at.subtract(step) if sign < 0 else at.add(step))
        moved = host.copy()
        moved[index] = _moved_entries(moved[index], step, sign)
        # on x's sharding only where x is committed to it (see _committed_device)
        sharding = self.x.sharding if getattr(self.x, "committed", False) else None
        return self._call(fn, jax.device_put(moved, sharding))

    @cached_property
    def _host(self):
        """The input as a NumPy array where NumPy moves its entries as XLA does (None
        otherwise), copied once, when an element is first moved."""
        if np.dtype(self.x.dtype) not in _HOST_MOVED:
            return None
        try:
            return np.array(self.x)
        except Exception:  # noqa: BLE001 - a tracer: moved by JAX itself
            return None

    def evaluate_direction(self, fn, step, sign) -> tuple:
        x = self.x
        dtype = np.promote_types(np.dtype(x.dtype), np.dtype(step.dtype))
        if dtype != x.dtype or dtype != step.dtype:  # promoted explicitly: strict promotion refuses it
            x, step = x.astype(dtype), step.astype(dtype)
        moved = x - step if sign < 0 else x + step
        if moved.dtype != self.x.dtype:
            moved = moved.astype(self.x.dtype)
        return self._call(fn, moved)


class JaxBackend(BatchedForms, TakesWrt, Backend):
    """Dense real and complex JAX arrays; pytree inputs; ``wrt=`` picks the checked inputs.

    Options (per call, through :meth:`with_options`):

    wrt : int or tuple of int, optional
        The positions of ``fn``'s arguments to differentiate with respect to (every
        inexact leaf of each named argument). Default: every inexact JAX array among the
        leaves of all arguments.
    """

    name = "jax"
    whole_batches = True
    capabilities = frozenset({"reverse", "forward", "batched", "batched_forward", "undefined_grad", "second_order",
                              "batched_evaluation", "batched_jvp"})
    no_checked_inputs_message = (
        "gradcheck expects at least one input to differentiate with respect to, but no input "
        "is a floating point or complex JAX array (choose inputs with wrt=...)."
    )

    def __init__(self, wrt=None):
        self.wrt = normalize_wrt(wrt)
        # set by prepare(): the flat arguments it made and the positions checked in them
        self._prepared: tuple | None = None
        self._prepared_checked: list | None = None

    # -- configuration ----------------------------------------------------------------
    def refusal(self, capability, keyword) -> Exception:
        """``masked`` concerns sparse inputs, which JAX does not have: refuse it clearly."""
        if capability == "masked":
            return ValueError(
                "masked=True selects the specified elements of sparse inputs, and JAX arrays "
                "are dense (jax.experimental.sparse arrays are not supported): the 'jax' "
                "backend has nothing to mask. Leave masked at its default."
            )
        return super().refusal(capability, keyword)

    def prepare(self, fn, inputs):
        """Flatten pytree inputs into a flat tuple of leaves; ``fn`` becomes a function of
        the leaves that returns its (pytree) outputs flattened into a tuple.

        Arguments named by ``wrt=`` that hold NumPy arrays or Python floats/complexes are
        converted to JAX arrays (as ``jax.grad`` would). When ``inputs`` begin with the
        flat arguments this instance prepared before (gradgradcheck appends cotangents to
        them), their checked positions are kept and the appended ones follow the default.
        """
        args = self.as_tuple(inputs)
        prev = self._prepared
        if prev is not None and len(args) >= len(prev) and all(a is b for a, b in zip(args, prev)):
            flat_fn, leaves = self._flat_function(fn, args)
            checked = list(self._prepared_checked)
            checked += [k for k in range(len(prev), len(leaves)) if _is_inexact(leaves[k])]
        else:
            named = resolve_wrt(self.wrt, len(args)) if self.wrt is not None else None
            if named is not None:
                args = tuple(self._as_jax_leaves(a) if k in named else a for k, a in enumerate(args))
            flat_fn, leaves, spans = self._flat_function(fn, args, with_spans=True)
            checked = []
            for k, (start, stop) in enumerate(spans):
                if named is not None and k not in named:
                    continue
                inexact = [p for p in range(start, stop) if _is_inexact(leaves[p])]
                if named is not None and not inexact:
                    raise ValueError(
                        f"wrt names input {k}, which holds no floating point or complex JAX array"
                    )
                checked += inexact
        self._prepared = leaves
        self._prepared_checked = checked
        return flat_fn, leaves

    @staticmethod
    def _as_jax_leaves(arg):
        def convert(leaf):
            if isinstance(leaf, (np.ndarray, np.generic)) and np.issubdtype(leaf.dtype, np.inexact):
                return jnp.asarray(leaf)
            if isinstance(leaf, (float, complex)):
                return jnp.asarray(leaf)
            return leaf

        return jax.tree_util.tree_map(convert, arg)

    def _flat_function(self, fn, args, with_spans=False):
        treedefs, leaves, spans = [], [], []
        for a in args:
            arg_leaves, treedef = jax.tree_util.tree_flatten(a)
            spans.append((len(leaves), len(leaves) + len(arg_leaves)))
            leaves.extend(arg_leaves)
            treedefs.append(treedef)
        leaves = tuple(leaves)
        trivial = all(stop - start == 1 and jax.tree_util.treedef_is_leaf(td)
                      for td, (start, stop) in zip(treedefs, spans))

        def flat_fn(*flat_args):
            if trivial:
                rebuilt = flat_args
            else:
                rebuilt = [jax.tree_util.tree_unflatten(td, flat_args[s:e]) for td, (s, e) in zip(treedefs, spans)]
            out = fn(*rebuilt)
            if owns(out):
                return (out,)
            # None stays a leaf: the core refuses it as an output, as it does on every backend
            return tuple(jax.tree_util.tree_leaves(out, is_leaf=_is_none))

        flat_fn.__wrapped__ = fn
        flat_fn.__name__ = getattr(fn, "__name__", "fn")
        if with_spans:
            return flat_fn, leaves, spans
        return flat_fn, leaves

    def checked_positions(self, args) -> list:
        """The checked positions: those resolved by :meth:`prepare` for the arguments it
        made (and, after them, appended inexact arrays); every inexact JAX array otherwise."""
        prev = self._prepared
        if prev is not None and len(args) >= len(prev) and all(a is b for a, b in zip(args, prev)):
            return list(self._prepared_checked) + [
                k for k in range(len(prev), len(args)) if _is_inexact(args[k])
            ]
        return [k for k, a in enumerate(args) if _is_inexact(a)]

    # -- inspection -------------------------------------------------------------------
    def owns(self, x) -> bool:
        return owns(x)

    def is_checked(self, x) -> bool:
        return _is_inexact(x)

    def is_complex(self, x) -> bool:
        return owns(x) and _is_complex_dtype(x.dtype)

    def is_floating_or_complex(self, x) -> bool:
        return _is_inexact(x)

    def is_double_precision(self, x) -> bool:
        return x.dtype in (jnp.float64, jnp.complex128)

    def is_differentiable_output(self, x) -> bool:
        # JAX has no requires_grad: every inexact output is differentiable (an output
        # that does not depend on the inputs has a zero Jacobian)
        return _is_inexact(x)

    def is_bool(self, x) -> bool:
        return x.dtype == jnp.bool_

    def real_dtype_of(self, x):
        return jnp.finfo(x.dtype).dtype

    def itemsize(self, x) -> int:
        return int(np.dtype(x.dtype).itemsize)

    def machine_epsilon(self, x) -> float:
        return float(jnp.finfo(x.dtype).eps)

    # -- validation -------------------------------------------------------------------
    def validate_input(self, idx, x) -> None:
        if not self.is_double_precision(x) and not _x64_enabled():
            warn_caller(f"Input #{idx} has dtype {x.dtype}. " + X64_HINT)

    @contextmanager
    def preserve_state(self, args):
        # JAX has no global RNG; the NumPy RNG is preserved by the core, and the backend
        # never changes JAX's configuration.
        yield

    # -- evaluation -------------------------------------------------------------------
    def trace(self, fn, args, checked) -> JaxTrace:
        checked = list(checked)
        split = _Outputs(self.as_tuple)

        def of_checked(*values):
            return split.arrays_of(fn(*_with_replaced(args, checked, values)))

        primal_outputs, pullback = jax.vjp(of_checked, *[args[p] for p in checked])
        return JaxTrace(split.rebuild(primal_outputs), list(split.positions), primal_outputs, pullback)

    @contextmanager
    def perturber(self, args, position):
        yield JaxPerturber(tuple(args), position, self.as_tuple)

    def _jvp_arrays(self, fn, args, positions, tangents):
        """``(primal outputs, tangent outputs)`` of the array outputs of ``fn``."""
        positions = list(positions)
        primals = [args[p] for p in positions]
        tangents = [_tangent_for(t, x) for t, x in zip(tangents, primals)]
        split = _Outputs(self.as_tuple)

        def of_checked(*values):
            return split.arrays_of(fn(*_with_replaced(args, positions, values)))

        return jax.jvp(of_checked, tuple(primals), tuple(tangents))

    def jvp(self, fn, args, checked, tangents) -> list:
        primal_out, tangent_out = self._jvp_arrays(fn, args, checked, tangents)
        return [(p, _output_tangent(p, t)) for p, t in zip(primal_out, tangent_out) if _is_inexact(p)]

    def jvp_wrt(self, fn, args, position, tangent) -> tuple:
        primal_out, tangent_out = self._jvp_arrays(fn, args, [position], [tangent])
        return tuple(_output_tangent(p, t) for p, t in zip(primal_out, tangent_out))

    def jvp_batched(self, fn, args, position, stacked_tangents) -> tuple:
        return jax.vmap(lambda t: self.jvp_wrt(fn, args, position, t))(jnp.asarray(stacked_tangents))

    def vjp_with_undefined_outputs(self, fn, args, checked, undefined, trace=None) -> list:
        # undefined output gradients <-> JAX's symbolic zeros, which a custom_vjp receives
        # instantiated: zero cotangents for every output
        trace = trace if trace is not None else self.trace(fn, args, checked)
        return trace.vjp([], [])

    # -- batched forms (the batched engine) ---------------------------------------------
    def evaluate_batch(self, fn, args, position, stacked):
        """``fn`` evaluated with ``args[position]`` replaced by each of ``stacked`` (vmapped)."""

        def at(value):
            return tuple(self.as_tuple(fn(*_with_replaced(args, [position], [value]))))

        return tuple(jax.vmap(at)(stacked))

    def element_moves(self, x, flat, step, sign):
        """Copies of ``x``, the ``b``-th with element ``flat[b]`` moved by ``sign * step``,
        computed as the element-by-element perturbation computes it (``x[k] - step``)."""
        b = len(flat)
        h = _host(x)
        if h is not None and h.dtype in _HOST_MOVED:  # on the host, as evaluate_element moves
            base = h.reshape(-1)
            index = np.asarray(flat, dtype=np.intp)
            moved = np.broadcast_to(base, (b, base.size)).copy()
            moved[np.arange(b), index] = _moved_entries(base[index], step, sign)
            return _back(moved.reshape((b, *x.shape)), x)
        base = jnp.reshape(x, (-1,))
        index = jnp.asarray(flat, dtype=jnp.int32 if base.size < 2**31 else jnp.int64)
        entries = base[index]
        moved_entries = entries - step if sign < 0 else entries + step
        moved = jnp.broadcast_to(base, (b, base.size)).at[jnp.arange(b), index].set(moved_entries.astype(x.dtype))
        return jnp.reshape(moved, (b, *x.shape))

    def one_hots(self, like, flat):
        b = len(flat)
        if _host(like) is not None:
            z = np.zeros((b, self.numel(like)), dtype=np.dtype(like.dtype))
            z[np.arange(b), np.asarray(flat, dtype=np.intp)] = 1
            return _back(z.reshape((b, *like.shape)), like)
        z = jnp.zeros((b, self.numel(like)), dtype=like.dtype)
        z = z.at[jnp.arange(b), jnp.asarray(flat)].set(1)
        return jnp.reshape(z, (b, *like.shape))

    def jvp_rows(self, fn, args, checked, j, flat):
        """Forward-mode Jacobian rows ``flat`` of input ``checked[j]``: one batched JVP.

        Returns, per floating output, a ``(len(flat), output.numel)`` array."""
        return self.jvp_along(fn, args, checked, j, self.one_hots(args[checked[j]], flat))

    def jvp_along(self, fn, args, checked, j, stacked):
        """JVPs of ``fn`` along each of ``stacked`` (tangents of input ``checked[j]``, the
        other inputs' tangents zero): per floating output a ``(len(stacked), numel)`` array."""
        zero = [_zeros_like(args[q]) for q in checked]

        def single(t):
            tangents = list(zero)
            tangents[j] = t
            return tuple(d for _, d in self.jvp(fn, args, checked, tangents))

        rows = jax.vmap(single)(stacked)
        return [_XP.reshape(r, (stacked.shape[0], -1)) for r in rows]

    # -- second order -----------------------------------------------------------------
    def random_cotangent(self, like, generator, noncontiguous):
        """Uniform values in [-1, 1) shaped like ``like`` (doubles for non-floating
        outputs); ``noncontiguous`` has no meaning for JAX arrays and is ignored."""
        dtype = like.dtype if _is_inexact(like) else jnp.float64
        shape = tuple(like.shape)
        if _is_complex_dtype(dtype):
            values = (generator.random(shape) * 2 - 1) + 1j * (generator.random(shape) * 2 - 1)
        else:
            values = generator.random(shape) * 2 - 1
        return self._from_numpy(values, like, dtype)

    def differentiable_vjp(self, fn, n_inputs, input_positions, cotangent_positions, evaluated=None,
                           few_calls=False, evaluated_seconds=None):
        """The VJP of ``fn`` (torch's convention) as a JAX function of
        ``(*inputs, *cotangents)``, differentiable again by JAX. Concrete calls whose
        inputs keep their values (only the cotangents move) reuse the last forward and its
        pullback, which JAX keeps pure."""
        ordered = sorted(set(input_positions))
        last = {}  # the last concrete forward: {"key": ..., "value": (outputs, pullback)}

        def vjp_of_fn(*args):
            primals, cotangents = args[:n_inputs], args[n_inputs:]
            split = _Outputs(self.as_tuple)

            def of_checked(*values):
                return split.arrays_of(fn(*_with_replaced(primals, ordered, values)))

            key = self._values_key(primals)
            if key is not None and last.get("key") == key:
                outs, pullback = last["value"]
            else:
                outs, pullback = jax.vjp(of_checked, *[primals[k] for k in ordered])
                last.clear()
                if key is not None:
                    last.update(key=key, value=(outs, pullback))
            given = iter(cotangents)
            cots = tuple(_as_cotangent(next(given), o) if _is_inexact(o) else _zero_cotangent(o) for o in outs)
            return tuple(_to_torch_convention(g) for g in pullback(cots))

        return vjp_of_fn

    # -- array algebra (NumPy views of CPU arrays: see _host) --------------------------
    def xp(self, x):
        return _XP

    def real(self, x):
        h = _host(x)
        return _back(np.real(h), x) if h is not None else jnp.real(x)

    def imag(self, x):
        h = _host(x)
        return _back(np.imag(h), x) if h is not None else jnp.imag(x)

    def part_as_input(self, x, part):
        return self.real(x) if part == "real" else self.imag(x)

    def combine(self, stencil, values, eps):
        # real float32/64 entries on the host: NumPy's correctly rounded IEEE arithmetic, in
        # the arrays' dtype as JAX computes it (XLA's division may differ in the last bit)
        values = list(values)
        hosts = [_host(v) for v in values]
        if all(h is not None and h.dtype in _HOST_ARITHMETIC for h in hosts) and len({h.dtype for h in hosts}) == 1:
            return _back(stencil.combine(hosts, eps), values[0])
        return stencil.combine(values, eps)

    def zeros(self, shape, like, dtype=None):
        dtype = np.dtype(dtype or like.dtype)
        if _host(like) is not None:
            return _back(np.zeros(tuple(shape), dtype), like)
        return self.to_device_of(jnp.zeros(tuple(shape), dtype=dtype), like)

    def one_hot(self, like, flat):
        if _host(like) is not None:
            z = np.zeros(like.shape, np.dtype(like.dtype))
            z.reshape(-1)[flat] = 1
            return _back(z, like)
        z = jnp.zeros((self.numel(like),), dtype=like.dtype).at[flat].set(1)
        return jnp.reshape(z, like.shape)

    def dot(self, u, v):
        hu, hv = _host(u), _host(v)
        if hu is not None and hv is not None:
            return _back(np.sum(hu * hv), u)
        return jnp.sum(u * v)

    def unchanged(self, x, snapshot) -> bool:
        hx, hs = _host(x), _host(snapshot)
        if hx is None or hs is None:
            return super().unchanged(x, snapshot)
        return bool(np.all((hx == hs) | (np.isnan(hx) & np.isnan(hs))))

    def plus_imaginary(self, a, b):
        # not a + b * 1j on JAX arrays: under jax_numpy_dtype_promotion="strict" a real array
        # does not promote to complex, nor float32 to float64
        ha, hb = _host(a), _host(b)
        if ha is not None and hb is not None:
            return _back(ha + hb * 1j, a)
        dtype = np.promote_types(np.dtype(a.dtype), np.dtype(b.dtype))
        if not _is_complex_dtype(dtype):
            return jax.lax.complex(jnp.asarray(a).astype(dtype), jnp.asarray(b).astype(dtype))
        dtype = np.dtype(dtype)
        return jnp.asarray(a).astype(dtype) + jnp.asarray(b).astype(dtype) * jnp.asarray(1j, dtype)

    def max_abs_difference(self, a, b):
        ha, hb = _host(a), _host(b)
        if ha is None or hb is None:
            return super().max_abs_difference(a, b)
        with np.errstate(invalid="ignore", over="ignore"):
            return float(np.max(np.abs(ha - hb)))

    def summarized_edge_items(self, numel: int) -> int | None:
        # jax arrays print through NumPy's array2string, which formats a summarised array
        # from its edges alone
        return summary_edges(np.get_printoptions(), numel)

    def allclose(self, a, b, rtol, atol) -> bool:
        """``|a - b| <= atol + rtol * |b|`` everywhere, after type promotion; NaN fails
        (equal infinities pass, as in torch.allclose)."""
        ha, hb = _host(a), _host(b)
        if ha is None and not owns(a):
            ha = np.asarray(a)
        if hb is None and not owns(b):
            hb = np.asarray(b)
        if ha is not None and hb is not None:
            a, b, xp = ha, hb, np
        else:
            a, b, xp = jnp.asarray(a), jnp.asarray(b), jnp
        dtype = xp.result_type(a, b)
        if not xp.issubdtype(dtype, xp.inexact):  # integer and boolean arrays
            dtype = xp.float64 if xp is np or _x64_enabled() else xp.float32
        a, b = a.astype(dtype), b.astype(dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            close = (a == b) | (xp.abs(a - b) <= atol + rtol * xp.abs(b))
        return bool(xp.all(close))

    def same_device(self, a, b) -> bool:
        return _device_of(a) == _device_of(b)

    def to_device_of(self, x, like):
        device = _device_of(like)
        if device is None or _device_of(x) == device:
            return x
        return jax.device_put(x, device)

    def to_numpy(self, x):
        return np.asarray(x)

    def _values_key(self, values: tuple):
        """A key equal for equal concrete arguments (``None`` where an argument is a tracer
        or a mutable object)."""
        key = []
        for v in values:
            if owns(v):
                digest = self.content_digest(v)
                if digest is None:
                    return None
                key.append(digest)
            elif isinstance(v, (int, float, complex, bool, str, type(None))):
                key.append((type(v), v))
            else:
                return None
        return tuple(key)

    def content_digest(self, x):
        values = _host(x)  # concrete arrays on the CPU only
        if values is None:
            return None
        digest = hashlib.blake2b(np.ascontiguousarray(values).view(np.uint8), digest_size=16).digest()
        return tuple(values.shape), values.dtype.str, digest

    # -- randomness -------------------------------------------------------------------
    def generator(self, like, seed):
        """A private NumPy generator (JAX keeps no global RNG state to disturb)."""
        return np.random.default_rng(seed)

    def _from_numpy(self, values, like, dtype):
        return _back(np.asarray(values).astype(np.dtype(dtype)), like)

    def array_like(self, values, like):
        return self._from_numpy(values, like, np.asarray(values).dtype)

    def uniform_unit_vector(self, like, generator, real):
        dtype = like.dtype
        if real and _is_complex_dtype(dtype):
            dtype = jnp.finfo(dtype).dtype
        n = self.numel(like)
        vec = generator.random(n)  # drawn in float64, normalized, then cast
        norm = np.linalg.norm(vec)
        if norm > 0:
            vec = vec / norm
        return self._from_numpy(vec, like, dtype)

    def normal_like(self, like, generator):
        shape = tuple(like.shape)
        if _is_complex_dtype(like.dtype):
            # unit variance overall, as torch's complex randn
            values = (generator.standard_normal(shape) + 1j * generator.standard_normal(shape)) / np.sqrt(2)
        else:
            values = generator.standard_normal(shape)
        return self._from_numpy(values, like, like.dtype)

    # -- conversion, precision, second derivatives (crosscheck and the frontends) -------
    def from_numpy(self, values, *, checked: bool = False, like=None):
        """A JAX array with the values of the NumPy array ``values`` (a copy: JAX may
        share a CPU array's memory), with ``like``'s dtype and on its device when
        ``like`` is given. ``checked`` has no meaning: every inexact JAX array takes
        part in a check by default (or those named with ``wrt=``). 64-bit values stay
        64-bit only under :meth:`precision`."""
        values = np.asarray(values)
        if like is not None:
            return _back(np.asarray(values, dtype=np.dtype(like.dtype)), like)
        return jax.device_put(np.array(values, copy=True))

    def precision(self, double: bool):
        """``jax.enable_x64(True)`` when ``double`` (the caller's setting comes back on
        exit, also when the body raises); nothing otherwise."""
        if not double:
            return contextlib.nullcontext()
        switch = getattr(jax, "enable_x64", None)  # a context manager in recent JAX
        if switch is not None:
            return switch(True)
        from jax.experimental import enable_x64  # older JAX

        return enable_x64()

    def vjp_of_vjp(self, fn, args, checked, output, cotangent, gradient_cotangents) -> dict:
        """``jax.vjp`` of ``jax.vjp``, each mapped into torch's convention:
        ``torch_vjp(v) == conj(jax_vjp(conj(v)))`` at both levels."""
        primals = [args[p] for p in checked]

        def f_k(*xs):
            return self.as_tuple(fn(*_with_replaced(args, checked, xs)))[output]

        w = jnp.asarray(np.asarray(cotangent, dtype=np.asarray(f_k(*primals)).dtype))

        def gradient_in_torch_convention(*xs):
            _, pullback = jax.vjp(f_k, *xs)
            return tuple(jnp.conj(g) for g in pullback(jnp.conj(w)))

        result = {}
        for j1 in range(len(primals)):
            _, pullback2 = jax.vjp(lambda *xs, j1=j1: gradient_in_torch_convention(*xs)[j1], *primals)
            g_dtype = np.asarray(primals[j1]).dtype
            rows = {j2: [] for j2 in range(len(primals))}
            for c in gradient_cotangents[j1]:
                hs = pullback2(jnp.conj(jnp.asarray(np.asarray(c, dtype=g_dtype))))
                for j2, h in enumerate(hs):
                    rows[j2].append(np.asarray(jnp.conj(h)).reshape(-1))
            for j2 in rows:
                result[(j1, j2)] = np.stack(rows[j2], 0)
        return result

    def compiled(self, fn):
        """``jax.jit(fn)``: eagerly, every array-API call compiles its own small XLA
        program; derivatives are the same either way."""
        return jax.jit(fn)


BACKEND_CLASS = JaxBackend
