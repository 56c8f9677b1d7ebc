"""Broken backward formulas over OpInfo ops: agcheck catches whatever torch catches.

The harness is ``tests/broken_formulas.py``. Two tiers:

- ``test_ci_slice``: ~15 ops (elementwise, binary, reductions, linalg, indexing, multiple
  outputs), the first samples of each, slow and fast mode. Runs by default.
- ``test_full_sweep``: every float64 autograd op of op_db, every sample, slow and fast
  mode; marked ``opinfo`` (deselected by default): ``pytest -m opinfo -k broken``.

Asserted: every broken sample torch catches, agcheck catches; no correct sample torch
passes fails under agcheck.
"""
from __future__ import annotations

import pytest

try:
    import broken_formulas as bf
except ImportError:  # run from the repository root
    from tests import broken_formulas as bf

# (op full name, sample indices): small samples, so the slice runs in well under a minute
CI_OPS = [
    ("cos", (0,)), ("exp", (0,)), ("sigmoid", (0,)), ("mul", (0,)), ("div.no_rounding_mode", (0,)),
    ("pow", (0,)), ("sum", (0,)), ("mean", (0,)), ("logsumexp", (0,)), ("cumsum", (0,)),
    ("matmul", (0,)), ("linalg.det", (2,)), ("max.reduction_with_dim", (2,)), ("index_select", (0,)),
    ("softmax", (0,)), ("t", (0,)),
]


def _assert_verdicts(counts):
    assert counts.rows, "nothing was compared"
    missed = [r for r in counts.rows if r.kind != "correct" and r.torch != "pass" and r.agcheck == "pass"]
    alarms = [r for r in counts.rows if r.kind == "correct" and r.torch == "pass" and r.agcheck != "pass"]
    assert not missed, f"broken formulas torch catches and agcheck misses: {missed}"
    assert not alarms, f"false alarms on correct ops torch passes: {alarms}"


@pytest.mark.parametrize("op_name,samples", CI_OPS, ids=[n for n, _ in CI_OPS])
def test_ci_slice(op_name, samples):
    ops = [op for op in bf.float64_ops(op_name) if op.full_name == op_name or op.name == op_name]
    assert ops, f"no float64 autograd op {op_name!r}"
    counts = bf.Counts()
    for op in ops[:1]:
        counts.add(bf.run_op(op, modes=("slow", "fast"), samples=samples))
    _assert_verdicts(counts)
    # a broken formula that changes the gradient is caught by torch on these ops
    assert any(r.kind != "correct" and r.torch != "pass" for r in counts.rows)


def _all_ops():
    try:
        return [op.full_name for op in bf.float64_ops()]
    except Exception:  # noqa: BLE001 - op_db unavailable: the sweep has nothing to run
        return []


@pytest.mark.opinfo
@pytest.mark.parametrize("op_name", _all_ops())
def test_full_sweep(op_name):
    ops = [op for op in bf.float64_ops(op_name) if op.full_name == op_name]
    counts = bf.Counts()
    for op in ops:
        counts.add(bf.run_op(op, modes=("slow", "fast")))
    if not counts.rows:
        pytest.skip("no usable float64 sample")
    _assert_verdicts(counts)


def test_force_engine_runs_every_check_through_the_engine_and_is_undone(monkeypatch, capsys):
    from agcheck.engine import cost

    before = cost.ENGINE_FROM_CALLS, cost.BATCHED_VJPS_FROM_CALLS
    seen, real_run_op = [], bf.run_op

    def run_op(op, **kw):
        seen.append((cost.ENGINE_FROM_CALLS, cost.BATCHED_VJPS_FROM_CALLS))
        counts = real_run_op(op, **kw)
        _assert_verdicts(counts)
        return counts

    monkeypatch.setattr(bf, "run_op", run_op)
    assert bf.main(["--ops", "exp", "--limit", "1", "--force-engine"]) == 0
    assert seen == [(0.0, 0.0)]
    assert (cost.ENGINE_FROM_CALLS, cost.BATCHED_VJPS_FROM_CALLS) == before
    assert "DISAGREE" not in capsys.readouterr().out
    assert bf.main(["--ops", "exp", "--limit", "1"]) == 0
    assert seen[-1] == before
