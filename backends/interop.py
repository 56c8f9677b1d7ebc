"""The verbs with which code outside the backends (``agcheck.crosscheck`` and the command
line) makes a framework's arrays, computes in its precision and takes its second
derivatives, without importing the framework itself: part of :class:`~agcheck.backends.base.Backend`."""
from __future__ import annotations

from typing import Callable, Sequence

__all__ = ["Interop"]


class Interop:
    """``from_numpy`` (required), ``precision`` (the core's, defaulted), and the optional
    ``vjp_of_vjp``, ``framework_version`` and ``compiled``."""

    # The verbs with which code outside the backends (``agcheck.crosscheck`` and the
    # command line) makes a framework's arrays, computes in its precision and takes its
    # second derivatives, without importing the framework itself.

    def from_numpy(self, values, *, checked: bool = False, like=None):
        """An array of this backend's framework with the values of a NumPy array.

        Parameters
        ----------
        values : numpy.ndarray
            The values. The result never shares memory with them, so the caller's array
            is not written to by anything done to the result.
        checked : bool, optional
            Mark the result for differentiation where the framework marks arrays for it
            (torch: ``requires_grad``); frameworks that choose the inputs to
            differentiate otherwise ignore it. Only floating point and complex values
            can be checked.
        like : array, optional
            An array of this backend's framework; the result takes its dtype (``values``
            are cast as NumPy casts them) and its device. Without it the result has
            ``values``' dtype, as the framework stores it (see :meth:`precision`), on the
            default device.

        Returns
        -------
        array
            The new array.

        Raises
        ------
        TypeError
            The backend does not know how to make its arrays from NumPy arrays.
        """
        raise TypeError(
            f"the {self.name!r} backend cannot make its arrays from NumPy arrays; give it a "
            "from_numpy(values, *, checked=False, like=None) method"
        )

    def precision(self, double: bool):
        """A context manager in which the framework computes in the precision of the data.

        Parameters
        ----------
        double : bool
            ``True`` when the data are 64-bit (float64, complex128, int64). A framework
            that computes in 32 bits unless told otherwise (JAX, whose
            ``jax_enable_x64`` is off by default) switches 64-bit mode on for the body of
            the ``with`` block; ``False`` leaves the framework's setting as it is.

        Returns
        -------
        context manager
            On exit, also when the body raises, the caller's setting is restored exactly.
            Frameworks that keep the precision of their data (torch, NumPy) do nothing.
        """
        import contextlib

        return contextlib.nullcontext()

    def vjp_of_vjp(self, fn: Callable, args: tuple, checked: Sequence[int], output: int,
                   cotangent, gradient_cotangents: Sequence[Sequence]) -> dict:
        """Second derivatives through the framework's own autodiff, in torch's convention.

        With ``g_j = d<w, f_k>/dx_j`` the reverse-mode derivative (VJP) of output ``k =
        output`` of ``fn(*args)`` with the cotangent ``w`` with respect to the checked
        input ``x_j = args[checked[j]]``, this computes, for every cotangent ``c`` of
        ``gradient_cotangents[j1]``, the VJP ``d<c, g_j1>/dx_j2`` with respect to every
        checked input ``x_j2``. Complex derivatives follow torch's convention at both
        levels (``torch_vjp(v) == conj(jax_vjp(conj(v)))``).

        Parameters
        ----------
        fn : callable
            The function, called as ``fn(*args)``; it returns an array or a tuple.
        args : tuple
            Its arguments, arrays of this framework (made with :meth:`from_numpy`, with
            ``checked=True`` at the positions ``checked``) and pass-through values.
        checked : sequence of int
            The positions in ``args`` of the inputs to differentiate with respect to.
        output : int
            The position of the output among ``fn``'s outputs.
        cotangent : numpy.ndarray
            ``w``, shaped like the output; cast to the output's dtype.
        gradient_cotangents : sequence of sequences of numpy.ndarray
            Per checked input ``j1``, the cotangents ``c`` of its gradient ``g_j1``
            (each shaped like ``x_j1``; cast to the gradient's dtype).

        Returns
        -------
        dict
            ``{(j1, j2): numpy.ndarray}`` of shape ``(len(gradient_cotangents[j1]),
            x_j2.size)``: one flattened second derivative per cotangent ``c``; zeros
            where a derivative is undefined (an unused input, an output that does not
            depend on the inputs).

        Raises
        ------
        NotImplementedError
            The backend has no autodiff of its own (NumPy: only the first-order vjp/jvp
            the caller supplies). Whether a backend implements this verb tells callers
            whether second derivatives can be compared on it.
        """
        raise NotImplementedError(f"the {self.name!r} backend computes no second derivatives")

    def framework_version(self) -> str:
        """The version of the framework behind this backend (for reports)."""
        import importlib

        try:
            module = importlib.import_module(self.name)
        except ImportError:
            return "unknown"
        return str(getattr(module, "__version__", "unknown"))

    def compiled(self, fn: Callable) -> Callable:
        """``fn`` as code of this framework usually runs: compiled (JAX: ``jax.jit``)
        where the framework compiles, else ``fn`` itself. Derivatives are the same."""
        return fn
