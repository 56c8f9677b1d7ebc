"""The NumPy backend's derivatives: the user's ``vjp`` and ``jvp``, carried through the
pieces the core builds from ``fn`` (the real or imaginary parts of complex outputs and
inputs, :class:`~agcheck.backends.base.OutputPart` and :class:`~agcheck.backends.base.InputPart`)
in torch's convention."""
from __future__ import annotations

from typing import Callable, Sequence

import array_api_compat
import numpy as np

from agcheck.backends.base import InputPart, OutputPart
from agcheck.errors import GradcheckError

__all__ = ["UserDerivatives", "UserFunction", "MissingDerivativeError", "CONVENTIONS", "resolve",
           "reverse_missing", "forward_missing"]

CONVENTIONS = ("torch", "jax")


def _read_only(args) -> tuple:
    """``args`` for a derivative the user wrote, NumPy arrays as read-only views: a VJP or
    JVP that writes into its inputs (the caller's arrays) fails at that write, where it
    would otherwise change the caller's data and the check's later evaluations."""
    def view(a):
        if type(a) is not np.ndarray or not a.flags.writeable:
            return a
        v = a.view()
        v.flags.writeable = False
        return v

    return tuple(view(a) for a in args)


class MissingDerivativeError(ValueError):
    """A check needs a derivative (vjp or jvp) that was not supplied."""


def reverse_missing() -> MissingDerivativeError:
    return MissingDerivativeError(
        "backend='numpy' needs vjp=... for reverse-mode checks (or pass "
        "check_backward_ad=False, check_forward_ad=True with jvp=...)"
    )


def forward_missing() -> MissingDerivativeError:
    return MissingDerivativeError(
        "backend='numpy' needs jvp=... for forward-mode checks (check_forward_ad=True); "
        "pass jvp=..., or check_forward_ad=False"
    )


# -- the function under check and the pieces the core builds from it ---------------------


class UserFunction:
    """``fn`` together with its hand-written derivatives (what :meth:`prepare` returns)."""

    def __init__(self, fn: Callable, vjp: Callable | None, jvp: Callable | None, convention: str):
        self.fn, self.vjp, self.jvp, self.convention = fn, vjp, jvp, convention
        self.__name__ = getattr(fn, "__name__", "fn")
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, *args):
        return self.fn(*args)

    def __repr__(self) -> str:
        return f"<agcheck numpy function {self.__name__} (vjp={self.vjp is not None}, jvp={self.jvp is not None})>"


def resolve(f):
    """What ``f`` is, relative to the function the user supplied derivatives for.

    Returns ``("base", user_function)``, ``("outputs", inner, part)`` (the real or imaginary
    parts of ``inner``'s complex outputs, built by :func:`agcheck.core.wirtinger.output_part`)
    or ``("inputs", inner, positions, originals, part)`` (``inner`` as a function of the
    real or imaginary parts of its complex inputs, :func:`agcheck.core.wirtinger.input_part`).
    """
    if isinstance(f, UserFunction):
        return ("base", f)
    if isinstance(f, OutputPart):
        return ("outputs", f.fn, f.part)
    if isinstance(f, InputPart):
        return ("inputs", f.fn, f.positions, f.originals, f.part)
    raise TypeError(
        "the numpy backend differentiates only the function passed to agcheck.gradcheck "
        f"(its derivatives come from vjp=/jvp=); got {f!r}"
    )



