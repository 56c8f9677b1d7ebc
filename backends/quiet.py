"""One warning silenced for the span of agcheck's own calls, safely across threads.

``warnings.catch_warnings()`` saves and restores the process's whole filter list: two
threads inside it at once restore each other's lists, and filters leak for good. Its
exit also marks the filters changed, which clears every module's once-per-location
registry, so a warning of ``fn`` under Python's default filter shows again at each
check. :func:`ignoring` instead inserts one filter entry, shared by every thread that
asks for the same message while any of them is inside, and removes exactly that entry
when the last one leaves; the filters' version is left alone (CPython's ``warnings``
reads the list at each warning, and an ``ignore`` records nothing in the registries).
"""
from __future__ import annotations

import re
import threading
import warnings
from contextlib import contextmanager
from typing import Iterator

__all__ = ["ignoring"]

_lock = threading.Lock()
#: message pattern -> [entry, the filter list it went into, threads inside]
_active: dict[tuple[str, type], list] = {}


@contextmanager
def ignoring(message: str, category: type[Warning] = UserWarning) -> Iterator[None]:
    """Ignore warnings of ``category`` whose text matches the regular expression
    ``message`` at its start while inside."""
    key = (message, category)
    with _lock:
        held = _active.get(key)
        if held is None:
            entry = ("ignore", re.compile(message, re.I), category, None, 0)
            filters = warnings.filters
            filters.insert(0, entry)
            held = _active[key] = [entry, filters, 0]
        held[2] += 1
    try:
        yield
    finally:
        with _lock:
            held[2] -= 1
            if held[2] == 0:
                del _active[key]
                entry, filters = held[0], held[1]
                # the list it went into, and the current one (a catch_warnings entered
                # meanwhile in another thread copied it there)
                for where in {id(filters): filters, id(warnings.filters): warnings.filters}.values():
                    while any(f is entry for f in where):
                        del where[next(i for i, f in enumerate(where) if f is entry)]
