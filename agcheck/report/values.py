"""Numbers, indices and arrays as a failure report's text (:func:`fmt`, :func:`index_text`)
and JSON data (:func:`jsonable`, :func:`encode_number`, :func:`encode_array`); NumPy only."""
from __future__ import annotations

import math

import numpy as np

__all__ = ["DICT_ARRAY_LIMIT", "encode_number", "decode_number", "encode_array", "decode_array", "jsonable",
           "fmt", "index_text", "unravel", "unravel_all", "abs_difference", "largest_positions", "wrap_words"]

#: blocks up to this many entries carry their arrays in ``to_dict()`` by default
DICT_ARRAY_LIMIT = 10_000


def encode_number(v):
    """A JSON-safe scalar: finite floats as is, non-finite as strings, complex as a dict."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (complex, np.complexfloating)):
        return {"real": encode_number(float(v.real)), "imag": encode_number(float(v.imag))}
    f = float(v)
    if math.isfinite(f):
        return f
    return "nan" if math.isnan(f) else ("inf" if f > 0 else "-inf")


def decode_number(v):
    """The inverse of :func:`encode_number`."""
    if isinstance(v, dict) and set(v) == {"real", "imag"}:
        return complex(decode_number(v["real"]), decode_number(v["imag"]))
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return float(v)
    return v


def encode_array(a: np.ndarray) -> dict:
    """An array as JSON data: dtype, shape and nested lists (complex as real and imaginary parts)."""
    a = np.asarray(a)
    if np.iscomplexobj(a):
        body = {"real": encode_array(a.real)["data"], "imag": encode_array(a.imag)["data"]}
    else:
        data = a.astype(np.float64).tolist()
        if not np.all(np.isfinite(a)):
            data = _walk(data, encode_number)
        body = {"data": data}
    return {"dtype": str(a.dtype), "shape": list(a.shape), **body}


def decode_array(d: dict) -> np.ndarray:
    """The inverse of :func:`encode_array`."""
    def load(data):
        return np.asarray(_walk(data, decode_number), dtype=np.float64).reshape(d["shape"])

    if "real" in d:
        a = load(d["real"]) + 1j * load(d["imag"])
    else:
        a = load(d["data"])
    return a.astype(d["dtype"])


def _walk(data, f):
    if isinstance(data, list):
        return [_walk(x, f) for x in data]
    return f(data)


def jsonable(value, _depth: int = 0):
    """``value`` as plain JSON data (unknown objects become their ``repr``)."""
    if _depth > 8:
        return repr(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v, _depth + 1) for v in value]
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if value is None or isinstance(value, (int, float, complex, np.number)):
        return encode_number(value)
    if isinstance(value, np.ndarray) and value.size <= DICT_ARRAY_LIMIT:
        return encode_array(value)
    return repr(value)


def fmt(v) -> str:
    """A short text form of a number for summaries."""
    if v is None:
        return "-"
    if isinstance(v, (complex, np.complexfloating)):
        if v.imag == 0:
            return fmt(v.real)
        return f"{v.real:.6g}{v.imag:+.6g}j"
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.6g}"
    return str(v)


def index_text(idx) -> str:
    """A multi-index as Python writes a tuple (``"(1, 2)"``, ``"(3,)"``, ``"()"``)."""
    if idx is None:
        return "-"
    if len(idx) == 0:
        return "()"
    return "(" + ", ".join(str(i) for i in idx) + ("," if len(idx) == 1 else "") + ")"


def unravel(flat: int, shape) -> tuple:
    """The multi-index of element ``flat`` of ``shape`` (``(flat,)`` when the shape is unknown or too small)."""
    flat = int(flat)
    if shape is None:
        return (flat,)
    if len(shape) == 0:
        return ()
    rest, index = flat, []
    for size in reversed(shape):  # C order, as np.unravel_index (a scalar call costs it microseconds)
        size = int(size)
        if size <= 0:
            return (flat,)
        rest, i = divmod(rest, size)
        index.append(i)
    return (flat,) if rest else tuple(reversed(index))


def unravel_all(flat, shape) -> list:
    """:func:`unravel` of each index in ``flat``, vectorised where the shape holds them all."""
    flat = [int(f) for f in flat]
    if shape is not None and len(shape) == 0:
        return [()] * len(flat)
    if shape is None or len(shape) == 1:  # held or not, a one-dimensional index is the flat one
        return [(f,) for f in flat]
    shape = tuple(int(s) for s in shape)
    size = math.prod(shape)
    if not flat or any(not 0 <= f < size for f in flat):
        return [unravel(f, shape) for f in flat]
    return list(zip(*(c.tolist() for c in np.unravel_index(np.asarray(flat, dtype=np.int64), shape))))


def abs_difference(a, b) -> np.ndarray:
    """``|a - b|`` with one temporary, not two: made absolute in place (complex: a new real array)."""
    d = np.subtract(a, b)
    return np.abs(d) if np.iscomplexobj(d) else np.abs(d, out=d)


def wrap_words(text: str, width: int, indent: str = "") -> list:
    """``text`` in lines of at most ``width`` characters broken between words, lines after the
    first starting with ``indent``: ``textwrap.wrap`` with ``subsequent_indent`` at a tenth
    of its cost, for a report's one-paragraph messages."""
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = indent + word
        else:
            line = f"{line} {word}" if line else word
    if line:
        lines.append(line)
    return lines


