"""The engine's plan is a function of the check, not of the machine's load: the same checks
run with and without two busy processes beside them make the same decisions (every event
of their engine logs, figures included) and reach the same verdicts. Within the engine, three
choices are timed (plain calls, or an input's samples moved together, against a batched
chunk; one VJP per column against a batch of them): each a ratio of two CPU times taken in
one moment, which the load leaves as it is, but whose plain side is a call of tens of
microseconds: a ratio within a factor of two of its margin (several of these checks' are)
can flip once under load. A check whose plans differ is therefore run again, quiet and
loaded; a plan that follows the load differs again, and fails."""
import importlib.util
from pathlib import Path

import torch

import agcheck

from .helpers import OneEntryOff, ScaledSin, make

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _busy_loops():
    spec = importlib.util.spec_from_file_location("_busy_under_test", BENCH / "busy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.busy_loops


W = make(300, 300, seed=3).detach() / 20
W6 = make(6, 6, seed=20).detach()


def _checks():
    """``(name, checker, fn, inputs, options)``: a small check (the reference engine at
    once), a medium one (batched rows, VJPs one at a time), the same with a wrong backward,
    an elementwise one of 4,000 elements (compressed differences), one whose batched forms
    are refused (ScaledSin has no vmap rule, and its copies laid end to end do not fit w),
    forward mode, and a gradgradcheck."""
    return [
        ("small", agcheck.gradcheck, torch.sin, (make(4, 5),), {}),
        ("medium", agcheck.gradcheck, lambda a, b: torch.tanh(a @ b), (make(24, 24), make(24, 24, seed=1)), {}),
        ("medium, wrong", agcheck.gradcheck, lambda a, b: OneEntryOff.apply(a @ b),
         (make(24, 24), make(24, 24, seed=1)), {}),
        ("elementwise", agcheck.gradcheck, lambda t: torch.sin(t) * 2, (make(4000),), {}),
        ("refused", agcheck.gradcheck, lambda t: ScaledSin.apply(W6 @ t), (make(6, 10, seed=21),), {}),
        ("forward", agcheck.gradcheck, lambda t: torch.tanh(W @ t), (make(300),),
         {"check_forward_ad": True, "check_backward_ad": False, "check_undefined_grad": False}),
        ("gradgradcheck", agcheck.gradgradcheck, lambda t: torch.sin(t) * t, (make(300),), {}),
    ]


def _plans(monkeypatch, names=None) -> dict:
    """Per check (those ``names``, or all): its verdict and every event of its runs' engine
    logs."""
    from agcheck.core.run import CheckRun

    runs = []
    original = CheckRun.__init__

    def recorded(self, *args, **kwargs):
        original(self, *args, **kwargs)
        runs.append(self)

    plans = {}
    with monkeypatch.context() as m:
        m.setattr(CheckRun, "__init__", recorded)
        for name, checker, fn, inputs, options in _checks():
            if names is not None and name not in names:
                continue
            runs.clear()
            verdict = checker(fn, inputs, raise_exception=False, **options)
            plans[name] = (verdict, [[(e.path, e.decision, e.subject, e.detail, e.via, e.figures)
                                      for e in run.engine_log] for run in runs])
    return plans


def test_the_same_checks_make_the_same_plans_on_a_busy_machine(monkeypatch):
    # one intra-op thread, as pytest-xdist's workers run: with several, an oversubscribed
    # machine makes torch's threads spin at their barriers, which inflates the calling
    # thread's CPU time of a timed call (the samples' batched chunk against a plain call,
    # medium below) by milliseconds (docs/performance.md)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        quiet = _plans(monkeypatch)
        with _busy_loops()(2, niceness=0):
            loaded = _plans(monkeypatch)
        flipped = [name for name in quiet if loaded[name] != quiet[name]]
        if flipped:  # once more: a timed ratio near its margin flips by chance, not twice
            quiet.update(_plans(monkeypatch, flipped))
            with _busy_loops()(2, niceness=0):
                loaded.update(_plans(monkeypatch, flipped))
    finally:
        torch.set_num_threads(threads)
    assert loaded == quiet
    verdicts = {name: verdict for name, (verdict, _) in quiet.items()}
    assert verdicts == {"small": True, "medium": True, "medium, wrong": False, "elementwise": True,
                        "refused": True, "forward": True, "gradgradcheck": True}
    first_events = {name: logs[0][0][:2] for name, (_, logs) in quiet.items()}
    assert first_events["small"] == ("plan", "reference")
    assert all(first_events[name] == ("plan", "engine") for name in verdicts if name != "small")
    refused = [e for e in quiet["refused"][1][0] if e[0] == "numerical"]
    assert refused[0][1] == "looped" and "vmap: custom Function ScaledSin" in refused[0][3]
