"""Colourings and sign patterns for coloured differences: NumPy over index arrays."""
from __future__ import annotations

import math

import numpy as np

__all__ = ["SIGN_SEED", "bits_for", "index_signs", "rank_in_class", "colour_columns"]

SIGN_SEED = 8191


def bits_for(n: int) -> int:
    return max(1, math.ceil(math.log2(max(n, 2))))


def index_signs(count: int, n_patterns: int, rng) -> np.ndarray:
    """``(n_patterns, count)`` signs: all +1, then one pattern per index bit, then random."""
    signs = np.empty((n_patterns, count), dtype=np.int8)
    signs[0] = 1
    index, bits, b = np.arange(count), bits_for(count), 0
    for r in range(1, n_patterns):
        if b < bits and (1 << b) < count:
            signs[r] = 1 - 2 * ((index >> b) & 1)
            b += 1
        else:
            signs[r] = 1 - 2 * rng.integers(0, 2, size=count)
    return signs


def rank_in_class(colour) -> np.ndarray:
    """Each element's rank among the elements of its colour, in index order."""
    order = np.argsort(colour, kind="stable")
    sizes = np.bincount(colour)
    ranks = np.empty(len(colour), dtype=np.int64)
    ranks[order] = np.arange(len(colour)) - (np.cumsum(sizes) - sizes)[colour[order]]
    return ranks


def _valid_colouring(colour, rows, cols) -> bool:
    keys = rows.astype(np.int64) * (int(colour.max()) + 1) + colour[cols]
    return int(np.bincount(keys).max()) <= 1


def colour_columns(rows, cols, n_cols, limit):
    """A colouring of the input elements ``cols`` such that no output element (``rows``) meets
    two of one colour, or ``None`` past ``limit`` colours: strided (fits banded and blocked
    patterns), else greedy."""
    if not len(rows):
        return np.zeros(n_cols, dtype=np.int64)
    width = int(np.bincount(rows).max())
    if width > limit:  # the widest row needs that many colours
        return None
    index = np.arange(n_cols)
    for colour in (index % width, index // -(-n_cols // width)):
        if _valid_colouring(colour, rows, cols):
            return colour
    order = np.argsort(cols, kind="stable")
    rows, cols = rows[order], cols[order]
    bounds = np.searchsorted(cols, np.arange(n_cols + 1))
    used = np.zeros((int(rows.max()) + 1, limit + 1), dtype=bool)
    colour = np.zeros(n_cols, dtype=np.int64)
    for j in range(n_cols):
        r = rows[bounds[j]:bounds[j + 1]]
        if not len(r):
            continue
        c = int(np.flatnonzero(~used[r].any(axis=0))[0])
        if c >= limit:
            return None
        colour[j] = c
        used[r, c] = True
    return colour