#: elements of an output looked at by :func:`float32_valued`
FLOAT32_SAMPLE = 4096
#: a value computed in float32 (or half) has more significant bits than this, by chance
#: almost always; constants a function clamps to (0.5, 0.75) have fewer
SHORT_MANTISSA_BITS = 8


def float32_valued(a) -> bool:
    """Whether an array is float32 (or coarser), or a double one whose first ``FLOAT32_SAMPLE``
    elements are all float32 values, one at least with more than ``SHORT_MANTISSA_BITS``
    significant bits: a function rounding inside, not one returning constants."""
    a = np.ascontiguousarray(a)
    if a.dtype in (np.float32, np.float16, np.complex64):
        return True
    if a.dtype == np.complex128:
        a = a.view(np.float64)
    elif a.dtype != np.float64:
        return False
    a = a.ravel()[:FLOAT32_SAMPLE]
    a = a[np.isfinite(a) & (a != np.round(a))]
    if a.size == 0 or not np.array_equal(a, a.astype(np.float32).astype(np.float64)):
        return False
    mantissa = np.frexp(np.abs(a))[0]  # in [0.5, 1): a float32 value's times 2**24 is an integer
    return bool((mantissa * 2.0 ** SHORT_MANTISSA_BITS != np.round(mantissa * 2.0 ** SHORT_MANTISSA_BITS)).any())


def largest_positions(flat: np.ndarray, k: int) -> np.ndarray:
    """Flat indices of the ``k`` largest positive entries of ``flat``, largest first, ties by
    position. Partitions a negated copy from the front: NumPy's selection is fast there on
    mostly-zero blocks and slow from the back, and no index array of the block is made."""
    k = min(k, flat.size)
    if not k:
        return np.zeros(0, dtype=np.int64)
    negated = np.negative(flat)
    negated.partition(k - 1)
    kth = -negated[k - 1]
    del negated
    if not kth > 0:  # fewer than k positive entries
        chosen = np.flatnonzero(flat > 0)
    else:
        chosen = np.flatnonzero(flat > kth)  # fewer than k
        ties, need, step = [], k - chosen.size, 1 << 20
        for start in range(0, flat.size, step):  # the first ties by position, a chunk at a time
            ties.extend((np.flatnonzero(flat[start:start + step] == kth)[:need - len(ties)] + start).tolist())
            if len(ties) >= need:
                break
        chosen = np.concatenate([chosen, np.asarray(ties, dtype=np.int64)])
    return chosen[np.lexsort((chosen, -flat[chosen]))][:k]
