"""The engine's plan rules: what follows from a check's shapes and the backend's declared
forms and, for a loop of a few dozen calls, from one call of ``fn`` against a reference
function's; never from seconds.

Whether the engine runs at all follows from the number of calls the element-by-element
loop would make (:func:`loop_calls`): below ``ENGINE_FROM_CALLS`` (on a backend that
compiles a program for every new shape, ``Backend.whole_batches``: ``COMPILED_ENGINE_FACTOR``
times as many) the reference engine decides at once, unless the loop's calls are dear: a
check whose loop makes a few dozen calls or more has one call of ``fn`` priced against a
reference function's call timed beside it (:func:`timed_band`, :func:`loop_is_dear`), a
ratio of CPU times taken in one moment, never seconds. How many rows or
columns one batched call takes follows from the bytes the shapes imply and the memory
budget (:func:`rows_per_chunk`).
"""
from __future__ import annotations

__all__ = ["CHUNK_SHARE", "MAX_BATCH", "ENGINE_FROM_CALLS", "COMPILED_ENGINE_FACTOR",
           "INTERMEDIATES", "BATCHED_VJPS_FROM_CALLS", "TIMED_FROM_SHARE", "DEAR_CALL", "REFERENCE_REPEATS",
           "TIMED_CALLS",
           "loop_calls", "engine_from_calls", "timed_band", "loop_is_dear", "rows_per_chunk", "batch_cap"]

#: one batched call may take at most this fraction of the memory budget
CHUNK_SHARE = 4
#: one batched call takes at most this many rows or columns: beyond it a batch saves
#: little more per row on eager CPU frameworks, and some ops get slower per row (torch's
#: float64 CPU convolutions: a CNN's batched rows at 64 or 256 a call took 2.7 times the
#: CPU time they took at 32, bench/compare.py's samples_cnn), while a batched backward whose
#: memory grows faster than the batch stays bounded. A cap in bytes would not serve better:
#: rows of about the same bytes want opposite caps (samples_cnn, 512 + 512 float64 elements
#: a row, ran 1.3 times faster at 8 rows a call than at 32; complex, 200 + 200 complex128,
#: 2.1 times slower at 8 and 1.17 times faster at 64), and tanh(a @ b) of 48x48 matrices
#: took no less at 64 or with no cap (first check of a process: 0.55 s at 32, 0.64 s at 64,
#: 0.66 s uncapped; the same within noise when warm)
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
#: they replace makes at least this many calls, or where the plan found the loop's calls
#: dear. Some ops' batched backward imports torch._dynamo on its first use in a process
#: (sgn: about 1 s; tests/test_torch_graph.py), which a short loop of cheap VJPs would not
#: repay (torch's own cotangent checks, which imported sympy, are skipped: 0.6 ms for a
#: first batched call otherwise). Engine checks of 40-100 elements took 0.35-0.55 of their
#: CPU time with their VJPs batched (sin(x) x, tanh(W x), cumsum(exp x)): a lower count,
#: with the ops whose batched backward imports more told apart, is worth measuring
BATCHED_VJPS_FROM_CALLS = 256
#: a check whose loop makes fewer calls than ``ENGINE_FROM_CALLS``, but at least this share
#: of them, has one call of ``fn`` priced before the plan (:func:`timed_band`); fewer
#: calls leave the engine too little to save, whatever each costs
TIMED_FROM_SHARE = 4
#: in that band the engine runs where the loop's calls cost at least ``DEAR_CALL *
#: ENGINE_FROM_CALLS`` calls of a reference function (``x + x`` of the input, moved and
#: called as the loop calls ``fn``; :func:`loop_is_dear`). A small function's call costs
#: 1-1.3 of them (sin: 1.1-1.3 quiet and beside two busy processes, 2 at the most seen),
#: which keeps every such check with the loop; over 19 checks of 60-160 calls
#: (``bench/plan_band.py``: chains of ops, SVDs in a custom Function, solves) the engine
#: took 0.68-0.99 of the loop's time from 2 on, 1.04-1.37 times it below
DEAR_CALL = 2
#: the reference function's call is timed this many times and ``fn``'s ``TIMED_CALLS``
#: times, the fastest of each kept: the first call of either costs up to 3 times more
#: (its code cold), 8 times more beside busy processes
REFERENCE_REPEATS = 3
TIMED_CALLS = 2


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


def timed_band(whole_batches: bool) -> range:
    """The loop calls for which one call of ``fn`` is timed before the plan: below
    ``ENGINE_FROM_CALLS`` (the engine runs anyway from there), from its
    ``TIMED_FROM_SHARE``-th (fewer calls leave too little for the engine to save, whatever
    they cost); none on a backend that compiles a program for every new shape, whose
    engine costs compilations that one evaluation does not measure."""
    if whole_batches:
        return range(0)
    return range(ENGINE_FROM_CALLS // TIMED_FROM_SHARE, ENGINE_FROM_CALLS)


def loop_is_dear(calls: int, call_units: float) -> bool:
    """Whether a loop of ``calls`` calls, each ``call_units`` times the call of the
    reference function, costs what the engine's fixed costs repay: as much as
    ``DEAR_CALL * ENGINE_FROM_CALLS`` reference calls."""
    return calls * call_units >= DEAR_CALL * ENGINE_FROM_CALLS


def rows_per_chunk(bytes_per_row: int, allowance: int, n_rows: int, cap: int | None = None) -> int:
    """How many rows (at least one, at most ``n_rows`` and ``cap``) one batched call may
    hold within ``allowance`` bytes."""
    return max(1, min(n_rows, cap or n_rows, allowance // max(bytes_per_row, 1)))


def batch_cap(whole_batches: bool) -> int | None:
    """The most rows or columns one batched call takes: ``MAX_BATCH``, or no cap but the
    memory budget's on a backend that compiles a program for every new batch size
    (``whole_batches``: fewer sizes, fewer compilations)."""
    return None if whole_batches else MAX_BATCH

