"""The torch backend's array helpers: ownership and layouts, torch's gradcheck zeros and the
core's namespace, dtypes towards NumPy, and bitwise equality of tensors.
"""
from __future__ import annotations

import types

import array_api_compat.torch
import numpy as np
import torch


def owns(x) -> bool:
    return isinstance(x, torch.Tensor)


def _is_sparse(x) -> bool:
    return x.layout in (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


def _zeros_like(x):
    """Zeros shaped like ``x``: contiguous for a strided tensor (as torch's gradcheck makes
    them), in ``x``'s layout for a sparse one, strided for MKL-DNN (which has no zeros)."""
    if x.layout == torch._mkldnn:
        return torch.zeros(tuple(x.shape), dtype=x.dtype, device=x.device)
    if x.layout != torch.strided:
        return torch.zeros_like(x)
    return torch.zeros_like(x, memory_format=torch.legacy_contiguous_format)


#: the core's algebra: array_api_compat's torch namespace, with torch's gradcheck zeros
_XP = types.SimpleNamespace(**{**vars(array_api_compat.torch), "zeros_like": _zeros_like})


#: torch dtypes without a NumPy counterpart, and the wider ones their values convert to exactly
_WIDENED_FOR_NUMPY = {torch.bfloat16: torch.float32, torch.complex32: torch.complex64}

_REAL_PROBE_DTYPES = {torch.complex128: torch.float64, torch.complex64: torch.float32}


#: tensor dtypes that ``Tensor.numpy()`` refuses (bfloat16, float8, ...), as met
_NOT_IN_NUMPY: set = set()

def _numpy_dtype(x: torch.Tensor) -> np.dtype:
    """The NumPy dtype of a tensor's dtype."""
    return torch.empty((), dtype=x.dtype).numpy().dtype


#: real floating dtypes and the integers of their size, whose equality is bitwise equality
_SAME_SIZE_INTS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
                   torch.bfloat16: torch.int16}


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    bits = _SAME_SIZE_INTS.get(a.dtype)
    if bits is not None and b.dtype == a.dtype and a.is_contiguous() and b.is_contiguous() and \
            not (a.is_neg() or b.is_neg()):
        return torch.equal(a.view(bits), b.view(bits))
    # conjugate / negative views compare by the values they stand for
    a, b = a.resolve_conj().resolve_neg(), b.resolve_conj().resolve_neg()
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.dtype.is_floating_point:
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}.get(a.element_size())
        if bits is not None:
            return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))
    return torch.equal(a, b)
