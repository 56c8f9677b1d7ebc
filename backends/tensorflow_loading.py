"""Importing TensorFlow without breaking a later import of triton.

TensorFlow's wheels from 2.20 on load their core library with ``RTLD_GLOBAL``, which puts
TF's statically linked LLVM in the process's global symbols; triton (which CUDA builds of
torch import lazily, with ``torch._dynamo`` or ``torch.compile``) links its own LLVM, and
loading it after TensorFlow crashes the interpreter with a segmentation fault
(tensorflow/tensorflow#124205). A process that checks with both the torch and the
TensorFlow backends (a cross-check, the main job) meets it as soon as torch reaches
triton. Loading triton first avoids the clash, so :func:`import_tensorflow` does that
where triton is installed and neither is loaded yet (0.15-0.6 s, once; it does
not import torch).
"""
from __future__ import annotations

import importlib
import importlib.util
import sys

__all__ = ["import_tensorflow"]


def import_tensorflow():
    """The ``tensorflow`` module, with triton loaded before it where triton is installed
    and TensorFlow is not loaded yet (where it is, triton cannot be made safe any more)."""
    if "tensorflow" not in sys.modules and "triton" not in sys.modules:
        try:
            if importlib.util.find_spec("triton") is not None:
                importlib.import_module("triton")
        except Exception:  # noqa: BLE001 - a broken triton is torch's concern, not a reason to lose TF
            pass
    return importlib.import_module("tensorflow")
