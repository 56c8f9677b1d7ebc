"""Sparse (COO, CSR, CSC, BSR, BSC) and MKL-DNN inputs of the torch backend.

The core moves an input through a :class:`~agcheck.backend.Perturber` and lays the rows of a
numerical Jacobian out by the elements of the input's *dense equivalent*. For a sparse input
this module supplies what that needs:

* the stored scalar values, aliased so that moving one moves the input in place (slow mode,
  as torch does it: a function that reads the input through a closure sees the move);
* for each stored value, the flat index of the dense element it specifies (its Jacobian
  row; the rows of unspecified elements stay zero);
* densification (every element specified, the unspecified ones as explicit zeros) for the
  numerical side of an unmasked check (``masked=False`` or ``None``);
* fast-mode probe vectors drawn as torch draws them (one random number per stored value,
  zero at the unspecified elements);
* snapshots to prove an input's values *and* indices unchanged.

MKL-DNN tensors are opaque: the numerical side works on a strided copy and hands ``fn`` a
fresh MKL-DNN tensor made from it for every evaluation, as torch does; the input itself is
never written to.

Only the torch backend imports this module; the core knows nothing of layouts beyond the
generic hooks (``Backend.layout``, ``Backend.densify``, ``Perturber.dense_rows``,
``Perturber.direction``).
"""
from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
import torch

from agcheck.backends.torch_perturber import VALUES_ONLY, InPlacePerturber, detached_outputs

__all__ = [
    "SPARSE_LAYOUTS",
    "COMPRESSED_LAYOUTS",
    "is_sparse",
    "is_mkldnn",
    "layout_name",
    "stored_values",
    "components",
    "dense_positions",
    "densify",
    "probe_vector",
    "validated_content",
    "snapshot",
    "unchanged",
    "restore",
    "reject_forward_ad",
    "perturber",
    "SparsePerturber",
    "MkldnnPerturber",
]

SPARSE_LAYOUTS = frozenset({torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc})
COMPRESSED_LAYOUTS = frozenset({torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc})
_ROW_MAJOR_COMPRESSED = frozenset({torch.sparse_csr, torch.sparse_bsr})
_BLOCKED = frozenset({torch.sparse_bsr, torch.sparse_bsc})


# -- inspection ---------------------------------------------------------------------------


def is_sparse(x) -> bool:
    return isinstance(x, torch.Tensor) and x.layout in SPARSE_LAYOUTS


def is_mkldnn(x) -> bool:
    return isinstance(x, torch.Tensor) and x.layout == torch._mkldnn


def layout_name(x) -> str:
    """``"dense"`` for a strided tensor, else ``"sparse_coo"``, ``"sparse_csr"``, ..., ``"mkldnn"``."""
    if x.layout == torch.strided:
        return "dense"
    if x.layout == torch._mkldnn:
        return "mkldnn"
    return str(x.layout).replace("torch.", "")


def _compressed_indices(x) -> tuple:
    if x.layout in _ROW_MAJOR_COMPRESSED:
        return x.crow_indices(), x.col_indices()
    return x.ccol_indices(), x.row_indices()


def _raw_values(x) -> torch.Tensor:
    return x._values() if x.layout == torch.sparse_coo else x.values()


def stored_values(x) -> torch.Tensor:
    """The stored values of sparse ``x``, aliasing its storage, outside autograd.

    Writing into the result moves ``x`` in place without touching the version counter
    autograd checks (torch's numerical Jacobian goes through ``.data`` the same way).
    """
    return _raw_values(x).data


def components(x) -> tuple:
    """The tensors that make up sparse ``x``: its index tensors, then its values."""
    if x.layout == torch.sparse_coo:
        return (x._indices(), x._values())
    return (*_compressed_indices(x), x.values())


# -- where each stored value sits -----------------------------------------------------------


def dense_positions(x) -> torch.Tensor:
    """For each stored scalar of sparse ``x`` (row-major over its values array), the flat
    index of the dense element it specifies.

    COO inputs may be uncoalesced: two stored values may then specify the same element.
    """
    values = _raw_values(x)
    device = values.device
    if x.layout == torch.sparse_coo:
        sparse_dim = x.sparse_dim()
        inner = math.prod(x.shape[sparse_dim:])  # scalars per stored (dense-dims) block
        indices = x._indices()
        flat = torch.zeros(indices.shape[1], dtype=torch.int64, device=device)
        for d in range(sparse_dim):
            flat = flat * int(x.shape[d]) + indices[d]
        offsets = torch.arange(inner, dtype=torch.int64, device=device)
        return (flat.unsqueeze(1) * inner + offsets.unsqueeze(0)).reshape(-1)
    # compressed layouts (with batch, block and dense dimensions alike): label every
    # stored scalar 1..n, densify the labels and read back where each one landed
    n = values.numel()
    labels = torch.arange(1, n + 1, dtype=torch.int64, device=device).reshape(values.shape)
    ci, pi = _compressed_indices(x)
    labelled = torch.sparse_compressed_tensor(ci, pi, labels, tuple(x.shape), layout=x.layout, device=device)
    dense_labels = labelled.to_dense().reshape(-1)
    where = torch.nonzero(dense_labels).reshape(-1)
    if where.numel() != n:
        raise RuntimeError(
            f"a {x.layout} input specifies {n} values but only {where.numel()} distinct "
            "elements: its indices are invalid (repeated entries)"
        )
    positions = torch.empty(n, dtype=torch.int64, device=device)
    positions[dense_labels[where] - 1] = where
    return positions


