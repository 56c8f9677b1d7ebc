"""agcheck in the place of a framework's own gradient checker: :func:`patch_torch`,
:func:`patch_jax`, :func:`patch_tensorflow`, each a context manager or a :class:`Patch`.

A backend's drop-in module supplies ``(original, replacement)`` pairs; every module in
``sys.modules`` whose globals hold an original is rebound, and restoring rebinds the
replacements (also in modules imported meanwhile). Patches nest: the first rebinds, the last undoes.
"""
from __future__ import annotations

import importlib
import sys
import threading
from typing import Callable

__all__ = ["Patch", "patch_torch", "patch_jax", "patch_tensorflow", "tensorflow_report", "check_grads", "stats",
           "add_failure_listener", "remove_failure_listener"]

_LOCK = threading.RLock()
#: framework -> active patches
_ACTIVE: dict[str, list["Patch"]] = {}
#: framework -> {"checks": n, "failures": n} over the life of the process
_STATS: dict[str, dict[str, int]] = {}
_LISTENERS: list[Callable] = []

_DROPIN_MODULES = {"torch": "agcheck.backends.torch_dropin", "jax": "agcheck.backends.jax_dropin",
                   "tensorflow": "agcheck.backends.tensorflow_dropin"}


def _dropin_module(framework: str):
    """The framework's drop-in module, with the checkers handed in (it is in a layer below them)."""
    from agcheck.backends import dropin_checkers
    from agcheck.gradcheck import gradcheck
    from agcheck.gradgradcheck import gradgradcheck

    dropin_checkers.install(gradcheck, gradgradcheck)
    return importlib.import_module(_DROPIN_MODULES[framework])


def stats(framework: str | None = None) -> dict:
    """``{"checks": n, "failures": n}`` of agcheck's drop-ins, per framework or for one."""
    with _LOCK:
        if framework is not None:
            return dict(_STATS.get(framework, {"checks": 0, "failures": 0}))
        return {k: dict(v) for k, v in _STATS.items()}


def add_failure_listener(listener: Callable) -> None:
    """Call ``listener(framework, kind, error)`` for every failure raised by a drop-in
    check; a string it returns (a saved report's path) is named in the error's message."""
    _LISTENERS.append(listener)


def remove_failure_listener(listener: Callable) -> None:
    if listener in _LISTENERS:
        _LISTENERS.remove(listener)


def _count(framework, key):
    with _LOCK:
        entry = _STATS.setdefault(framework, {"checks": 0, "failures": 0})
        entry[key] += 1
        for patch in _ACTIVE.get(framework, ()):
            setattr(patch, key, getattr(patch, key) + 1)


def _observer(framework: str, failure_types: tuple, failed: Callable | None = None):
    """A drop-in's call of ``check`` that counts checks and failures (one of ``failure_types``
    raised, ``False`` returned, or ``failed(result)``)."""
    def observe(kind, check, fn, inputs, kwargs):
        __tracebackhide__ = True
        _count(framework, "checks")
        try:
            result = check(fn, inputs, **kwargs)
        except failure_types as error:
            _count(framework, "failures")
            _notify(framework, kind, error)
            raise
        if result is False or failed is not None and failed(result):
            _count(framework, "failures")
        return result

    return observe


def _notify(framework, kind, error) -> None:
    for listener in list(_LISTENERS):
        try:
            path = listener(framework, kind, error)
        except Exception:  # noqa: BLE001 - a listener must never hide the failure
            continue
        if isinstance(path, str) and error.args and isinstance(error.args[0], str):
            error.args = (error.args[0].rstrip("\n") + f"\n\nagcheck report saved to {path}",) + error.args[1:]


