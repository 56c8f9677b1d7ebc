"""The public home of the backend interface and registry (kept for ``agcheck.backend.X``
imports); they live in :mod:`agcheck.backends.base` and :mod:`agcheck.backends.registry`."""
from agcheck.backends.base import Backend, BackendUnavailableError, Perturber, Trace
from agcheck.backends.registry import available_backends, get_backend, infer_backend, register_backend

__all__ = ["Backend", "Trace", "Perturber", "BackendUnavailableError", "register_backend",
           "available_backends", "get_backend", "infer_backend"]