# -- densification --------------------------------------------------------------------------


def _row_major_indices(shape, device) -> torch.Tensor:
    """The indices of every element of ``shape``, in row-major order: ``(len(shape), n)``."""
    n = math.prod(shape)
    rest = torch.arange(n, dtype=torch.int64, device=device)
    rows = []
    for size in reversed(tuple(shape)):
        rows.append(rest % size)
        rest = rest // size
    if not rows:
        return torch.zeros((0, n), dtype=torch.int64, device=device)
    return torch.stack(rows[::-1])


def _densify_coo(x) -> torch.Tensor:
    sparse_dim = x.sparse_dim()
    sparse_shape = tuple(x.shape[:sparse_dim])
    device = x.device
    merged = x.detach().coalesce()  # repeated entries are summed, as to_dense() sums them
    values = torch.zeros((math.prod(sparse_shape), *x.shape[sparse_dim:]), dtype=x.dtype, device=device)
    if merged._nnz():
        flat = torch.zeros(merged._nnz(), dtype=torch.int64, device=device)
        idx = merged._indices()
        for d, size in enumerate(sparse_shape):
            flat = flat * size + idx[d]
        values[flat] = merged._values()
    indices = _row_major_indices(sparse_shape, device)
    full = torch.sparse_coo_tensor(indices, values, tuple(x.shape), device=device, is_coalesced=True)
    return full.requires_grad_(x.requires_grad)


def densify(x):
    """Sparse ``x`` with every element specified (unspecified ones as explicit zeros), a
    new tensor with ``x``'s layout, block size and ``requires_grad``; any other tensor is
    returned as it is (MKL-DNN tensors too: torch leaves them alone)."""
    if not is_sparse(x):
        return x
    if x.layout == torch.sparse_coo:
        return _densify_coo(x)
    blocksize = tuple(x.values().shape[1:3]) if x.layout in _BLOCKED else None
    via_coo = _densify_coo(x.detach().to_sparse(layout=torch.sparse_coo))
    full = via_coo.to_sparse(layout=x.layout, blocksize=blocksize)
    specified = full.values().numel()
    if specified != x.numel():
        raise AssertionError(
            f"{x.layout} densification left elements unspecified: {specified} of {x.numel()} stored"
        )
    return full.requires_grad_(x.requires_grad)


# -- fast-mode probes -----------------------------------------------------------------------


def probe_vector(x, generator, dtype) -> torch.Tensor:
    """A flat unit vector over the dense elements of sparse ``x``: random non-negative
    numbers at the specified elements, zeros elsewhere.

    Drawn as torch's fast mode draws it (one number per stored value, normalised over the
    stored values); repeated COO entries add up at their element, as ``to_dense`` adds them.
    """
    n_stored = _raw_values(x).numel()
    draws = torch.rand(n_stored, generator=generator, device=generator.device)
    draws = draws.to(dtype=dtype, device=x.device)
    draws /= draws.norm()
    dense = torch.zeros(x.numel(), dtype=dtype, device=x.device)
    dense.index_put_((dense_positions(x),), draws, accumulate=True)
    return dense


# -- validation and snapshots ---------------------------------------------------------------


def validated_content(idx: int, x):
    """The tensor whose strides torch checks for input ``idx`` (the stored values of a
    sparse input), ``None`` for MKL-DNN (opaque, nothing to check)."""
    if x.layout == torch.sparse_coo:
        return x._values()
    if x.layout in COMPRESSED_LAYOUTS:
        return x.values()
    if x.layout == torch._mkldnn:
        return None
    raise NotImplementedError(
        f"input {idx} has layout {x.layout}; agcheck's torch backend checks strided, sparse "
        "(COO, CSR, CSC, BSR, BSC) and MKL-DNN tensors"
    )


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype.is_floating_point:
        width = {2: torch.int16, 4: torch.int32, 8: torch.int64}.get(t.element_size())
        if width is not None:
            return t.contiguous().view(width)
    return t


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def snapshot(x):
    """A copy of what makes up non-strided ``x`` (indices and values; an MKL-DNN
    tensor's strided copy), to tell later whether ``x`` was modified."""
    if is_sparse(x):
        return tuple(t.detach().clone() for t in components(x))
    if is_mkldnn(x):
        return x.detach().to_dense()
    return None


def unchanged(x, snap) -> bool:
    if snap is None:
        return True
    if is_mkldnn(x):
        return _same_bits(x.detach().to_dense(), snap)
    now = components(x)
    return len(now) == len(snap) and all(_same_bits(a, b) for a, b in zip(now, snap))


