"""The NumPy / array-API backend: finite differences against user-supplied derivatives.

NumPy (and CuPy, ``array_api_strict``, ... — anything ``array_api_compat`` knows) has no
autodiff, so the analytical side of the check comes from the caller::

    agcheck.gradcheck(fn, (x, y), backend="numpy", vjp=my_vjp, jvp=my_jvp)

``vjp(inputs, cotangents) -> grads``
    ``inputs`` is the full tuple of ``fn``'s arguments, ``cotangents`` a tuple with one
    entry per output of ``fn`` (an array shaped and typed like the output, ``None`` for an
    output that is not a floating/complex array). Returns one gradient per checked input
    (``None`` for "undefined", treated as zeros); one per argument of ``fn`` is accepted
    too, and a single array when exactly one input is checked.
``jvp(inputs, tangents) -> output tangents``
    ``tangents`` has one entry per checked input (shaped and typed like it). Returns one
    tangent per output of ``fn`` (a single array when ``fn`` returns one array; ``None``
    for an output that does not depend on the inputs).

The numerical side is agcheck's: every evaluation gets a fresh copy of the moved input
(``orig - step`` / ``orig + step`` element-wise, as torch computes it), so the caller's
arrays are never written to. Unlike the torch backend, a function that reads an input
through a closure does not see the move.

Complex numbers follow torch's convention by default; ``convention="jax"`` accepts a vjp
written in JAX's convention and maps it (``torch_vjp(v) == conj(jax_vjp(conj(v)))``).
"""
from __future__ import annotations

import hashlib
from contextlib import contextmanager
from typing import Callable, Sequence

import array_api_compat
import numpy as np

from agcheck.backends.base import Backend, Perturber, Trace
from agcheck.backends.numpy_derivatives import (CONVENTIONS, MissingDerivativeError, UserDerivatives, UserFunction,
                                                forward_missing, resolve, reverse_missing)

__all__ = ["NumpyBackend", "NumpyTrace", "MissingDerivativeError", "BACKEND_CLASS", "owns"]


def owns(x) -> bool:
    """Any array ``array_api_compat`` recognises (NumPy arrays and scalars, CuPy, ...).

    Other frameworks' arrays are claimed too: inference prefers their own backend and
    falls back to this one only when no other framework's arrays are present.
    """
    return array_api_compat.is_array_api_obj(x)


# -- trace and perturber ---------------------------------------------------------------------


class NumpyTrace(Trace):
    """The outputs of ``fn`` at one point; VJPs come from the user's ``vjp``."""

    def __init__(self, backend: "NumpyBackend", fn, args: tuple, checked: Sequence[int], outputs: tuple):
        super().__init__(outputs)
        self.backend, self.fn, self.args, self.checked = backend, fn, args, list(checked)

    def vjp(self, output_positions, cotangents) -> list:
        be = self.backend
        given = dict(zip(output_positions, cotangents))
        cots = []
        for k, o in enumerate(self.outputs):
            if not be.is_differentiable_output(o):
                cots.append(None)
            elif k in given and given[k] is not None:
                cots.append(given[k])
            else:
                cots.append(be.xp(o).zeros_like(o))
        return be.vjp_of(self.fn, self.args, self.checked, cots)

    def vjp_batched(self, output_position, stacked_cotangents) -> list:
        """A loop of :meth:`vjp` over the leading dimension (NumPy has no vmap)."""
        be = self.backend
        rows = [self.vjp([output_position], [stacked_cotangents[b, ...]])
                for b in range(int(stacked_cotangents.shape[0]))]
        result = []
        for i, p in enumerate(self.checked):
            column = [r[i] for r in rows]
            if all(g is None for g in column):
                result.append(None)
                continue
            x = self.args[p]
            xp = be.xp(x)
            result.append(xp.stack([xp.zeros_like(x) if g is None else g for g in column], axis=0))
        return result


class NumpyPerturber(Perturber):
    """Evaluates ``fn`` on a fresh copy of the input with one element (or all) moved."""

    def __init__(self, backend: "NumpyBackend", args: tuple, position: int):
        self.backend, self.args, self.position = backend, args, position
        self.x = args[position]
        self.shape = tuple(int(s) for s in self.x.shape)
        self.numel = backend.numel(self.x)

    def index(self, flat: int) -> tuple:
        return tuple(int(i) for i in np.unravel_index(flat, self.shape)) if self.shape else ()

    def _call(self, fn, moved) -> tuple:
        args = list(self.args)
        args[self.position] = moved
        return self.backend.outputs_of(fn, tuple(args))

    def evaluate_element(self, fn, flat, step, sign) -> tuple:
        return self._call(fn, self.backend.element_moved(self.x, flat, step, sign))

    def evaluate_direction(self, fn, step, sign) -> tuple:
        be, x = self.backend, self.x
        moved = x - step if sign < 0 else x + step
        if moved.dtype != x.dtype:
            moved = be.xp(moved).astype(moved, x.dtype)
        return self._call(fn, moved)


