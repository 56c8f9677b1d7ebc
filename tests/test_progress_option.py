"""``progress=True``: the bar is driven to completion on every engine path; quiet otherwise."""
import importlib

import pytest
import torch

import agcheck

run_module = importlib.import_module("agcheck.core.run")  # where a check makes its progress bar


class Recorder:
    instances = []

    def __init__(self, enabled=True, **kw):
        self.enabled = enabled
        self.phases = []  # [total, completed, description]
        self.closed = False
        Recorder.instances.append(self)

    def start(self, total, description=""):
        self.phases.append([total, 0, description])

    def advance(self, n=1):
        self.phases[-1][1] += n

    def update(self, **kw):
        pass

    def close(self):
        self.closed = True


@pytest.fixture
def recorder(monkeypatch):
    Recorder.instances = []
    monkeypatch.setattr(run_module, "Progress", Recorder)
    return Recorder


def x_of(n, seed=0):
    return torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).requires_grad_()


@pytest.mark.parametrize("engine,n", [("auto", 600), ("batched", 600), ("reference", 40), ("auto", 5)])
def test_progress_reaches_the_total(recorder, engine, n):
    assert agcheck.gradcheck(lambda a, b: (a * b).sin(), (x_of(n), x_of(n, 1)), engine=engine,
                             check_forward_ad=True, progress=True)
    (bar,) = recorder.instances
    assert bar.enabled and bar.closed and bar.phases
    # each mode's last phase is the one that decided it: it ends complete
    done = [p for p in bar.phases if p[1] == p[0]]
    assert len(done) >= 2 and all(p[0] == 2 * n for p in done)


def test_progress_is_closed_when_the_check_fails(recorder):
    with pytest.raises(agcheck.GradcheckError):
        agcheck.gradcheck(lambda x: x.detach() * 2 + x, (x_of(30),), progress=True)
    assert recorder.instances[-1].closed


def test_quiet_by_default(recorder, capsys):
    agcheck.gradcheck(lambda x: x.sin(), (x_of(30),))
    assert not recorder.instances[-1].enabled
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_real_bar_draws_nothing_on_a_pipe(capsys):
    assert agcheck.gradcheck(lambda x: x.sin(), (x_of(300),), progress=True)
    out = capsys.readouterr()
    assert out.out == "" and "\x1b" not in out.err
