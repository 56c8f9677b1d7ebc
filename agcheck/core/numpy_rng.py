"""NumPy's global random state, left as it was by a check, at the cost of a memory read.

``np.random.get_state()`` costs about 30 µs, a tenth of a small fast-mode check. Instead
the MT19937 key and position and the ``RandomState``'s Gaussian cache are copied as bytes
and written back only if ``fn`` changed them. The cache's offset is not public: it is
found once on a private ``RandomState`` and confirmed on the global one; where that
fails (another NumPy layout), ``get_state``/``set_state`` are used.
"""
from __future__ import annotations

import ctypes
import struct
import sys
from contextlib import contextmanager

import numpy as np

__all__ = ["numpy_rng_preserved"]

#: the MT19937 key (624 32-bit words) and its position (a C int)
_MT_BYTES = 624 * 4 + 4
#: ``int has_gauss`` (padded) and ``double gauss``
_GAUSS_BYTES = 16
_UNKNOWN = object()
_gauss_offset = _UNKNOWN


@contextmanager
def numpy_rng_preserved():
    """NumPy's global random state as it was, whatever ``fn`` drew.

    Not imported yet, ``numpy.random`` has no state to keep, and importing it would cost
    the first check several milliseconds.
    """
    if "numpy.random" not in sys.modules:
        yield
        return
    global_state = np.random.mtrand._rand
    raw = _raw_state(global_state)
    if raw is None:
        state = np.random.get_state()
        try:
            yield
        finally:
            np.random.set_state(state)
        return
    try:
        yield
    finally:
        if _raw_state(global_state) != raw:
            _write_raw_state(global_state, raw)


def _raw_state(rs) -> tuple[bytes, bytes] | None:
    """The bytes of ``rs``'s generator state and Gaussian cache (``None``: unreadable)."""
    offset = _gauss_cache_offset()
    if offset is None:
        return None
    try:
        address = rs._bit_generator.ctypes.state_address
    except AttributeError:
        return None
    return ctypes.string_at(address, _MT_BYTES), ctypes.string_at(id(rs) + offset, _GAUSS_BYTES)


def _write_raw_state(rs, raw) -> None:
    words, cache = raw
    ctypes.memmove(rs._bit_generator.ctypes.state_address, words, _MT_BYTES)
    ctypes.memmove(id(rs) + _gauss_cache_offset(), cache, _GAUSS_BYTES)


def _gauss_cache_offset() -> int | None:
    global _gauss_offset
    if _gauss_offset is _UNKNOWN:
        try:
            _gauss_offset = _find_gauss_cache_offset()
        except Exception:  # noqa: BLE001 - any surprise: the public API instead
            _gauss_offset = None
    return _gauss_offset


def _find_gauss_cache_offset() -> int | None:
    rs = np.random.RandomState(20261124)
    if type(rs) is not type(np.random.mtrand._rand) or not hasattr(rs._bit_generator, "ctypes"):
        return None
    size = type(rs).__basicsize__
    rs.standard_normal()  # draws a pair: one returned, one cached
    _, _, _, has_gauss, gauss = rs.get_state()
    memory = ctypes.string_at(id(rs), size)
    at = memory.find(struct.pack("d", gauss))
    offset = at - 8
    if has_gauss != 1 or at < 8 or memory.count(struct.pack("d", gauss)) != 1 or \
            memory[offset:offset + 4] != struct.pack("i", 1) or offset + _GAUSS_BYTES > size:
        return None
    rs.standard_normal()  # uses the cache
    if ctypes.string_at(id(rs) + offset, 4) != struct.pack("i", 0) or rs.get_state()[3] != 0:
        return None
    # the same layout holds for the global state
    g = np.random.mtrand._rand
    state = g.get_state()
    cache = ctypes.string_at(id(g) + offset, _GAUSS_BYTES)
    if struct.unpack("i", cache[:4])[0] != state[3] or (state[3] and struct.unpack("d", cache[8:])[0] != state[4]):
        return None
    return offset