class UserDerivatives:
    """Reverse and forward mode from the user's derivatives, for the NumPy backend (mixed
    into it: it uses the backend's inspection and ``outputs_of``)."""

    def vjp_of(self, fn, args: tuple, checked: Sequence[int], cotangents: list) -> list:
        """Reverse mode of ``fn`` (the user function or a piece of it) in torch's convention:
        one gradient (or ``None``) per checked input."""
        kind, inner, *info = resolve(fn)
        if kind == "base":
            return self._user_vjp(inner, args, checked, cotangents)
        if kind == "outputs":
            (part,) = info
            inner_outputs = self.outputs_of(inner, args)
            mapped = []
            for c, o in zip(cotangents, inner_outputs):
                if c is not None and self.is_complex(o):
                    # d Re(y) pulls back as the cotangent c, d Im(y) as i c (torch's convention)
                    c = self.xp(c).astype(c, o.dtype)
                    c = c if part == "real" else c * 1j
                mapped.append(c)
            return self.vjp_of(inner, args, checked, mapped)
        positions, originals, part = info
        rebuilt = _rebuild(self, args, positions, originals, part)
        grads = self.vjp_of(inner, rebuilt, checked, cotangents)
        # z = a + i b: the gradient for a is Re(dz), for b it is Im(dz)
        take = self.real if part == "real" else self.imag
        return [take(g) if (g is not None and p in positions and self.is_complex(g)) else g
                for g, p in zip(grads, checked)]

    def jvp_of(self, fn, args: tuple, checked: Sequence[int], tangents: list) -> list:
        """Forward mode of ``fn`` (or a piece of it): one tangent (or ``None``) per output."""
        kind, inner, *info = resolve(fn)
        if kind == "base":
            return self._user_jvp(inner, args, checked, tangents)
        if kind == "outputs":
            (part,) = info
            inner_outputs = self.outputs_of(inner, args)
            ts = self.jvp_of(inner, args, checked, tangents)
            take = self.real if part == "real" else self.imag
            return [take(t) if (t is not None and self.is_complex(o)) else t for t, o in zip(ts, inner_outputs)]
        positions, originals, part = info
        rebuilt = _rebuild(self, args, positions, originals, part)
        mapped = []
        for t, p in zip(tangents, checked):
            if t is not None and p in positions:
                t = self.xp(t).astype(t, originals[p].dtype)
                t = t if part == "real" else t * 1j
            mapped.append(t)
        return self.jvp_of(inner, rebuilt, checked, mapped)

    def _all_checked(self, args, checked) -> list:
        """Every checked position of ``args`` (the core sometimes asks about a subset)."""
        try:
            full = set(self.checked_positions(args))
        except ValueError:
            full = set()
        return sorted(full | set(checked))

    def _user_vjp(self, uf: UserFunction, args, checked, cotangents) -> list:
        if uf.vjp is None:
            raise reverse_missing()
        cots = tuple(cotangents)
        if uf.convention == "jax":
            cots = tuple(None if c is None else self.xp(c).conj(c) for c in cots)
        full = self._all_checked(args, checked)
        grads = self._one_per_checked(uf.vjp(_read_only(args), cots), args, full, "vjp", "gradients")
        by_position = dict(zip(full, grads))
        result = []
        for i, p in enumerate(checked):
            g = by_position[p]
            if g is None:
                result.append(None)
                continue
            x = args[p]
            g = self._as_array(g, x, f"vjp's gradient for input {i} (argument {p})")
            if uf.convention == "jax" and self.is_complex(g):
                g = self.xp(g).conj(g)
            if tuple(g.shape) != tuple(x.shape):
                raise GradcheckError(
                    f"vjp returned a gradient of shape {tuple(g.shape)} for input {i} (argument "
                    f"{p}) of shape {tuple(x.shape)}",
                    check="grad_size", details={"input": i},
                )
            if self.is_complex(g) and not self.is_complex(x):
                raise GradcheckError(
                    f"vjp returned a complex gradient ({g.dtype}) for the real input {i} (argument "
                    f"{p}); the gradient of a real input is real (take the real part)",
                    check="grad_dtype", details={"input": i},
                )
            # converted as torch's autograd engine does, else copied as torch's checker copies
            # each gradient: a vjp may hand back one buffer it fills again at every call
            g = self.xp(g).astype(g, x.dtype) if g.dtype != x.dtype else self.xp(g).asarray(g, copy=True)
            result.append(g)
        return result

    def _user_jvp(self, uf: UserFunction, args, checked, tangents) -> list:
        if uf.jvp is None:
            raise forward_missing()
        given = {p: t for p, t in zip(checked, tangents) if t is not None}
        ts = tuple(given[p] if p in given else self.xp(args[p]).zeros_like(args[p])
                   for p in self._all_checked(args, checked))
        outputs = self.outputs_of(uf, args)
        result = uf.jvp(_read_only(args), ts)
        if isinstance(result, (tuple, list)):
            result = list(result)
        else:
            result = [result]
        if len(result) != len(outputs):
            raise ValueError(
                f"jvp returned {len(result)} output tangent(s), but fn has {len(outputs)} output(s); "
                "return one tangent per output (None for an output without one)"
            )
        mapped = []
        for k, (t, o) in enumerate(zip(result, outputs)):
            if t is None or not self.is_floating_or_complex(o):
                mapped.append(None)
                continue
            t = self._as_array(t, o, f"jvp's tangent for output {k}")
            if tuple(t.shape) != tuple(o.shape):
                raise GradcheckError(
                    f"jvp returned a tangent of shape {tuple(t.shape)} for output {k} of shape "
                    f"{tuple(o.shape)}",
                    check="jvp_size", details={"output": k},
                )
            if self.is_complex(t) and not self.is_complex(o):
                raise GradcheckError(
                    f"jvp returned a complex tangent ({t.dtype}) for the real output {k}",
                    check="grad_dtype", details={"output": k},
                )
            t = self.xp(t).astype(t, o.dtype) if t.dtype != o.dtype else self.xp(t).asarray(t, copy=True)  # a copy, as above
            mapped.append(t)
        return mapped

    def _as_array(self, g, like, what):
        if self.is_array(g) and not isinstance(g, np.generic):
            if self.xp(g) is not self.xp(like):
                raise TypeError(
                    f"{what} is a {type(g).__module__}.{type(g).__qualname__}, but the arrays it belongs "
                    f"with are {type(like).__module__}.{type(like).__qualname__}: return arrays of the "
                    "inputs' namespace"
                )
            return g
        xp = self.xp(like)
        return xp.asarray(g, device=array_api_compat.device(like))

    def _one_per_checked(self, values, args, checked, what, noun) -> list:
        if not isinstance(values, (tuple, list)):
            values = [values]
        values = list(values)
        if len(values) == len(checked):
            return values
        if len(values) == len(args):
            return [values[p] for p in checked]
        raise ValueError(
            f"{what} returned {len(values)} {noun}, expected one per checked input "
            f"({len(checked)}: arguments {list(checked)}) or one per argument ({len(args)})"
        )


def _rebuild(be, args, positions, originals, part) -> tuple:
    """The complex inputs at ``positions`` rebuilt from their real (or imaginary) part in
    ``args`` and the other part of ``originals`` (as :func:`agcheck.core.wirtinger.input_part`)."""
    rebuilt = list(args)
    for k in positions:
        if part == "real":
            rebuilt[k] = args[k] + be.imag(originals[k]) * 1j
        else:
            rebuilt[k] = be.real(originals[k]) + args[k] * 1j
    return tuple(rebuilt)

