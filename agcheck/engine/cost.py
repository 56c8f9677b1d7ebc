"""The engine's plan rules, from a check's shapes and the backend's declared forms, never
from a clock.

The engine runs where the element-by-element loop would make ``ENGINE_FROM_CALLS`` calls
(:func:`loop_calls`; ``COMPILED_ENGINE_FACTOR`` times as many where the backend compiles
per shape). A batched call takes the rows the memory budget holds at the bytes the
shapes imply (:func:`rows_per_chunk`).
"""
from __future__ import annotations

__all__ = ["CHUNK_SHARE", "MAX_BATCH", "FUNCTIONAL_MAX_COPIES", "ENGINE_FROM_CALLS", "COMPILED_ENGINE_FACTOR",
           "INTERMEDIATES", "BATCHED_VJPS_FROM_CALLS",
           "loop_calls", "engine_from_calls", "rows_per_chunk", "batch_cap"]

#: one batched call may take at most this fraction of the memory budget
CHUNK_SHARE = 4
#: the most rows or columns one batched call takes: beyond it eager CPU frameworks save
#: little per row, and some ops get slower (float64 CPU convolutions, bench case
#: samples_cnn: 2.7 times the CPU time at 64 or 256 rows as at 32), while a batched
#: backward whose memory outgrows the batch stays bounded. A cap in bytes measured worse:
#: rows of similar bytes want opposite caps (samples_cnn 1.3 times faster at 8 rows; case
#: complex 2.1 times slower at 8, 1.17 times faster at 64); tanh(a @ b) of 48x48 matrices
#: took no less at 64 or uncapped
MAX_BATCH = 32
#: the most moved copies one call of the ``functional`` batched form takes: its in-place
#: writes go through vmap's per-sample fallback, which copies the whole batch for each
#: sample, so a copy costs more the more copies a call holds (a torch-harmonics SHT on
#: 15x30: 0.08 ms a copy at 16 copies, 0.13 at 32, 0.25 at 64; a plain call 0.21 ms)
FUNCTIONAL_MAX_COPIES = 16
#: bytes per element a batched evaluation keeps alive, relative to its inputs and outputs
INTERMEDIATES = 4
#: checks whose loop makes fewer calls go to the reference engine: the engine's probes
#: cost about what they would save (``bench/engine_threshold.py``, 41 small checks in four
#: modes: at 100, 1.78x torch's checker in total, 1.04x the lowest; at 200, 1.70x and
#: 0.82x; at 50, 1.77x and 0.78x)
ENGINE_FROM_CALLS = 100
#: on a backend that compiles per shape (JAX) the engine runs from this many times
#: ``ENGINE_FROM_CALLS``: its programs compile in 0.1-0.5 s each, a loop call ~0.5 ms
COMPILED_ENGINE_FACTOR = 10
#: VJPs are batched where their loop makes this many calls: below it the first batch's
#: setup costs about what it saves (a backend refuses batched VJPs that would first import
#: much: torch's, sgn's batched backward importing torch._dynamo, about 1 s); roma's suite
#: (``bench/real_suites.py --suite roma``): 1.03 s at 64, 1.14-1.17 s at 256
BATCHED_VJPS_FROM_CALLS = 64


def loop_calls(n_moved: int, n_in: int, n_out: int, *, forward: bool) -> int:
    """The calls of ``fn`` or its derivative the element loop makes: two evaluations per
    element moved (a complex one counts twice in ``n_moved``), and two VJPs per output
    element (Jacobian and reentrancy) in reverse mode, one JVP per input element forward."""
    return 2 * n_moved + (n_in if forward else 2 * n_out)


def engine_from_calls(whole_batches: bool) -> int:
    """The loop calls from which the engine runs."""
    return ENGINE_FROM_CALLS * (COMPILED_ENGINE_FACTOR if whole_batches else 1)


def rows_per_chunk(bytes_per_row: int, allowance: int, n_rows: int, cap: int | None = None) -> int:
    """How many rows (at least one, at most ``n_rows`` and ``cap``) one batched call may
    hold within ``allowance`` bytes."""
    return max(1, min(n_rows, cap or n_rows, allowance // max(bytes_per_row, 1)))


def batch_cap(whole_batches: bool) -> int | None:
    """``MAX_BATCH``, or no cap but the budget's where the backend compiles per shape
    (fewer sizes, fewer compilations)."""
    return None if whole_batches else MAX_BATCH