def rebind(pairs, modules=None, skip=()) -> int:
    """Rebind module-level names bound to a ``pairs`` original to its replacement, except in
    ``skip``; the number rebound."""
    by_id = {id(old): (old, new) for old, new in pairs}
    count = 0
    for key, module in list((modules if modules is not None else sys.modules).items()):
        if key in skip:
            continue
        try:
            namespace = vars(module)
        except TypeError:
            continue
        if not isinstance(namespace, dict):
            continue
        for name, value in list(namespace.items()):
            hit = by_id.get(id(value))
            if hit is None or hit[0] is not value:
                continue
            try:
                namespace[name] = hit[1]
            except Exception:  # noqa: BLE001 - a read-only namespace stays as it is
                continue
            count += 1
    return count


class Patch:
    """An active drop-in patch; ``restore()`` (or leaving the ``with`` block) undoes it, once.

    Attributes
    ----------
    framework : str
        ``"torch"``, ``"jax"`` or ``"tensorflow"``.
    checks, failures : int
        Checks routed to agcheck while this patch was active, and how many of them failed
        (for TensorFlow: calls whose two Jacobians differ, see :func:`patch_tensorflow`).
    rebound : int
        Names rebound when the patch was installed (0 for a patch nested in another).
    """

    def __init__(self, framework: str, defaults: dict | None = None):
        self.framework = framework
        self.defaults = dict(defaults or {})
        self.checks = 0
        self.failures = 0
        self.rebound = 0
        self.active = False
        self._module = _dropin_module(framework)

    def _install(self) -> "Patch":
        mod = self._module
        with _LOCK:
            active = _ACTIVE.setdefault(self.framework, [])
            if not active:
                mod.ensure_bound_modules()
                mod.observer = _observer(self.framework, mod.failure_types(), getattr(mod, "failed", None))
                if hasattr(mod, "defaults"):
                    mod.defaults = dict(self.defaults)
                self.rebound = rebind(mod.targets(), skip=(mod.__name__,))
            active.append(self)
            self.active = True
        return self

    def restore(self) -> None:
        """Undo the patch (the last active patch of a framework rebinds the originals)."""
        mod = self._module
        with _LOCK:
            active = _ACTIVE.get(self.framework, [])
            if not self.active:
                return
            self.active = False
            active.remove(self)
            if not active:
                rebind([(new, old) for old, new in mod.targets()], skip=(mod.__name__,))
                mod.observer = None
                if hasattr(mod, "defaults"):
                    mod.defaults = {}

    def __enter__(self) -> "Patch":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()

    def __repr__(self) -> str:
        state = "active" if self.active else "restored"
        return f"<agcheck {self.framework} patch, {state}, {self.checks} checks, {self.failures} failures>"


def patch_torch(**agcheck_keywords) -> Patch:
    """Route ``torch.autograd.gradcheck`` and ``gradgradcheck`` to agcheck.

    Reaches every name bound to them in modules already imported (``from torch.autograd
    import gradcheck``, the wrappers of ``torch.testing._internal.common_utils``). Failures
    are ``torch.autograd.gradcheck.GradcheckError`` (and :class:`agcheck.GradcheckError`),
    torch's message followed by agcheck's report summary. Use it as a context manager
    (``with agcheck.patch_torch(): ...``) or call the returned :class:`Patch`'s ``restore()``.

    ``agcheck_keywords`` (``engine``, ``memory_budget``, ``stencil``, ``progress``) are
    added to every routed call, e.g. ``engine="reference"`` to evaluate the suite's
    functions exactly as often as torch does (docs/switching.md). A patch nested in an
    active one keeps the outer patch's keywords.
    """
    unknown = sorted(set(agcheck_keywords) - {"engine", "memory_budget", "stencil", "progress"})
    if unknown:
        raise TypeError(f"patch_torch() takes agcheck's engine, memory_budget, stencil and progress "
                        f"keywords only, got {unknown}")
    return Patch("torch", agcheck_keywords)._install()


