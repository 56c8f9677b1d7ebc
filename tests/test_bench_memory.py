"""bench/cases.py's memory meter: the anonymous peak sampled from another process."""
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def cases():
    spec = importlib.util.spec_from_file_location("_cases_under_test", BENCH / "cases.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.fixture
def poller(cases):
    if not sys.platform.startswith("linux"):
        pytest.skip("the poller reads /proc/PID/status (Linux)")
    p = cases.AnonPoller()
    yield p
    p.close()


def test_an_allocation_held_for_a_while_is_in_the_anonymous_peak(cases, poller):
    meter = cases.PeakMeter(poller)
    meter.start()
    block = np.ones(64 * 2**20 // 8)  # 64 MiB, written, so resident
    time.sleep(0.05)
    del block
    grown = meter.anon_growth()
    assert grown is not None and grown >= 60 * 1024


def test_no_allocation_leaves_the_anonymous_peak_near_zero(cases, poller):
    meter = cases.PeakMeter(poller)
    meter.start()
    time.sleep(0.05)
    assert meter.anon_growth() < 8 * 1024


def test_without_a_poller_there_is_no_anonymous_figure(cases):
    meter = cases.PeakMeter()
    meter.start()
    assert meter.anon_growth() is None
