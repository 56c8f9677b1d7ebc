"""The engine's cost model: whether the engine runs at all, and when batching pays,
measured as it goes.

First, from the check's first evaluation of ``fn``, the element-by-element loop's cost
is estimated (:func:`loop_seconds`): below ``ENGINE_WORTH_SECONDS`` the reference engine
decides at once. Then every decision compares measured seconds per row (a Jacobian row:
one input element moved, all outputs) or per column (one VJP): the loop's, from the
probe's plain calls, and a batch's, from the batches actually computed. A path is tried
on small batches first (``RAMP``), so a losing one costs little before it is dropped; a
batch size that made rows dearer is not grown further.
"""
from __future__ import annotations

__all__ = ["RAMP", "RETIMED_BELOW", "RETIMED_CALLS", "ENGINE_WORTH_SECONDS", "ENGINE_COMPILATIONS", "loop_seconds",
           "measured_loop_seconds", "rows_per_chunk", "batching_loses", "batching_saves_nothing", "next_batch_size",
           "slope_per_row", "setup_worth_paying", "spent_instead_of_setup"]

#: one batched call may take at most this fraction of the memory budget
CHUNK_SHARE = 4
#: batching is dropped for a loop only when a batched row costs this many times more
#: than a row computed on its own (clearly slower: no batching rule); timings are noisy,
#: and a close call costs nothing either way
CLEARLY_SLOWER = 1.5
#: past the ramp, batching goes on only while a batched row costs this many times less
#: than a row on its own: otherwise it saves no time and costs memory
CLEARLY_FASTER = 1.5
#: a batched pass starts with batches of RAMP[0] rows and doubles them up to RAMP[-1]
#: before a budget-sized batch is tried, so that an op whose batched form is
#: pathologically slow or memory-hungry (cost growing faster than the batch) is caught cheaply
RAMP = (8, 64)
#: checks whose element-by-element loop is estimated below this many seconds go to the
#: reference engine at once: the engine's probes and ramps would cost about as much as
#: they save. On torch's CPU, 150 checks of 10 to 160 elements (gradcheck with and without
#: forward mode, gradgradcheck both ways; ``bench/engine_threshold.py``): below about 8 ms
#: of estimated loop the reference took 0.45-1.0x the engine's time, from about 15 ms the
#: engine 0.25-0.65x the reference's
ENGINE_WORTH_SECONDS = 0.008
#: where no input can be batched, batched VJPs are tried only when the two passes of one
#: VJP per output element are estimated (from one evaluation) at this many seconds or
#: more: a first batched VJP costs about a millisecond beside the loop's, and its first
#: use in a process brings in vmap's code pages (2-9 MB)
VJP_BATCHING_WORTH_SECONDS = 0.02
#: what each call of the loop costs beside ``fn``'s own evaluation: the element move or
#: one-hot cotangent, the backward's own work, writing the row (torch's CPU, measured on
#: checks of 2 to 128 elements: 20 to 25 µs)
LOOP_CALL_SECONDS = 20e-6
#: a small first batch that took this long, and costs clearly more per row or column than
#: the loop, is judged on its own (fixed costs cannot explain it)
PROBE_SECONDS = 0.05


def loop_seconds(n_in: int, n_out: int, evaluation_seconds: float) -> float:
    """The element-by-element check's cost, estimated from one evaluation of fn: two
    evaluations per input element (central differences) and two backward passes per output
    element (the Jacobian and its reentrancy check), a backward costing about an
    evaluation, each call with the loop's own cost (``LOOP_CALL_SECONDS``) beside it."""
    return (2 * n_in + 2 * n_out) * (evaluation_seconds + LOOP_CALL_SECONDS)


def measured_loop_seconds(evaluations: int, backward_passes: int, evaluation_seconds: float,
                          backward_seconds: float) -> float:
    """The element-by-element check's cost from the loop's own calls, each timed as the loop
    makes it (an element moved; a one-hot cotangent): used where one traced evaluation is
    no measure of them (JAX's trace linearises ``fn``: several evaluations' work)."""
    return evaluations * evaluation_seconds + backward_passes * backward_seconds


#: on a backend that compiles every new program (``Backend.engine_setup_seconds``), the
#: engine's set-up is priced at this many times the compilation the check's first
#: evaluation paid (first evaluation minus the same one again, warm): the engine compiles
#: several programs of about that size (batched evaluations, batched VJPs, their probes).
#: JAX's CPU, functions first checked in a fresh process (an MLP, softmax, logsumexp,
#: cumsum, a convolution, a matmul): the engine's first call cost 3 to 11 times (median
#: 4.4) that compilation more than the loop's first call
ENGINE_COMPILATIONS = 4