def patch_jax(**agcheck_keywords) -> Patch:
    """Route ``jax.test_util.check_grads`` to :func:`agcheck.check_grads` (same arguments,
    same ``AssertionError``, agcheck's account in the message). A context manager, or a
    :class:`Patch` to ``restore()``.

    ``agcheck_keywords`` (``account``) are added to every routed call: ``account="full"``
    explains each failure by the failing level's full Jacobians. A patch nested in an
    active one keeps the outer patch's keywords.
    """
    unknown = sorted(set(agcheck_keywords) - {"account"})
    if unknown:
        raise TypeError(f"patch_jax() takes agcheck's account keyword only, got {unknown}")
    account = agcheck_keywords.get("account")
    if account is not None:
        from agcheck.backends.jax_dropin import validate_account  # patching JAX imports it anyway

        validate_account(account)
    return Patch("jax", agcheck_keywords)._install()


def patch_tensorflow() -> Patch:
    """Route ``tf.test.compute_gradient`` to agcheck's Jacobians (same arguments, same
    ``(theoretical, numerical)`` 2-D NumPy arrays, equal within finite-difference noise).

    Reaches ``tf.test``, ``tf.compat.v2.test``, ``gradient_checker_v2`` and every name bound
    to the function in modules already imported (``tf.compat.v1.test.compute_gradient``, of
    TensorFlow 1's graphs, stays TensorFlow's). A context manager, or a :class:`Patch`.
    Where the two Jacobians differ beyond the dtype's tolerances, a warning (logger
    ``agcheck.tensorflow``) names the largest difference; :func:`tensorflow_report` explains it.
    """
    return Patch("tensorflow")._install()


def tensorflow_report(result=None, *, atol=None, rtol=None):
    """The :func:`agcheck.gradcheck` failure report of a routed ``tf.test.compute_gradient``
    call (the latest, or the one that returned ``result``) with ``eps=delta``, at ``atol`` /
    ``rtol`` (default ``1e-5`` / ``1e-3`` in double precision, ``1e-2`` in single); ``None``
    where that passes. A ``LookupError`` when no such call was routed."""
    return _dropin_module("tensorflow").report(result, atol=atol, rtol=rtol)


def check_grads(f, args, order, modes=("fwd", "rev"), atol=None, rtol=None, eps=None, *, full=False,
                account=None):
    """``jax.test_util.check_grads`` on agcheck: the same checks, defaults and verdicts.

    Checks the JVP (``"fwd"``), the VJP (``"rev"``) and/or ``jax.linearize``
    (``"lin"``) of ``f`` at ``args`` along random directions against central finite
    differences (step ``eps``, default ``1e-4``), recursively up to ``order``, with JAX's
    tolerances per dtype (float32 ``2e-3``, float64 ``1e-5``, ...) unless ``atol`` /
    ``rtol`` (numbers, or dicts by dtype) are given.

    Raises an ``AssertionError`` (:class:`~agcheck.backends.jax_dropin.CheckGradsError`)
    on a failure: JAX's message (which level, ``primal`` / ``tangent`` / ``cotangent
    projection``), then agcheck's account of the failing level. By default
    (``account="direction"``) the account comes from the arrays the check compared, with
    no further calls of ``f``: which output differs and where, the pattern (zero, a
    constant factor, a flipped sign, a conjugate, a few elements), and whether the JVP
    along the same tangent points at the reverse rule (``.account``). ``account="full"``
    compares the failing level's full Jacobians instead, in slow mode, with agcheck's
    failure report (``.report``); it costs about two evaluations per input element.
    ``full=True`` (beyond JAX) also compares full Jacobians of every level with
    :func:`agcheck.gradcheck` / ``gradgradcheck`` (slow mode) after the random-direction
    checks pass, and makes ``"full"`` the default account.
    """
    __tracebackhide__ = True
    return _dropin_module("jax").check_grads(f, args, order, modes=modes, atol=atol, rtol=rtol, eps=eps, full=full,
                                             account=account)