# -- the backend ------------------------------------------------------------------------------


class NumpyBackend(UserDerivatives, Backend):
    """NumPy and any array-API namespace, with hand-written derivatives.

    Configure per call with ``vjp=``, ``jvp=``, ``convention=`` ("torch" or "jax") and
    ``wrt=`` (positions of the checked inputs; by default every floating or complex
    array among the inputs).
    """

    name = "numpy"
    no_checked_inputs_message = (
        "gradcheck expects at least one floating point or complex input array to "
        "differentiate with respect to (the numpy backend checks every such input, or "
        "the positions given with wrt=...)."
    )

    def __init__(self, vjp: Callable | None = None, jvp: Callable | None = None,
                 convention: str = "torch", wrt=None):
        if vjp is not None and not callable(vjp):
            raise TypeError(f"vjp must be callable, got {type(vjp).__name__}")
        if jvp is not None and not callable(jvp):
            raise TypeError(f"jvp must be callable, got {type(jvp).__name__}")
        if convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
        self.vjp, self.jvp_fn, self.convention = vjp, jvp, convention
        self.wrt = _normalize_wrt(wrt)
        caps = {"batched", "batched_forward", "undefined_grad", "masked"}
        if vjp is not None:
            caps.add("reverse")
        if jvp is not None:
            caps.add("forward")
        self.capabilities = frozenset(caps)

    def __repr__(self) -> str:
        return (f"NumpyBackend(vjp={'set' if self.vjp else None}, jvp={'set' if self.jvp_fn else None}, "
                f"convention={self.convention!r}, wrt={self.wrt})")

    # -- configuration ----------------------------------------------------------------
    def with_options(self, **options) -> "NumpyBackend":
        """A copy configured with ``vjp=``, ``jvp=``, ``convention=``, ``wrt=`` (the
        options not given keep this instance's values)."""
        if not options:
            return self
        unknown = sorted(set(options) - {"vjp", "jvp", "convention", "wrt"})
        if unknown:
            raise TypeError(
                f"the 'numpy' backend takes the keywords vjp, jvp, convention and wrt; got {unknown}"
            )
        config = {"vjp": self.vjp, "jvp": self.jvp_fn, "convention": self.convention, "wrt": self.wrt}
        config.update(options)
        return NumpyBackend(**config)

    def refusal(self, capability, keyword) -> Exception:
        """Say before any work that a requested mode has no derivative to check."""
        if capability == "reverse":
            return reverse_missing()
        if capability == "forward":
            return forward_missing()
        return super().refusal(capability, keyword)

    def prepare(self, fn, inputs):
        if isinstance(fn, UserFunction):
            return fn, self.as_tuple(inputs)
        return UserFunction(fn, self.vjp, self.jvp_fn, self.convention), self.as_tuple(inputs)

    # -- inspection -------------------------------------------------------------------
    def owns(self, x) -> bool:
        return owns(x)

    def _dtype_is(self, x, kind) -> bool:
        return bool(self.xp(x).isdtype(x.dtype, kind))

    def is_checked(self, x) -> bool:
        return self.is_array(x) and self.is_floating_or_complex(x)

    def checked_positions(self, args: tuple) -> list:
        if self.wrt is None:
            return [k for k, a in enumerate(args) if self.is_checked(a)]
        for p in self.wrt:
            if not -len(args) <= p < len(args):
                raise ValueError(f"wrt position {p} is out of range for {len(args)} inputs")
            a = args[p]
            if not (self.is_array(a) and self.is_floating_or_complex(a)):
                raise ValueError(
                    f"wrt position {p} names an input that is not a floating point or complex "
                    f"array ({type(a).__name__}{'' if not self.is_array(a) else ' of dtype ' + str(a.dtype)})"
                )
        return sorted({p % len(args) for p in self.wrt})

    def is_complex(self, x) -> bool:
        return self.is_array(x) and self._dtype_is(x, "complex floating")

    def is_floating_or_complex(self, x) -> bool:
        return self.is_array(x) and self._dtype_is(x, ("real floating", "complex floating"))

    def is_double_precision(self, x) -> bool:
        xp = self.xp(x)
        return x.dtype in (xp.float64, xp.complex128)

    def is_differentiable_output(self, x) -> bool:
        return self.is_floating_or_complex(x)

    def is_bool(self, x) -> bool:
        return x.dtype == self.xp(x).bool

    def real_dtype_of(self, x):
        xp = self.xp(x)
        return {xp.complex64: xp.float32, xp.complex128: xp.float64}.get(x.dtype, x.dtype)

    # -- evaluation -------------------------------------------------------------------
    def outputs_of(self, fn, args) -> tuple:
        """``fn(*args)`` as a tuple, NumPy scalars (``np.sum`` returns them) made 0-d arrays."""
        return tuple(np.asarray(o) if isinstance(o, np.generic) else o for o in self.as_tuple(fn(*args)))

    def trace(self, fn, args, checked) -> NumpyTrace:
        resolve(fn)  # fail early on a function whose derivatives are unknown
        return NumpyTrace(self, fn, tuple(args), checked, self.outputs_of(fn, args))

    @contextmanager
    def perturber(self, args, position):
        """Each evaluation gets a fresh moved copy: the caller's arrays are never written."""
        yield NumpyPerturber(self, tuple(args), position)

    def element_moved(self, x, flat: int, step, sign):
        """A copy of ``x`` with element ``flat`` moved: ``x[i] - step`` or ``x[i] + step``."""
        xp = self.xp(x)
        shape = tuple(int(s) for s in x.shape)
        idx = tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()
        entry = x[idx]
        value = entry - step if sign < 0 else entry + step
        moved = xp.asarray(x, copy=True)
        try:
            moved[idx] = value
            return moved
        except (TypeError, ValueError, NotImplementedError):
            pass  # an immutable namespace (JAX): select the moved element instead
        mask = xp.reshape(xp.arange(self.numel(x), device=array_api_compat.device(x)) == flat, shape)
        shifted = x - step if sign < 0 else x + step
        return xp.where(mask, xp.astype(shifted, x.dtype), x)


    def jvp(self, fn, args, checked, tangents) -> list:
        outputs = self.outputs_of(fn, args)
        ts = self.jvp_of(fn, tuple(args), list(checked), list(tangents))
        return [(o, t) for o, t in zip(outputs, ts) if self.is_floating_or_complex(o)]

    def jvp_wrt(self, fn, args, position, tangent) -> tuple:
        checked = self.checked_positions(args)
        tangents = [tangent if p == position else self.xp(args[p]).zeros_like(args[p]) for p in checked]
        return tuple(self.xp(o).zeros_like(o) if t is None else t for o, t in self.jvp(fn, args, checked, tangents))

    def jvp_batched(self, fn, args, position, stacked_tangents) -> tuple:
        """A loop of JVPs over the leading dimension (NumPy has no vmap)."""
        rows = [self.jvp_wrt(fn, args, position, stacked_tangents[b, ...])
                for b in range(int(stacked_tangents.shape[0]))]
        xp = self.xp(stacked_tangents)
        return tuple(xp.stack(list(per_output), axis=0) for per_output in zip(*rows))

    def vjp_with_undefined_outputs(self, fn, args, checked, undefined, trace=None) -> list:
        """NumPy has no "undefined" gradient: undefined output gradients are zero cotangents."""
        outputs = trace.outputs if trace is not None else self.outputs_of(fn, args)
        cots = [self.xp(o).zeros_like(o) if self.is_differentiable_output(o) else None for o in outputs]
        return self.vjp_of(fn, tuple(args), list(checked), cots)

    # -- second order ------------------------------------------------------------------
    def random_cotangent(self, like, generator, noncontiguous):
        dtype = like.dtype if self.is_floating_or_complex(like) else self.xp(like).float64
        values = generator.random(tuple(like.shape)) * 2 - 1
        return self.xp(like).asarray(values, dtype=dtype, device=array_api_compat.device(like))

    def differentiable_vjp(self, fn, n_inputs, input_positions, cotangent_positions, evaluated=None,
                           few_calls=False, evaluated_seconds=None):
        raise NotImplementedError(
            "the numpy backend cannot check second derivatives: its derivatives are the "
            "first-order vjp/jvp you supply, which it cannot differentiate again. Check the "
            "vjp itself with agcheck.gradcheck(..., backend='numpy', vjp=<its vjp>) or use "
            "an autodiff backend (torch, jax)."
        )

    # -- array algebra ----------------------------------------------------------------
    def real(self, x):
        return self.xp(x).real(x) if self.is_complex(x) else x

    def imag(self, x):
        return self.xp(x).imag(x) if self.is_complex(x) else self.xp(x).zeros_like(x)

    def part_as_input(self, x, part):
        piece = self.real(x) if part == "real" else self.imag(x)
        return self.xp(piece).asarray(piece, copy=True)

    def row_block(self, n_rows, n_cols, like, dtype):
        # this backend writes into arrays elsewhere too (one_hot): its namespaces are mutable
        return self.xp(like).empty((n_rows, n_cols), dtype=dtype, device=array_api_compat.device(like))

    def owned_rows(self, rows):
        # NumPy itself: an array that owns its data; other namespaces' arrays are copied
        if isinstance(rows, np.ndarray) and rows.base is None and rows.flags.c_contiguous \
                and rows.flags.writeable:
            return rows
        return None

    def one_hots(self, like, flat):
        xp = self.xp(like)
        n = self.numel(like)
        z = xp.zeros((len(flat), n), dtype=like.dtype, device=array_api_compat.device(like))
        for row, f in enumerate(flat):
            z[row, f] = 1
        return xp.reshape(z, (len(flat), *tuple(like.shape)))

    def allclose(self, a, b, rtol, atol) -> bool:
        """``|a - b| <= atol + rtol * |b|`` everywhere (equal infinities pass, NaN fails)."""
        xp = self.xp(a)
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: the equality decides
            diff = xp.abs(a - b)
            ok = (diff <= atol + rtol * xp.abs(b)) | (a == b)
        return bool(xp.all(ok))

    def same_device(self, a, b) -> bool:
        return array_api_compat.device(a) == array_api_compat.device(b)

    def content_digest(self, x):
        if type(x) is not np.ndarray:  # other array-API namespaces: values may live off the host
            return None
        values = hashlib.blake2b(np.ascontiguousarray(x).view(np.uint8), digest_size=16).digest()
        return x.shape, x.dtype.str, values

    def to_device_of(self, x, like):
        target = array_api_compat.device(like)
        if array_api_compat.device(x) == target:
            return x
        return array_api_compat.to_device(x, target)

    def restore(self, x, snapshot) -> None:
        """Write ``snapshot`` back into ``x`` (after ``fn`` modified its input in place)."""
        try:
            x[...] = snapshot
        except (TypeError, ValueError):  # immutable or read-only: nothing was modified
            pass

    def to_numpy(self, x):
        if isinstance(x, (np.ndarray, np.generic)):
            return np.asarray(x)
        try:
            return np.asarray(x)
        except (TypeError, ValueError, RuntimeError):
            if hasattr(x, "get"):  # CuPy
                return np.asarray(x.get())
            return np.from_dlpack(array_api_compat.to_device(x, "cpu"))

    # -- randomness -------------------------------------------------------------------
    def generator(self, like, seed):
        """A private ``numpy.random.Generator`` (the global NumPy state is not touched)."""
        return np.random.Generator(np.random.PCG64(seed))

    def uniform_unit_vector(self, like, generator, real):
        n = self.numel(like)
        vec = generator.random(n)
        norm = np.linalg.norm(vec)
        if n:
            vec = vec / norm
        dtype = self.real_dtype_of(like) if real else like.dtype
        return self.xp(like).asarray(vec, dtype=dtype, device=array_api_compat.device(like))

    def normal_like(self, like, generator):
        shape = tuple(like.shape)
        if self.is_complex(like):
            sample = (generator.standard_normal(shape) + 1j * generator.standard_normal(shape)) / np.sqrt(2)
        else:
            sample = generator.standard_normal(shape)
        return self.xp(like).asarray(sample, dtype=like.dtype, device=array_api_compat.device(like))

    # -- conversion, precision, second derivatives (crosscheck and the frontends) -------
    def from_numpy(self, values, *, checked: bool = False, like=None):
        """A private copy of the NumPy array ``values`` (the caller's array is never
        written to), as an array of ``like``'s namespace, dtype and device when ``like``
        is given. ``checked`` has no meaning: the checked inputs are every floating
        point or complex array, or those named with ``wrt=``."""
        copied = np.array(values, copy=True)
        if like is None:
            return copied
        if isinstance(like, (np.ndarray, np.generic)):
            return np.asarray(copied, dtype=like.dtype)
        return self.xp(like).asarray(copied, dtype=like.dtype, device=array_api_compat.device(like))

    # precision(): NumPy keeps the precision of its data; the base class's does nothing

    # vjp_of_vjp(): not implemented (the base class's raises NotImplementedError): the
    # numpy backend has only the first-order vjp/jvp the caller supplies


def _normalize_wrt(wrt):
    if wrt is None:
        return None
    if isinstance(wrt, bool) or not isinstance(wrt, (int, tuple, list)):
        raise TypeError(f"wrt must be an int or a sequence of ints, got {wrt!r}")
    positions = (wrt,) if isinstance(wrt, int) else tuple(wrt)
    for p in positions:
        if isinstance(p, bool) or not isinstance(p, int):
            raise TypeError(f"wrt must be an int or a sequence of ints, got {wrt!r}")
    return positions


BACKEND_CLASS = NumpyBackend
