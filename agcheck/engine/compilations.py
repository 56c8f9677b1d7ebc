"""What the batched engine's programs would cost to compile, remembered per function, on a
backend that compiles every new program (JAX: ``Backend.engine_setup_seconds``).

A check's first evaluation of a function at a new signature compiles it, and shows the
cost: its time less the same evaluation's, again. The engine compiles several programs of
about that size (``cost.ENGINE_COMPILATIONS``). A later check of the same function at the
same signature evaluates it warm and no longer shows that cost, yet the engine's programs
are still to compile unless the engine has run there: the compilation first seen is kept
for the function until then, and once the engine has run (its batched evaluations, which
both modes share, compiled) there is nothing left to price.
"""
from __future__ import annotations

import weakref

__all__ = ["Compilations", "COMPILATIONS"]

_RAN = object()  # the engine has run: its programs are compiled


class Compilations:
    """Seconds of compilation seen per function (weakly held) and signature."""

    def __init__(self):
        self._seen = weakref.WeakKeyDictionary()  # fn -> {signature: seconds, or _RAN}

    def _entries(self, fn, *, make: bool) -> dict | None:
        try:
            return self._seen.setdefault(fn, {}) if make else self._seen.get(fn)
        except TypeError:  # a function that cannot be weakly referenced is not remembered
            return None

    def engine_ran(self, fn, signature) -> bool:
        """Whether the engine has run for ``fn`` at ``signature`` in this process."""
        entries = self._entries(fn, make=False)
        return entries is not None and entries.get(signature) is _RAN

    def price(self, fn, signature, measured: float) -> float:
        """The compilation the engine's programs of ``fn`` at ``signature`` would repeat:
        ``measured`` now, or the larger one seen before (0 once the engine has run)."""
        entries = self._entries(fn, make=True)
        if entries is None:
            return measured
        known = entries.get(signature, 0.0)
        if known is _RAN:
            return 0.0
        if measured > known:
            entries[signature] = known = measured
        return known

    def note_engine_run(self, fn, signature) -> None:
        """The engine compiled its programs of ``fn`` at ``signature``."""
        entries = self._entries(fn, make=True)
        if entries is not None:
            entries[signature] = _RAN


#: the process's memory of compilations (checks of one function share it)
COMPILATIONS = Compilations()