def restore(x, snap) -> None:
    """Write ``snap`` back into sparse ``x`` where the shapes still agree (an MKL-DNN
    tensor cannot be written in place: nothing to do)."""
    if snap is None or not is_sparse(x):
        return
    with torch.no_grad():
        for now, then in zip(components(x), snap):
            if now.shape == then.shape and not _same_bits(now, then):
                now.data.copy_(then)


def reject_forward_ad(x) -> None:
    """Raise what torch raises when forward-mode AD meets sparse ``x`` (a dual tensor with
    a sparse primal cannot be made: NotImplementedError for COO, RuntimeError for the
    compressed layouts). Call inside ``forward_ad.dual_level()``; a torch that can make
    the dual lets the call through."""
    import torch.autograd.forward_ad as fwAD

    fwAD.make_dual(x.detach(), torch.zeros_like(x))


# -- perturbers -----------------------------------------------------------------------------


class SparsePerturber(InPlacePerturber):
    """Moves the stored values of a sparse input.

    Element ``k`` is the ``k``-th stored scalar (row-major over the values array). Slow
    mode moves it in place and evaluates ``fn`` on the input itself; fast mode moves a
    clone of the input along the probe and evaluates ``fn`` on the clone (torch's
    behaviour in both cases).
    """

    def __init__(self, x: torch.Tensor, args, position: int, as_tuple):
        self.x = x
        self.args = args
        self.position = position
        self._as_tuple = as_tuple
        self.values = stored_values(x)
        self.data = self.values
        self.numel = self.values.numel()
        self.shape = tuple(x.shape)
        self._positions = dense_positions(x)
        self._flat = self.values.view(-1) if self.values.is_contiguous() else None

    def dense_rows(self):
        return self.x.numel(), self._positions.tolist()

    def direction(self, u):
        """The dense flat probe ``u`` read at the stored elements: a step for the values.

        Where an uncoalesced COO input stores an element several times, the first of them
        takes the element's whole move and the others stay: the element (the sum of its
        entries, which is what to_dense, coalesce and sparse ops see) moves by ``u`` there,
        as in torch, whose probe moves each entry by its own share.
        """
        positions = self._positions.to(u.device)
        step = u.reshape(-1)[positions]
        repeated = self._repeated_entries()
        if repeated is not None:
            step = torch.where(repeated.to(u.device), torch.zeros_like(step), step)
        return step.reshape(self.values.shape)

    def _repeated_entries(self):
        """A mask of the stored entries that repeat an earlier entry's element, or None."""
        if not hasattr(self, "_repeats"):
            self._repeats = None
            if self.x.layout == torch.sparse_coo and not self.x.is_coalesced():
                order = torch.argsort(self._positions, stable=True)
                ordered = self._positions[order]
                later = torch.zeros_like(ordered, dtype=torch.bool)
                later[1:] = ordered[1:] == ordered[:-1]
                if bool(later.any()):
                    self._repeats = torch.empty_like(later)
                    self._repeats[order] = later
        return self._repeats

    def index(self, flat: int) -> tuple:
        where = int(self._positions[flat])
        return tuple(int(i) for i in np.unravel_index(where, self.shape)) if self.shape else ()

    def evaluate_direction(self, fn, step, sign) -> tuple:
        with torch.no_grad():
            moved = self.x.detach().clone()
            values = stored_values(moved)
            values.copy_(values - step if sign < 0 else values + step)
        moved.requires_grad_(self.x.requires_grad)
        args = list(self.args)
        args[self.position] = moved
        token = VALUES_ONLY.set(True)
        try:  # fn is called from this frame
            return detached_outputs(self._as_tuple, fn(*args))
        finally:
            VALUES_ONLY.reset(token)


class MkldnnPerturber(InPlacePerturber):
    """Moves a strided copy of an MKL-DNN input; ``fn`` gets a fresh MKL-DNN tensor made
    from the copy at every evaluation (the input itself is never written to)."""

    def __init__(self, x: torch.Tensor, args, position: int, as_tuple):
        with torch.no_grad():
            self.data = x.detach().to_dense()
        self.args = args
        self.position = position
        self._as_tuple = as_tuple
        self.shape = tuple(x.shape)
        self.numel = self.data.numel()
        self._flat = self.data.view(-1)

    def _arguments(self) -> tuple:
        args = list(self.args)
        args[self.position] = self.data.to_mkldnn()
        return tuple(args)


@contextmanager
def perturber(args, position: int, as_tuple):
    """A perturber for the non-strided ``args[position]``; a sparse input's values are
    restored bitwise on exit (also when ``fn`` raised)."""
    x = args[position]
    if is_mkldnn(x):
        yield MkldnnPerturber(x, args, position, as_tuple)
        return
    if not is_sparse(x):
        validated_content(position, x)  # raises for layouts nobody handles
    p = SparsePerturber(x, args, position, as_tuple)
    original = p.values.clone()
    try:
        yield p
    finally:
        if not _same_bits(p.values, original):
            with torch.no_grad():
                p.values.copy_(original)