#: a loop estimated between ``ENGINE_WORTH_SECONDS`` and this many times it, from one timed
#: evaluation, of at least ``RETIMED_CALLS`` calls, has a second evaluation timed and is
#: priced from the faster (one more call: a few milliseconds at most, a sixteenth of the
#: loop at most, against the engine's probes for a check the loop does cheaply); a
#: forward-mode loop of fewer calls has no JVP timed either (``JVP_TIMED_FROM_SECONDS``)
RETIMED_BELOW = 4
RETIMED_CALLS = 16


#: a forward-mode check whose loop is estimated (as :func:`loop_seconds`) above this, and
#: makes at least ``RETIMED_CALLS`` calls, has one JVP timed before the choice, which JVPs
#: far dearer than an evaluation can change
JVP_TIMED_FROM_SECONDS = ENGINE_WORTH_SECONDS / 4


def forward_loop_seconds(n_moved: int, n_in: int, evaluation_seconds: float, jvp_seconds: float) -> float:
    """The element-by-element forward-mode check's cost: two evaluations per input element
    moved (a complex one counts twice) and one JVP of ``jvp_seconds`` per input element."""
    return 2 * n_moved * (evaluation_seconds + LOOP_CALL_SECONDS) + n_in * (jvp_seconds + LOOP_CALL_SECONDS)


def rows_per_chunk(bytes_per_row: int, allowance: int, n_rows: int) -> int:
    """How many rows (at least one, at most ``n_rows``) one batched call may hold within
    ``allowance`` bytes."""
    return max(1, min(n_rows, allowance // max(bytes_per_row, 1)))


def batching_loses(per_batched: float, per_looped: float, size: int, seconds: float) -> bool:
    """Whether a batch of ``size`` rows (or columns) that took ``seconds`` shows batching
    to be clearly slower than one at a time: judged once the batch is large enough to
    amortise fixed costs, or took long enough that fixed costs cannot explain it."""
    if per_batched <= CLEARLY_SLOWER * per_looped:
        return False
    return size >= RAMP[-1] or seconds >= PROBE_SECONDS


def batching_saves_nothing(per_batched: float, per_looped: float, size: int) -> bool:
    """Whether a batch large enough to amortise fixed costs is still not clearly faster per
    row (or column) than one at a time. Then batching only costs memory: a framework may
    run the batch element by element anyway (torch's float64 CPU convolutions do, with a
    workspace for the whole batch), so larger batches would hold more and save nothing."""
    return size >= RAMP[-1] and per_batched * CLEARLY_FASTER > per_looped


def slope_per_row(probe_seconds: float | None, probe_rows: int, seconds: float, rows: int) -> float | None:
    """What one more row adds to a batch, from two batches of different sizes (the probe's
    and the first one): the cost of a row once fixed costs are amortised."""
    if probe_seconds is None or rows <= probe_rows:
        return None
    return (seconds - probe_seconds) / (rows - probe_rows)


def next_batch_size(per_row: dict[int, float], looped: float, chunk: int, *, seconds: float,
                    slope: float | None = None) -> tuple[int | None, str]:
    """The size of the next batch, or ``None`` (with the reason) to finish by the loop.

    Parameters
    ----------
    per_row : dict
        Seconds per row of each batch size tried so far, in the order tried.
    looped : float
        Seconds per row one at a time.
    chunk : int
        The largest batch the memory budget allows.
    seconds : float
        Wall seconds of the last batch.
    slope : float, optional
        Seconds one more row adds to a batch (:func:`slope_per_row`), when known: a
        batch whose rows cost clearly more than the loop's even at scale is losing already.
    """
    last = list(per_row)[-1]
    if batching_loses(per_row[last], looped, last, seconds):
        return None, "batched was slower"
    if slope is not None and slope > CLEARLY_SLOWER * looped:
        return None, "batched rows cost more than looped ones at any size"
    best = min(per_row, key=per_row.get)
    if best == last and last < chunk and last < RAMP[-1]:  # growing has paid so far: double
        return min(2 * last, chunk), ""
    # settled (a larger batch made rows dearer, or the ramp or the budget is done): the
    # best size must be clearly faster than the loop, or batching only costs memory
    if batching_saves_nothing(per_row[best], looped, RAMP[-1]):
        return None, "batched was not faster"
    if best == last and last < chunk:
        return chunk, ""
    return best, ""


#: seconds this process has spent computing plainly what a batched call would compute
#: after a one-time setup (e.g. an import)
_spent_instead_of_setup = 0.0


def setup_worth_paying(setup_seconds: float) -> bool:
    """Whether to pay a one-time setup now: once the plain calls made to avoid it have
    cost as much as the setup (rent until the rent reaches the price, then buy: never
    more than twice the better choice, whatever the checks to come)."""
    return setup_seconds <= 0 or _spent_instead_of_setup >= setup_seconds


def spent_instead_of_setup(seconds: float) -> None:
    """Count ``seconds`` of plain calls made to avoid a one-time setup."""
    global _spent_instead_of_setup
    _spent_instead_of_setup += seconds
