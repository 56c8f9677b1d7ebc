"""Warnings attributed to the caller's line, not to agcheck's own frames."""
from __future__ import annotations

import os
import sys
import types
import warnings

__all__ = ["warn_caller"]

#: the installed package's folder, and that of its backends (beneath it in a wheel; the
#: repository's top-level backends/ in an editable install)
_FOLDERS = (os.path.dirname(os.path.abspath(__file__)) + os.sep,
            os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "backends") + os.sep)


def warn_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` with the stack level of the first frame outside agcheck: the
    user's call of ``gradcheck`` (or of ``fn``'s own caller, where ``fn`` is agcheck's)."""
    frame: types.FrameType | None = sys._getframe(1)
    level = 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_FOLDERS):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level if frame is not None else 2)
