"""agcheck's failures as torch's: every :class:`agcheck.GradcheckError` that leaves a
check run on the torch backend is also a ``torch.autograd.gradcheck.GradcheckError``, so
that ``except torch.autograd.gradcheck.GradcheckError`` (and pytest's
``raises(GradcheckError)``) in suites written for torch's checker catch agcheck's failures.

The error keeps its identity: :func:`adopt` changes the class of the raised instance to a
subclass of both, so the message, the ``.report`` and the traceback are the ones the core
built.
"""
from __future__ import annotations

import importlib

from agcheck.errors import GradcheckError

__all__ = ["TorchGradcheckError", "torch_error_type", "adopt"]


def torch_error_type() -> type:
    """torch's ``GradcheckError`` (the module ``torch.autograd.gradcheck`` holds it; the
    attribute of ``torch.autograd`` with that name is the function)."""
    return importlib.import_module("torch.autograd.gradcheck").GradcheckError


class _TorchTwin:
    """What each agcheck error class's torch twin adds: pickling by the agcheck class (the
    twin carries the agcheck class's name, under which pickle would not find it)."""

    agcheck_class: type

    def __reduce__(self):
        reduced = super().__reduce__()
        return (_rebuilt, (self.agcheck_class, reduced[1])) + tuple(reduced[2:])


def _rebuilt(cls: type, args: tuple):
    return adopt(cls(*args))


class TorchGradcheckError(_TorchTwin, GradcheckError, torch_error_type()):
    """A failed check on the torch backend: an :class:`agcheck.GradcheckError` and a
    ``torch.autograd.gradcheck.GradcheckError`` (both ``RuntimeError``). Its name is
    ``GradcheckError``, as both its bases', so that tracebacks, pytest's failure lines and
    tools that compare exception names see the name a torch suite expects."""

    agcheck_class = GradcheckError


TorchGradcheckError.__name__ = TorchGradcheckError.__qualname__ = "GradcheckError"

#: subclasses of GradcheckError (e.g. the pytest fixture's failure) -> their torch twin
_TWINS: dict[type, type] = {GradcheckError: TorchGradcheckError}


def _twin(cls: type) -> type:
    twin = _TWINS.get(cls)
    if twin is None:
        twin = type(cls.__name__, (_TorchTwin, cls, torch_error_type()),
                    {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
                     "agcheck_class": cls})
        _TWINS[cls] = twin
    return twin


def adopt(error):
    """``error`` itself, now also an instance of torch's ``GradcheckError``."""
    if isinstance(error, GradcheckError) and not isinstance(error, torch_error_type()):
        try:
            error.__class__ = _twin(type(error))
        except TypeError:  # an incompatible layout: leave the error as it was
            pass
    return error
