"""A catalog entry (:class:`Entry`: the function or its ports, where it runs and why not
elsewhere) and its arguments (:class:`Arg`: shape, dtype, how the values are drawn)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

__all__ = ["Arg", "Entry", "KINDS", "MLX_FLOAT32_INSIDE", "MLX_NO_COMPLEX128", "MLX_NO_DERIVATIVE"]

#: the kinds of catalog entries, in display order
KINDS = ("elementwise", "reduction", "linalg", "composite", "complex", "custom")

#: why an entry is not checked on MLX (``Entry.not_on``), measured with mlx 0.32.4 on the CPU
MLX_FLOAT32_INSIDE = ("MLX computes float64 sin, cos and exp (so also its sigmoid and logaddexp) at float32 "
                      "accuracy (ml-explore/mlx#3047), too coarse for float64 finite differences")
MLX_NO_COMPLEX128 = "MLX has no complex128, and complex64 is too coarse for float64 finite differences"
MLX_NO_DERIVATIVE = ("MLX does not differentiate mx.linalg.inv, solve, cholesky, eigvalsh and svd "
                     "(no VJP)")
#: entries with a complex128 argument cannot run on these backends at that precision
_NO_COMPLEX128 = {"mlx": MLX_NO_COMPLEX128}


# -- inputs ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Arg:
    """One positional argument: its shape, dtype and how its values are drawn.

    ``sample``:

    - ``"normal"``: standard normal entries (real and imaginary parts for complex);
    - ``"uniform"``: uniform in ``[low, high)``;
    - ``"positive"``: uniform in ``[0.5, 2)``;
    - ``"nonzero"``: magnitude uniform in ``[0.5, 1.5)``, random sign;
    - ``"distinct"``: a shuffled grid with spacing 0.5 plus noise below 0.1, so the
      entries are at least 0.3 apart (no ties for ``max``);
    - ``"well_conditioned"``: ``2 I + 0.3 N`` for square matrices (away from singular);
    - ``"annulus"``: complex entries of magnitude in ``[0.5, 2)`` (away from ``|z| = 0``).
    """

    shape: tuple
    dtype: str = "float64"
    sample: str = "normal"
    low: float = 0.0
    high: float = 1.0

    def describe(self) -> str:
        shape = "x".join(map(str, self.shape)) or "scalar"
        extra = "" if self.sample == "normal" else f" {self.sample}"
        if self.sample == "uniform":
            extra = f" in [{self.low:g}, {self.high:g})"
        return f"{shape} {self.dtype}{extra}"

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        shape, complex_ = self.shape, self.dtype.startswith("complex")
        s = self.sample
        if s == "normal":
            a = rng.standard_normal(shape)
            if complex_:
                a = a + 1j * rng.standard_normal(shape)
        elif s in ("uniform", "positive"):
            low, high = (0.5, 2.0) if s == "positive" else (self.low, self.high)
            a = rng.uniform(low, high, shape)
        elif s == "nonzero":
            a = rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
        elif s == "distinct":
            n = math.prod(shape)
            a = (rng.permutation(n) * 0.5 - 0.25 * n + rng.uniform(-0.1, 0.1, n)).reshape(shape)
        elif s == "well_conditioned":
            n = shape[-1]
            a = 2.0 * np.eye(n) + 0.3 * rng.standard_normal(shape)
        elif s == "annulus":
            a = rng.uniform(0.5, 2.0, shape) * np.exp(1j * rng.uniform(0, 2 * np.pi, shape))
        else:
            raise ValueError(f"unknown sample {s!r}")
        if np.iscomplexobj(a) and not complex_:
            raise ValueError(f"sample {s!r} gives complex values, dtype is {self.dtype}")
        return np.ascontiguousarray(np.asarray(a, dtype=self.dtype))


# -- entries --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    """One catalog function (fields below).

    name : str
        Unique, and not a kind name (``--only`` takes both).
    kinds : tuple of str
        Some of :data:`KINDS`.
    args : tuple of Arg
        The positional arguments; :meth:`inputs` draws them from ``seed``.
    fn : callable
        Written against the array API (for ``custom`` entries: the plain forward, run by NumPy).
    ports : callable, optional
        ``ports(backend) -> callable or None``, for framework-specific (hand-written) derivatives.
    vjp, jvp : callable, optional
        Hand-written derivatives for the NumPy backend (torch's complex convention,
        docs/numpy.md); the NumPy backend checks only entries that have them.
    reverse_only : frozenset of str
        Backends checked in reverse mode only (a ``jax.custom_vjp`` has no forward mode).
    not_on : tuple of (str, str)
        ``(backend, reason)``: backends that cannot check ``fn`` as written (complex128
        entries are also excluded on MLX, see :meth:`exclusion`).
    """

    name: str
    kinds: tuple
    args: tuple
    fn: Callable
    seed: int = 0
    description: str = ""
    ports: Callable | None = None
    vjp: Callable | None = None
    jvp: Callable | None = None
    reverse_only: frozenset = field(default_factory=frozenset)
    not_on: tuple = ()

    def inputs(self) -> tuple:
        """The inputs as NumPy arrays (fresh copies, the same on every call)."""
        rng = np.random.default_rng(self.seed)
        return tuple(a.draw(rng) for a in self.args)

    def describe_inputs(self) -> str:
        return ", ".join(a.describe() for a in self.args)

    def function(self, backend: str) -> Callable | None:
        """The implementation to run on ``backend`` (``None`` if the entry has none)."""
        if backend == "numpy":
            return self.fn if (self.vjp is not None or self.jvp is not None) else None
        if self.ports is not None:
            return self.ports(backend)
        return self.fn

    def exclusion(self, backend: str) -> str | None:
        """Why ``backend`` cannot check this entry though it has an implementation there, or ``None``."""
        for name, reason in self.not_on:
            if name == backend:
                return reason
        if backend in _NO_COMPLEX128 and any(a.dtype == "complex128" for a in self.args):
            return _NO_COMPLEX128[backend]
        return None

    def supports(self, backend: str) -> bool:
        if backend == "numpy":
            return self.vjp is not None or self.jvp is not None
        if self.exclusion(backend) is not None:
            return False
        if self.ports is not None:
            return self.ports(backend) is not None
        return backend in ("torch", "jax", "tensorflow", "mlx")

    def forward_ad(self, backend: str) -> bool:
        """Is forward-mode AD checked on ``backend``?"""
        if backend in self.reverse_only:
            return False
        if backend == "numpy":
            return self.jvp is not None
        return True

    def backend_options(self, backend: str) -> dict:
        if backend == "numpy":
            return {"vjp": self.vjp, "jvp": self.jvp}
        return {}

