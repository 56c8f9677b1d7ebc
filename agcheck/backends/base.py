"""The backend contract: what agcheck's core asks of an array framework.

The core (``agcheck.core.jacobian``, ``agcheck.gradcheck`` and ``agcheck.checks``) never imports
a framework: everything framework-specific goes through a :class:`Backend`. A backend
grows from four verbs — *perturb* (evaluate the function with one input moved, restoring
it exactly), *vjp*, *jvp* and *allclose* — plus inspection of arrays and the little vector
algebra the core needs. Python's arithmetic operators (``+ - * /``) are used on arrays
directly; they are the one part of the array API every framework shares.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

__all__ = ["Backend", "Trace", "Perturber", "BackendUnavailableError"]


class BackendUnavailableError(ImportError):
    """The framework behind a backend is not installed."""


class Trace:
    """The outputs of one evaluation of ``fn`` and the reverse-mode derivative at that point.

    Parameters
    ----------
    outputs : tuple
        Everything ``fn`` returned, as a tuple.
    """

    def __init__(self, outputs: tuple):
        self.outputs = outputs

    def vjp(self, output_positions: Sequence[int], cotangents: Sequence[Any]) -> list:
        """Vector-Jacobian product.

        Returns one entry per checked input: the gradient (an array) or ``None`` where
        the gradient is undefined (the input is unused).
        """
        raise NotImplementedError

    def vjp_batched(self, output_position: int, stacked_cotangents) -> list:
        """Many VJPs at once: ``stacked_cotangents`` has a leading batch dimension."""
        raise NotImplementedError


class Perturber:
    """Moves one input in place and evaluates ``fn``; the input is restored bitwise.

    Obtained from :meth:`Backend.perturber`; the backend guarantees restoration also
    when ``fn`` raises, and after the ``with`` block that created it.
    """

    numel: int
    shape: tuple

    def index(self, flat: int) -> tuple:
        """The multi-index of the flat element ``flat`` (for messages)."""
        raise NotImplementedError

    def evaluate_element(self, fn: Callable, flat: int, delta) -> tuple:
        """Outputs of ``fn`` with element ``flat`` moved by the scalar ``delta``."""
        raise NotImplementedError

    def evaluate_direction(self, fn: Callable, delta) -> tuple:
        """Outputs of ``fn`` with the whole input moved by the array ``delta``."""
        raise NotImplementedError

    # Inputs stored sparsely: ``numel`` counts the stored elements (what is moved), while
    # the Jacobian has one row per element of the input's dense equivalent.
    def dense_rows(self):
        """``None`` when stored element ``k`` is Jacobian row ``k`` (dense arrays); else
        ``(n_rows, rows)``: the Jacobian has ``n_rows`` rows, stored element ``k`` is row
        ``rows[k]``, and the rows of elements that are not stored are zero."""
        return None

    def direction(self, u):
        """The flat probe ``u`` (one entry per dense element) as :meth:`evaluate_direction`
        takes it; ``None`` lets the core reshape ``u`` to the input's shape."""
        return None


