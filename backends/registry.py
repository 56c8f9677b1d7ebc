"""The registry of backends: names mapped to lazily imported modules, and inference of
the backend from the inputs' arrays."""
from __future__ import annotations

import importlib
import importlib.util
from typing import Iterator

from agcheck.backends.base import Backend, BackendUnavailableError, require_contract
from agcheck.errors import BackendInferenceError

__all__ = ["register_backend", "register_alias", "canonical_name", "available_backends", "get_backend",
           "infer_backend"]

_REGISTRY: dict[str, tuple[str, str, str]] = {}
#: other names of registered backends (``"tf"`` for ``"tensorflow"``)
_ALIASES: dict[str, str] = {}
_INSTANCES: dict[str, Backend] = {}
#: chosen by inference only when no other framework's arrays are among the inputs
_FALLBACK = "numpy"

#: per type of input leaf, the backends that own it, for the frameworks imported when it
#: was filled (``owns`` answers from the type alone); refilled when that set changes
_OWNERS: dict[type, tuple] = {}
_OWNERS_IMPORTED: tuple | None = None


def register_backend(name: str, module: str, framework: str, extra: str) -> None:
    """Register a backend by the module that defines it (imported lazily).

    The module must define ``BACKEND_CLASS`` (a :class:`Backend` subclass) and
    ``owns(x) -> bool`` that answers without importing the framework when possible, from
    ``type(x)`` alone (inference remembers the answer per type).
    """
    global _OWNERS_IMPORTED
    _REGISTRY[name] = (module, framework, extra)
    _OWNERS_IMPORTED = None  # inference asks the backends again


register_backend("torch", "agcheck.backends.torch_backend", "torch", "torch")
register_backend("jax", "agcheck.backends.jax_backend", "jax", "jax")
register_backend("numpy", "agcheck.backends.numpy_backend", "numpy", "numpy")
register_backend("tensorflow", "agcheck.backends.tensorflow_backend", "tensorflow", "tensorflow")
register_backend("mlx", "agcheck.backends.mlx_backend", "mlx", "mlx")


def register_alias(alias: str, name: str) -> None:
    """Let ``alias`` stand for the registered backend ``name`` in ``backend=...``."""
    if name not in _REGISTRY:
        raise ValueError(f"cannot alias {alias!r} to the unknown backend {name!r}")
    _ALIASES[alias] = name


register_alias("tf", "tensorflow")


def _installed(framework: str) -> bool:
    return importlib.util.find_spec(framework) is not None


def available_backends() -> dict[str, bool]:
    """Every registered backend and whether its framework is installed."""
    return {name: _installed(fw) for name, (_, fw, _) in _REGISTRY.items()}


def canonical_name(name: str) -> str:
    """The registered name ``name`` stands for (itself, or what an alias names)."""
    return _ALIASES.get(name, name)


def get_backend(name, **options) -> Backend:
    """The backend called ``name`` (or ``name`` itself if it is a :class:`Backend`),
    configured with ``options`` (the backend-specific keywords of one call). A backend
    class that lacks a required verb of the contract is refused with a ``TypeError``
    naming them all (:func:`agcheck.backends.base.require_contract`)."""
    if isinstance(name, Backend):
        require_contract(type(name))
        return name.with_options(**options)
    if isinstance(name, str):
        name = canonical_name(name)
    if not isinstance(name, str) or name not in _REGISTRY:
        known = ", ".join(
            f"{n} ({'installed' if ok else 'not installed'})" for n, ok in available_backends().items()
        )
        aliases = ", ".join(f"{a} = {n}" for a, n in _ALIASES.items())
        known += f"; aliases: {aliases}" if aliases else ""
        raise ValueError(f"unknown backend {name!r}; known backends: {known}")
    if name not in _INSTANCES:
        module, framework, extra = _REGISTRY[name]
        if not _installed(framework):
            raise BackendUnavailableError(
                f"the {name!r} backend needs {framework}, which is not installed; "
                f"install it with: pip install 'agcheck[{extra}]'"
            )
        try:
            cls = importlib.import_module(module).BACKEND_CLASS
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("agcheck.backends"):
                raise BackendUnavailableError(f"the {name!r} backend is not part of this agcheck version") from e
            raise
        require_contract(cls)
        _INSTANCES[name] = cls()
    return _INSTANCES[name].with_options(**options)


def _leaves(x) -> Iterator:
    if isinstance(x, (tuple, list)):
        for item in x:
            yield from _leaves(item)
    elif isinstance(x, dict):
        for item in x.values():
            yield from _leaves(item)
    else:
        yield x


def _owners_cache() -> dict:
    import sys

    global _OWNERS, _OWNERS_IMPORTED
    imported = tuple(name for name, (_, framework, _) in _REGISTRY.items() if framework in sys.modules)
    if imported != _OWNERS_IMPORTED:
        _OWNERS, _OWNERS_IMPORTED = {}, imported
    return _OWNERS


def _owners(leaf) -> tuple:
    """The names of the backends of imported frameworks that own ``leaf``.

    The fallback is asked only where no other backend owns ``leaf`` (inference would drop
    it beside another backend anyway), so a torch check does not import the NumPy backend.
    """
    names = []
    for name in sorted(_OWNERS_IMPORTED, key=lambda n: n == _FALLBACK):
        if name == _FALLBACK and names:
            break
        try:
            backend = get_backend(name)
        except BackendUnavailableError:
            continue
        if backend.owns(leaf):
            names.append(name)
    return tuple(names)


def infer_backend(inputs, **options) -> Backend:
    """The backend whose framework made the arrays in ``inputs``.

    Only frameworks that are already imported are asked, so inference never imports one.
    """
    found: dict[str, Backend] = {}
    owners = _owners_cache()
    for leaf in _leaves(inputs):
        kind = type(leaf)
        names = owners.get(kind)
        if names is None:
            names = owners[kind] = _owners(leaf)
        for name in names:
            if name not in found:
                found[name] = _INSTANCES.get(name) or get_backend(name)
    if len(found) > 1 and _FALLBACK in found:
        # NumPy arrays beside another framework's arrays are pass-through arguments
        del found[_FALLBACK]
    if len(found) > 1:
        raise TypeError(
            "inputs mix arrays of several frameworks ("
            + ", ".join(sorted(found))
            + "); pass arrays of one framework, or choose one with backend=..."
        )
    if not found:
        raise BackendInferenceError(
            "could not infer the backend: no input is an array of a known framework "
            f"({', '.join(_REGISTRY)}), so none can be differentiated; pass array inputs "
            "(a tuple of them), or backend=..."
        )
    return next(iter(found.values())).with_options(**options)
