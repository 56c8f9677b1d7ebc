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

import jax
import jax.numpy as jnp
import numpy as np

from agcheck.backends.wrt import TakesWrt, normalize_wrt, resolve_wrt
from agcheck.backends.base import Backend, summary_edges
from agcheck.backends.jax_arrays import (_HOST_ARITHMETIC, _XP, _Outputs, _back, _device_of, _host,
                                         _is_complex_dtype, _is_inexact, _is_none, _output_tangent,
                                         _tangent_for, _with_replaced, _x64_enabled, owns)
from agcheck.backends.jax_batched import JaxBatched
from agcheck.backends.jax_second_order import JaxSecondOrder
from agcheck.backends.jax_trace import JaxPerturber, JaxTrace
from agcheck.warn import warn_caller

__all__ = ["JaxBackend", "JaxTrace", "JaxPerturber", "BACKEND_CLASS", "owns"]

X64_HINT = (
    "JAX's 64-bit mode is off (jax_enable_x64 is False), so JAX makes float32/complex64 "
    "arrays even from float64 data. Enable it before creating the inputs, either globally "
    "with jax.config.update(\"jax_enable_x64\", True) (or the environment variable "
    "JAX_ENABLE_X64=1), or for a block of code with `with jax.enable_x64(True): ...`."
)


class JaxBackend(JaxBatched, JaxSecondOrder, TakesWrt, Backend):
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

    def compiled(self, fn):
        """``jax.jit(fn)``: eagerly, every array-API call compiles its own small XLA
        program; derivatives are the same either way."""
        return jax.jit(fn)


BACKEND_CLASS = JaxBackend