class Backend:
    """What the core asks of an array framework.

    Subclasses implement the abstract methods; the defaults of the others are written
    against the array API (through ``array_api_compat``) and may be overridden for speed.
    """

    name: str = "abstract"
    #: the checks this backend can run; a check it cannot run is reported, never passed
    capabilities: frozenset = frozenset()

    # -- inspection -------------------------------------------------------------------
    def owns(self, x) -> bool:
        """Is ``x`` an array of this backend's framework?"""
        raise NotImplementedError

    def is_array(self, x) -> bool:
        return self.owns(x)

    def is_checked(self, x) -> bool:
        """Does ``x`` take part in the check (an input to differentiate with respect to)?"""
        raise NotImplementedError

    def checked_positions(self, args: tuple) -> list:
        """The positions in ``args`` of the inputs that take part in the check."""
        return [k for k, a in enumerate(args) if self.is_array(a) and self.is_checked(a)]

    #: the ValueError raised when no input takes part in the check
    no_checked_inputs_message = "gradcheck expects at least one input array to differentiate with respect to."

    def is_complex(self, x) -> bool:
        raise NotImplementedError

    def is_floating_or_complex(self, x) -> bool:
        raise NotImplementedError

    def is_double_precision(self, x) -> bool:
        raise NotImplementedError

    def is_differentiable_output(self, x) -> bool:
        raise NotImplementedError

    def numel(self, x) -> int:
        n = 1
        for s in x.shape:
            n *= int(s)
        return n

    def dtype_name(self, x) -> str:
        return str(x.dtype)

    def layout(self, x) -> str:
        """``"dense"`` for an ordinary array, else the backend's name of ``x``'s layout
        (torch: ``"sparse_coo"``, ``"sparse_csr"``, ..., ``"mkldnn"``)."""
        return "dense"

    def densify(self, x):
        """``x`` as the numerical side of an unmasked check (``masked`` false) moves it: a
        sparse array with every element specified (the unspecified ones as explicit
        zeros). Dense arrays are returned as they are."""
        return x

    # -- configuration ----------------------------------------------------------------
    def with_options(self, **options) -> "Backend":
        """This backend configured by the extra keywords of one call (e.g. ``wrt=``)."""
        if options:
            raise TypeError(f"the {self.name!r} backend takes no extra keywords, got {sorted(options)}")
        return self

    def adopt_error(self, error):
        """Make ``error`` (an :class:`agcheck.GradcheckError` about to leave the public
        entry) also an instance of the framework's own gradcheck error type, so that the
        framework's handlers catch it; message, report and traceback stay. The default
        leaves it as it is."""
        return error

    def check_supported(self, opts) -> None:
        """Raise, before any work, if this backend cannot run the checks ``opts`` asks for."""

    def prepare(self, fn: Callable, inputs) -> tuple[Callable, tuple]:
        """``fn`` and its inputs as the core sees them: a callable of a flat tuple of arguments."""
        return fn, self.as_tuple(inputs)

    # -- validation -------------------------------------------------------------------
    def validate_input(self, idx: int, x) -> None:
        """Framework-specific checks of one checked input (raise as the reference does)."""

    def validate_outputs(self, outputs: Sequence) -> None:
        """Framework-specific checks of the differentiable outputs."""

    @contextmanager
    def preserve_state(self, args: tuple) -> Iterator[None]:
        """Restore what the caller owns (RNG states, accumulated grads) on exit."""
        yield

    # -- evaluation -------------------------------------------------------------------
    def as_tuple(self, out) -> tuple:
        if isinstance(out, tuple):
            return out
        if isinstance(out, list):
            return tuple(out)
        return (out,)

    def trace(self, fn: Callable, args: tuple, checked: Sequence[int]) -> Trace:
        """Evaluate ``fn(*args)`` ready for reverse mode with respect to ``args[checked]``."""
        raise NotImplementedError

    def perturber(self, args: tuple, position: int):
        """A context manager yielding a :class:`Perturber` for ``args[position]``."""
        raise NotImplementedError

    def jvp(self, fn: Callable, args: tuple, checked: Sequence[int], tangents: Sequence) -> list:
        """Forward mode: evaluate ``fn`` with ``tangents`` on ``args[checked]``.

        A tangent of ``None`` passes the input as a plain array (an undefined tangent).
        Returns ``(primal, tangent_or_None)`` for each floating or complex output.
        """
        raise NotImplementedError

    def jvp_batched(self, fn: Callable, args: tuple, position: int, stacked_tangents) -> tuple:
        """Many JVPs with respect to ``args[position]`` at once (leading batch dimension)."""
        raise NotImplementedError

    def vjp_with_undefined_outputs(self, fn: Callable, args: tuple, checked, undefined) -> list:
        """Evaluate ``fn`` afresh and back-propagate zero cotangents, with the output
        gradients at the positions in ``undefined`` (indices among the differentiable
        outputs) marked undefined rather than zero."""
        raise NotImplementedError

    # -- array algebra ----------------------------------------------------------------
    def xp(self, x):
        import array_api_compat

        return array_api_compat.array_namespace(x)

    def flatten(self, x):
        return self.xp(x).reshape(x, (-1,))

    def reshape(self, x, shape):
        return self.xp(x).reshape(x, tuple(shape))

    def clone(self, x):
        return self.xp(x).asarray(x, copy=True)

    def real(self, x):
        return self.xp(x).real(x)

    def imag(self, x):
        return self.xp(x).imag(x)

    def conj(self, x):
        return self.xp(x).conj(x)

    def stack(self, arrays: Sequence, axis: int = 0):
        return self.xp(arrays[0]).stack(list(arrays), axis=axis)

    def zeros_like(self, x):
        return self.xp(x).zeros_like(x)

    def zeros(self, shape, like, dtype=None):
        xp = self.xp(like)
        return xp.zeros(tuple(shape), dtype=dtype or like.dtype, device=getattr(like, "device", None))

    def astype(self, x, dtype):
        return self.xp(x).astype(x, dtype)

    def transpose(self, x):
        return self.xp(x).permute_dims(x, (1, 0))

    def itemsize(self, x) -> int:
        """Bytes per element of ``x``."""
        import numpy as np

        return int(np.dtype(str(x.dtype)).itemsize)

    def machine_epsilon(self, x) -> float:
        """The spacing of the input's (real) floating type at 1.0."""
        import numpy as np

        return float(np.finfo(np.dtype(str(x.dtype))).eps)

    def real_dtype_of(self, x):
        raise NotImplementedError

    def one_hot(self, like, flat: int):
        """An array shaped like ``like`` with a one at flat position ``flat``."""
        raise NotImplementedError

    def sum_as_float(self, x) -> float:
        return float(self.xp(x).sum(x))

    def dot(self, u, v):
        return self.xp(u).sum(u * v)

    def max_abs(self, x):
        xp = self.xp(x)
        return xp.max(xp.abs(x))

    def all_zero(self, x) -> bool:
        return bool(self.xp(x).all(x == 0))

    def count_nonzero(self, x) -> int:
        xp = self.xp(x)
        return int(xp.sum(xp.astype(x != 0, xp.int64)))

    def allclose(self, a, b, rtol: float, atol: float) -> bool:
        """``|a - b| <= atol + rtol * |b|`` everywhere, after type promotion; NaN fails."""
        raise NotImplementedError

    def all_finite(self, x) -> bool:
        xp = self.xp(x)
        return bool(xp.all(xp.isfinite(x)))

    def device_name(self, x) -> str:
        return str(getattr(x, "device", "cpu"))

    def same_device(self, a, b) -> bool:
        return getattr(a, "device", None) == getattr(b, "device", None)

    def to_device_of(self, x, like):
        return x

    def snapshot(self, x):
        """A copy of ``x`` to tell later whether ``x`` was modified (see :meth:`unchanged`)."""
        return self.clone(x)

    def unchanged(self, x, snapshot) -> bool:
        xp = self.xp(x)
        same = (x == snapshot) | (xp.isnan(x) & xp.isnan(snapshot))
        return bool(xp.all(same))

    def restore(self, x, snapshot) -> None:
        """Write ``snapshot`` back into ``x`` (immutable arrays: nothing to do)."""

    def to_numpy(self, x):
        import numpy as np

        return np.asarray(x)

    def array_like(self, values, like):
        """The NumPy array ``values`` as an array of ``like``'s framework, on its device."""
        import array_api_compat

        return self.xp(like).asarray(values, device=array_api_compat.device(like))

    # -- randomness -------------------------------------------------------------------
    def generator(self, like, seed: int):
        """A private random generator on ``like``'s device (the global state is untouched)."""
        raise NotImplementedError

    def uniform_unit_vector(self, like, generator, real: bool):
        """A flat random vector of ``like``'s size with non-negative entries and norm one,
        in ``like``'s dtype (its real counterpart if ``real``)."""
        raise NotImplementedError

    def normal_like(self, like, generator):
        """Standard normal samples shaped like ``like``, from ``generator``."""
        raise NotImplementedError
