"""Arrays whose axes say what they run over, so that a difference can say where it is."""
from __future__ import annotations

import numpy as np

__all__ = ["LabelledArray"]


class LabelledArray:
    """A NumPy array with ``axes``, a ``(label, shape_or_names)`` per axis: a tuple is the shape
    whose flattened elements the axis runs over, a list names the axis' entries."""

    def __init__(self, data: np.ndarray, axes: list):
        self.data = np.asarray(data)
        self.axes = axes

    def _sizes(self) -> list:
        return [len(s) if isinstance(s, list) else int(np.prod(s, dtype=np.int64)) for _, s in self.axes]

    def indices(self, flat: int) -> dict:
        """``{axis label: index along that axis}`` of the flat entry ``flat``."""
        sizes = self._sizes()
        if not sizes:
            return {}
        return {label: int(i) for (label, _), i in zip(self.axes, np.unravel_index(flat, sizes))}

    def describe(self, flat: int) -> str:
        """The flat entry ``flat`` in words: ``"output 0 element [1], input 0 element [2]"``."""
        sizes = self._sizes()
        if not sizes:
            return "the scalar"
        parts = []
        for (label, spec), i in zip(self.axes, np.unravel_index(flat, sizes)):
            if isinstance(spec, list):
                entry = spec[int(i)]
                if entry in ("", "(1j)"):  # an entry of a scalar
                    parts.append(label.replace(" element", "").strip() + " (a scalar)" + (" (1j)" if entry else ""))
                else:
                    parts.append(f"{label} {entry}")
            elif not spec:
                parts.append(label.replace(" element ", "").strip() + " (a scalar)")
            else:
                parts.append(f"{label}{[int(v) for v in np.unravel_index(int(i), spec)]}")
        return ", ".join(parts)
