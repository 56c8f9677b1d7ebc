"""The backend contract: what agcheck's core asks of an array framework.

The core (``agcheck.core``, ``agcheck.checks``, ``agcheck.engine``, ``agcheck.gradcheck``)
never imports a framework: everything framework-specific goes through a :class:`Backend`.

The contract has three parts:

* **A required core of twenty verbs** (:data:`CORE_METHODS`). Fifteen a backend writes
  itself (:data:`REQUIRED_METHODS`): inspection (``owns``, ``is_checked``, ``is_complex``,
  ``is_floating_or_complex``, ``is_double_precision``, ``is_differentiable_output``,
  ``is_bool``), ``trace`` (evaluation with its VJP, :class:`Trace`), ``perturber`` (one input
  moved and restored exactly, :class:`Perturber`), ``jvp``, ``allclose``, random vectors
  (``generator``, ``uniform_unit_vector``, ``normal_like``) and ``from_numpy``. Five have
  defaults written against the array API (:data:`DEFAULTED_METHODS`): ``xp``, ``to_numpy``,
  ``precision``, ``one_hot`` and ``as_int``. :func:`missing_verbs` names what a class lacks,
  and :func:`agcheck.backends.registry.get_backend` refuses such a class with that list.
* **Algebra through the arrays' own namespace.** ``xp = be.xp(x)`` is the array-API
  namespace the core computes with on ``x`` (``array_api_compat``'s for torch, JAX and
  NumPy, resolved once per array type); call sites write ``xp.reshape(x, shape)``. Python's
  arithmetic operators (``+ - * /``) are used on arrays directly; the core relies on them
  promoting as NumPy does (a real array times ``1j`` is complex): a framework whose
  operators do not (TensorFlow) hands the core NumPy arrays for everything it computes
  and keeps its own arrays for what ``fn`` receives and returns; its :meth:`Backend.is_array`
  then accepts both. Framework semantics that are not plain algebra (sparse layouts,
  ``densify``, complex parts of traced values, digests, snapshots) stay backend methods.
* **Optional parts**, each named by a :class:`Capability` a backend lists in
  :attr:`Backend.capabilities`: forward mode, the checks of batched gradients, undefined
  gradients, second order, sparse layouts, and one protocol for the engine's faster paths,
  :class:`~agcheck.backends.batched_forms.BatchedForms` (batched evaluations, batched JVPs,
  stacked evaluations). A backend without it gets the same verdicts from the loops.

The names (:class:`Capability`, the verb lists, the two errors) are written in
:mod:`~agcheck.backends.contract_names`, :class:`Trace` and :class:`Perturber` in
:mod:`~agcheck.backends.trace`; this module re-exports them.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

from agcheck.backends.contract_names import (BATCHED_FORMS, CAPABILITY_METHODS, CORE_METHODS, DEFAULTED_METHODS,
                                             REQUIRED_METHODS, BackendUnavailableError, Capability, UnsupportedError)
from agcheck.backends.interop import Interop
from agcheck.backends.parts import InputPart, OutputPart
from agcheck.backends.trace import Perturber, Trace

__all__ = ["Backend", "Trace", "Perturber", "BackendUnavailableError", "Capability",
           "UnsupportedError", "OutputPart", "InputPart", "REQUIRED_METHODS", "DEFAULTED_METHODS", "CORE_METHODS",
           "CAPABILITY_METHODS", "BATCHED_FORMS", "missing_verbs", "require_contract", "summary_edges"]


def missing_verbs(cls) -> list[str]:
    """The verbs of :data:`REQUIRED_METHODS` the backend class ``cls`` does not write."""
    return [m for m in REQUIRED_METHODS if getattr(cls, m, None) is getattr(Backend, m)]


_COMPLETE: set = set()


def require_contract(cls) -> None:
    """Raise ``TypeError`` naming every required verb the backend class ``cls`` lacks."""
    if cls in _COMPLETE:
        return
    missing = missing_verbs(cls)
    if missing:
        raise TypeError(
            f"the backend {cls.__name__} does not implement the required verbs {', '.join(missing)} "
            "of agcheck's backend contract (agcheck.backends.base.REQUIRED_METHODS)"
        )
    _COMPLETE.add(cls)


#: the array-API namespace of each array type met (:meth:`Backend.xp`)
_NAMESPACES: dict = {}


class Backend(Interop):
    """What the core asks of an array framework: the backend contract.

    A backend writes the verbs of :data:`REQUIRED_METHODS` (inspection, ``trace``,
    ``perturber``, ``jvp``, ``allclose``, random vectors, ``from_numpy``); the defaults of
    the rest of the core (:data:`DEFAULTED_METHODS`) and of the other methods here are
    written against the array API and may be overridden where the framework differs. It
    lists in :attr:`capabilities` the optional parts it implements (see :class:`Capability`);
    the core asks :meth:`supports` before using one. ``tests/test_backend_contract.py`` runs
    the whole contract over every registered backend.
    """

    name: str = "abstract"
    #: the optional parts of the contract this backend implements (:class:`Capability` names)
    capabilities: frozenset = frozenset()
    #: whether the framework compiles a program for every new shape (JAX): the batched
    #: engine then runs only on checks whose loop makes many more calls, and takes its
    #: batches as large as the memory budget allows, so that fewer sizes compile
    #: (:mod:`agcheck.engine.cost`)
    whole_batches: bool = False
    #: whether a function written once against the array API (``array_api_compat``) runs
    #: on this backend's arrays (crosscheck needs ports for a backend where it does not)
    runs_array_api_code: bool = True
    #: whether this backend implements the optional protocol of the engine's faster paths
    #: (set by :class:`~agcheck.backends.batched_forms.BatchedForms`)
    batched_forms: bool = False

    def xp(self, x):
        """The array-API namespace the core computes with on ``x`` (``array_api_compat``'s,
        resolved once per array type). A backend that computes its bookkeeping elsewhere
        (on the host, for a framework that compiles every new shape) returns that namespace."""
        namespace = _NAMESPACES.get(type(x))
        if namespace is None:
            import array_api_compat

            namespace = _NAMESPACES[type(x)] = array_api_compat.array_namespace(x)
        return namespace

    def array_namespace(self, *arrays):
        """The array-API namespace for *user* code running on these arrays (the main job's
        catalog, crosscheck): the framework's own differentiable operations
        (``array_api_compat``'s by default; TensorFlow's and MLX's from
        ``tensorflow_xp``/``mlx_xp``). The core's own algebra goes through :meth:`xp`."""
        import array_api_compat

        return array_api_compat.array_namespace(*arrays)

    def supports(self, capability: str) -> bool:
        """Whether this backend implements the optional part ``capability`` (the engine's
        faster paths, :data:`BATCHED_FORMS`, only where :attr:`batched_forms` is set)."""
        if capability in BATCHED_FORMS and not self.batched_forms:
            return False
        return capability in self.capabilities

    def refusal(self, capability: str, keyword: str) -> Exception:
        """The error for a check that needs ``capability``, asked for by the keyword
        ``keyword``, on a backend that lacks it (raised before any work)."""
        return ValueError(
            f"the {self.name!r} backend cannot run what {keyword} asks for: it does not support {capability!r}"
        )

    # -- inspection -------------------------------------------------------------------
    def owns(self, x) -> bool:
        """Is ``x`` an array of this backend's framework?"""
        raise NotImplementedError

    def is_array(self, x) -> bool:
        """Is ``x`` an array the core may compute with: this framework's, or (for a backend
        that hands the core NumPy arrays, see the module's docstring) a NumPy array?"""
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
        """Does the output ``x`` carry derivatives (torch: ``requires_grad``)?"""
        raise NotImplementedError

    def is_bool(self, x) -> bool:
        """Is ``x`` an array of booleans?"""
        raise NotImplementedError

    def as_int(self, x):
        """The boolean array ``x`` as a small integer array of the same framework (so
        that finite differences of boolean outputs can be taken)."""
        xp = self.xp(x)
        return xp.astype(x, xp.int8)

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
            raise TypeError(f"unexpected keyword argument(s) {', '.join(map(repr, sorted(options)))}: not a keyword "
                            f"of gradcheck, and the {self.name!r} backend takes none")
        return self

    def adopt_error(self, error):
        """Make ``error`` (an :class:`agcheck.GradcheckError` about to leave the public
        entry) also an instance of the framework's own gradcheck error type, so that the
        framework's handlers catch it; message, report and traceback stay. The default
        leaves it as it is."""
        return error

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

    def jvp_elements(self, fn: Callable, args: tuple, checked: Sequence[int], wanted: Sequence,
                     receive: Callable[[int, list], None]) -> None:
        """Forward-mode evaluations of ``fn``, one per element of each ``(i, elements)`` of
        ``wanted`` (flat indices of ``args[checked[i]]``), input by input: a one-hot
        tangent at that element, zero tangents on the other checked inputs; ``receive(i,
        result)`` is called with what :meth:`jvp` returns, in order. A backend may set the
        evaluations up once for all of them (by default: one :meth:`jvp` each)."""
        zero_tangents = [self.xp(args[p]).zeros_like(args[p]) for p in checked]
        for i, elements in wanted:
            x = args[checked[i]]
            for flat in elements:
                tangents = list(zero_tangents)
                tangents[i] = self.one_hot(x, flat)
                receive(i, self.jvp(fn, args, checked, tangents))

    def jvp_each(self, fn: Callable, args: tuple, checked: Sequence[int], tangents: Sequence,
                 receive: Callable[[list], None]) -> None:
        """Forward-mode evaluations of ``fn``, one per checked input: ``tangents[i]`` on
        ``args[checked[i]]`` and zero tangents on the other checked inputs; ``receive`` is
        called with what :meth:`jvp` returns, input by input, in order. A backend may set
        the evaluations up once for all of them (by default: one :meth:`jvp` each)."""
        zero_tangents = [self.xp(args[p]).zeros_like(args[p]) for p in checked]
        for i, t in enumerate(tangents):
            moved = list(zero_tangents)
            moved[i] = t
            receive(self.jvp(fn, args, checked, moved))

    def jvp_wrt(self, fn: Callable, args: tuple, position: int, tangent) -> tuple:
        """Output tangents of ``fn`` with ``tangent`` on ``args[position]`` alone (the other
        inputs held constant): one array per output, zeros where a tangent is undefined.
        Capability :attr:`Capability.FORWARD`."""
        raise UnsupportedError("jvp_wrt")

    def jvp_batched(self, fn: Callable, args: tuple, position: int, stacked_tangents) -> tuple:
        """Many :meth:`jvp_wrt` at once (``stacked_tangents`` has a leading batch
        dimension). Capability :attr:`Capability.BATCHED_FORWARD`."""
        raise UnsupportedError("jvp_batched")

    def vjp_with_undefined_outputs(self, fn: Callable, args: tuple, checked, undefined,
                                   trace: Trace | None = None) -> list:
        """Back-propagate zero cotangents from the outputs of ``fn`` at ``args``, with the
        output gradients at the positions in ``undefined`` (indices among the
        differentiable outputs, or ``"all"``) marked undefined rather than zero.
        ``trace``, when given, is an evaluation of ``fn`` at ``args`` whose outputs are
        differentiated (no new call of ``fn``); otherwise ``fn`` is evaluated afresh.
        Capability :attr:`Capability.UNDEFINED_GRAD`."""
        raise UnsupportedError("vjp_with_undefined_outputs")

    # -- second order (optional: gradgradcheck) -----------------------------------------
    def random_cotangent(self, like, generator, noncontiguous: bool):
        """Uniform values in [-1, 1) shaped like ``like``, marked for differentiation
        (non-contiguous in memory if asked and the framework has strides).
        Capability :attr:`Capability.SECOND_ORDER`."""
        raise UnsupportedError("random_cotangent")

    def differentiable_vjp(self, fn: Callable, n_inputs: int, input_positions: Sequence[int],
                           cotangent_positions: Sequence[int], evaluated: tuple | None = None,
                           few_calls: bool = False, evaluated_seconds: float | None = None) -> Callable:
        """The VJP of ``fn`` as a function of ``(*inputs, *cotangents)`` that can itself
        be differentiated (returns the gradients of the inputs at ``input_positions``).
        ``evaluated``: ``(inputs, outputs)`` of a call of ``fn`` the caller already made,
        which a backend may reuse instead of calling ``fn`` again at the same inputs;
        ``evaluated_seconds``, the calling thread's CPU seconds that call took.
        ``few_calls``: the caller will make only a few calls (fast mode), so a backend that
        reuses forwards decides from its first forward whether that pays.
        Capability :attr:`Capability.SECOND_ORDER`."""
        raise UnsupportedError("differentiable_vjp")

    # -- layouts (optional: sparse arrays) ------------------------------------------------
    def to_dense(self, x):
        """``x`` as a dense array (dense arrays are returned as they are)."""
        return x

    def gradient_layout_problem(self, g, x) -> str | None:
        """Why the gradient ``g`` has the wrong layout for the input ``x`` (torch's message),
        or ``None``."""
        return None

    def part_as_input(self, x, part: str):
        """The real or imaginary part (``part``) of the complex ``x`` as a new real input
        that takes part in the check as ``x`` did (forward mode of complex inputs).
        Capability :attr:`Capability.FORWARD`."""
        raise UnsupportedError("part_as_input")

    # -- complex parts (of values ``fn`` may be traced through) ----------------------------
    def real(self, x):
        return self.xp(x).real(x)

    def imag(self, x):
        return self.xp(x).imag(x)

    def plus_imaginary(self, a, b):
        """``a + 1j * b`` for real or complex arrays ``a`` and ``b`` (differentiable: ``fn``'s
        complex arguments are rebuilt with it, :class:`InputPart`)."""
        return a + b * 1j

    # -- arrays made, rows kept and combined --------------------------------------------
    def zeros(self, shape, like, dtype=None):
        """Zeros of ``shape`` and ``dtype`` (by default ``like``'s), placed as ``like`` is."""
        import array_api_compat

        xp = self.xp(like)
        return xp.zeros(tuple(shape), dtype=dtype or like.dtype, device=array_api_compat.device(like))

    def array_like(self, values, like):
        """The NumPy array ``values`` as an array of ``like``'s framework, on its device."""
        import array_api_compat

        return self.xp(like).asarray(values, device=array_api_compat.device(like))

    def to_device_of(self, x, like):
        return x

    def row_block(self, n_rows: int, n_cols: int, like, dtype):
        """An uninitialised ``(n_rows, n_cols)`` array of ``dtype`` on ``like``'s device
        that :meth:`write_rows` fills in place, or ``None`` where arrays are immutable (the
        rows are then stacked; see :mod:`agcheck.core.row_block`)."""
        return None

    def owned_rows(self, rows):
        """``rows`` itself, to be kept as a whole block instead of a copy, where it is a
        compact array that holds its memory alone (no larger array kept alive through
        it) and may be written in place; else ``None``."""
        return None

    def write_rows(self, block, start: int, rows: Sequence) -> None:
        """Copy the flat ``rows`` into ``block[start:start + len(rows)]`` (converted to the
        block's dtype)."""
        block[start:start + len(rows)] = self.xp(block).stack(list(rows), axis=0)

    def combine(self, stencil, values: Sequence, eps: float):
        """``stencil.combine(values, eps)``: the finite-difference estimate from ``fn``'s
        values at the stencil's points (a backend may compute it elsewhere: JAX on the
        host, where no new shape compiles)."""
        return stencil.combine(list(values), eps)

    # -- the checks' products and comparisons (JAX and MLX: on the host, no device op);
    #    transpose for checks/jacobian.py, which writes no xp yet ---------------------------
    def transpose(self, x):
        return self.xp(x).permute_dims(x, (1, 0))

    def dot(self, u, v):
        return self.xp(u).sum(u * v)

    def max_abs_difference(self, a, b):
        xp = self.xp(a)
        return xp.max(xp.abs(a - b))

    def all_finite(self, x) -> bool:
        xp = self.xp(x)
        return bool(xp.all(xp.isfinite(x)))

    # -- inspection of dtypes and devices (for plans and messages) -------------------------
    def itemsize(self, x) -> int:
        """Bytes per element of ``x``."""
        import numpy as np

        return int(np.dtype(str(x.dtype)).itemsize)

    def machine_epsilon(self, x) -> float:
        """The spacing of the input's (real) floating type at 1.0."""
        import numpy as np

        return float(np.finfo(np.dtype(str(x.dtype))).eps)

    def summarized_edge_items(self, numel: int) -> int | None:
        """How many leading and trailing items per dimension a message shows of an array
        of ``numel`` elements when the framework's printing summarises it, or ``None``
        when it prints every element (the default, which is never wrong); see
        :func:`summary_edges`."""
        return None

    def device_name(self, x) -> str:
        return str(getattr(x, "device", "cpu"))

    def same_device(self, a, b) -> bool:
        return getattr(a, "device", None) == getattr(b, "device", None)

    # -- comparison, snapshots, conversion --------------------------------------------
    def one_hot(self, like, flat: int):
        """An array shaped like ``like`` with a one at flat position ``flat``."""
        import array_api_compat

        xp = self.xp(like)
        hot = xp.arange(self.numel(like), device=array_api_compat.device(like)) == flat
        return xp.reshape(xp.astype(hot, like.dtype), tuple(like.shape))

    def allclose(self, a, b, rtol: float, atol: float) -> bool:
        """``|a - b| <= atol + rtol * |b|`` everywhere, after type promotion; NaN fails."""
        raise NotImplementedError

    def content_digest(self, x):
        """A hashable digest of ``x``'s shape, dtype and values (equal digests: equal
        arrays, bit for bit), or ``None`` where it cannot be had cheaply."""
        return None

    def modification_count(self, x) -> int | None:
        """A number that moves whenever ``x`` is written in place (torch's version
        counter), read around each call of ``fn`` to name the call that changed an input;
        ``None`` where the framework keeps none (the check still finds the change)."""
        return None

    def snapshot(self, x):
        """A copy of ``x`` to tell later whether ``x`` was modified (see :meth:`unchanged`)."""
        return self.xp(x).asarray(x, copy=True)

    def unchanged(self, x, snapshot) -> bool:
        xp = self.xp(x)
        same = (x == snapshot) | (xp.isnan(x) & xp.isnan(snapshot))
        return bool(xp.all(same))

    def restore(self, x, snapshot) -> None:
        """Write ``snapshot`` back into ``x`` (immutable arrays: nothing to do)."""

    def to_numpy(self, x):
        import numpy as np

        return np.asarray(x)

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


def summary_edges(options: dict, numel: int) -> int | None:
    """:meth:`Backend.summarized_edge_items` from print options holding ``threshold`` and
    ``edgeitems`` (torch's and NumPy's both summarise an array above the threshold to its
    edges, and format it from those alone)."""
    threshold, edge = options.get("threshold"), options.get("edgeitems")
    if not isinstance(edge, int) or threshold is None or numel <= threshold:
        return None
    return edge
