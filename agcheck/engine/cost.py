"""The engine's plan rules: what follows from a check's shapes and the backend's declared
forms, never from the time anything took.

Whether the engine runs at all follows from the number of calls the element-by-element
loop would make (:func:`loop_calls`): below ``ENGINE_FROM_CALLS`` (on a backend that
compiles a program for every new shape, ``Backend.whole_batches``: ``COMPILED_ENGINE_FACTOR``
times as many) the reference engine decides at once. How many rows or
columns one batched call takes follows from the bytes the shapes imply and the memory
budget (:func:`rows_per_chunk`).
"""
from __future__ import annotations

__all__ = ["CHUNK_SHARE", "RAMP", "MAX_BATCH", "ENGINE_FROM_CALLS", "COMPILED_ENGINE_FACTOR",
           "INTERMEDIATES", "BATCHED_VJPS_FROM_CALLS", "loop_calls", "engine_from_calls", "rows_per_chunk", "batch_cap"]

#: one batched call may take at most this fraction of the memory budget
CHUNK_SHARE = 4
#: the sizes a pass that builds its moves chunk by chunk starts from and grows to before
#: the memory budget sets its chunks (:mod:`agcheck.engine.compressed`)
RAMP = (8, 64)
#: one batched call takes at most this many rows or columns: beyond it a batch saves
#: little more per row on eager CPU frameworks, and some ops get slower per row (torch's
#: float64 CPU convolutions: a CNN's batched rows at 64 or 256 a call took 2.7 times the
#: CPU time they took at 32, bench/compare.py's samples_cnn), while a batched backward whose
#: memory grows faster than the batch stays bounded
MAX_BATCH = 32
#: bytes per element a batched evaluation keeps alive, relative to its inputs and outputs
INTERMEDIATES = 4
#: checks whose element-by-element loop makes fewer calls go to the reference engine:
#: the engine's probes (a batched evaluation, the plain calls it must agree with) cost
#: about what they would save. On torch's CPU a loop call of a small function costs some
#: 30-40 µs; ``bench/engine_threshold.py`` put the crossing between the loop and the
#: engine at 6-8 ms of loop over 38 small checks, about 200 calls
ENGINE_FROM_CALLS = 200
#: on a backend that compiles a program for every new shape (JAX) the engine runs from
#: this many times ``ENGINE_FROM_CALLS``: it compiles several programs (batched
#: evaluations, VJPs, their probes), 0.1-0.5 s each on JAX's CPU, against a loop call of
#: about half a millisecond
COMPILED_ENGINE_FACTOR = 10
#: batched VJPs (many cotangents in one backward pass) are used where the loop of VJPs
#: they replace makes at least this many calls. A framework's first batched backward in a
#: process may import code the loop does not need (torch: its symbolic shapes, sympy,
#: 0.3-0.7 s, once per process, and already there wherever torch's own code used them);
#: from here on a check's batches save 5-50 ms against its loop of VJPs
BATCHED_VJPS_FROM_CALLS = 256


def loop_calls(n_moved: int, n_in: int, n_out: int, *, forward: bool) -> int:
    """The calls of ``fn`` or of its derivative the element-by-element check makes: two
    evaluations per input element moved (central differences; a complex element is moved
    along two axes and counts twice in ``n_moved``), and two VJPs per output element (the
    Jacobian and its reentrancy check) in reverse mode, one JVP per input element in
    forward mode."""
    return 2 * n_moved + (n_in if forward else 2 * n_out)


def engine_from_calls(whole_batches: bool) -> int:
    """The loop calls from which the engine runs, on a backend that compiles a program
    for every new shape (``whole_batches``) or not."""
    return ENGINE_FROM_CALLS * (COMPILED_ENGINE_FACTOR if whole_batches else 1)


def rows_per_chunk(bytes_per_row: int, allowance: int, n_rows: int, cap: int | None = None) -> int:
    """How many rows (at least one, at most ``n_rows`` and ``cap``) one batched call may
    hold within ``allowance`` bytes."""
    return max(1, min(n_rows, cap or n_rows, allowance // max(bytes_per_row, 1)))


def batch_cap(whole_batches: bool) -> int | None:
    """The most rows or columns one batched call takes: ``MAX_BATCH``, or no cap but the
    memory budget's on a backend that compiles a program for every new batch size
    (``whole_batches``: fewer sizes, fewer compilations)."""
    return None if whole_batches else MAX_BATCH

