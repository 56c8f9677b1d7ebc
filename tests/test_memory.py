"""The engine's memory readings (:mod:`agcheck.engine.memory`): the process's resident
memory and its peak as the kernel reports them, and the peak a call adds."""
import mmap
import os
import sys

import numpy as np
import pytest

from agcheck.engine import memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")


def _status():
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssFile", "RssShmem"):
                values[key] = int(rest.split()[0]) * 1024
    return values["VmRSS"], values["VmHWM"], values["RssFile"] + values["RssShmem"]


def test_readings_are_the_kernels_resident_memory_peak_and_file_backed_pages():
    resident, peak, file_backed = memory._read()
    status_resident, status_peak, status_file = _status()
    # the two reads a few pages apart (reading a file allocates)
    assert abs(peak - status_peak) <= 1 << 20 and abs(resident - status_resident) <= 1 << 20
    assert 0 < file_backed <= resident and abs(file_backed - status_file) <= 1 << 20


def test_a_call_that_raises_the_peak_is_measured_and_one_within_it_is_not():
    above = memory._read()[1] - memory._read()[0] + (64 << 20)

    def allocate():
        a = np.ones(above // 8)  # written, so resident
        return float(a[-1])

    call = memory.measured(allocate)
    assert call.result == 1.0 and call.added_peak >= above * 0.9
    assert memory.measured(lambda: np.ones(1000).sum()).added_peak is None


def test_file_backed_pages_a_call_brings_in_are_not_its_working_memory(tmp_path):
    # what a first use of framework code costs (its pages mapped from the library's file)
    # is paid once per process; only allocations count as a batch's memory
    size = memory._read()[1] - memory._read()[0] + (64 << 20)
    path = tmp_path / "pages"
    with open(path, "wb") as f:
        f.truncate(size)

    def touch_file_pages():  # the pages stay mapped, as a library's code does
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        return m, sum(m[k] for k in range(0, size, mmap.PAGESIZE))

    call = memory.measured(touch_file_pages)
    mapped, total = call.result
    mapped.close()
    assert total == 0
    assert call.added_peak is not None and call.added_peak <= 4 << 20
    allocated = memory._read()[1] - memory._read()[0] + (64 << 20)
    call = memory.measured(lambda: float(np.ones(allocated // 8)[-1]))
    assert call.added_peak >= allocated * 0.9


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_reads_its_own_memory():
    memory._read()  # the parent's statm is open
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a fresh allocation must show in its own readings
        try:
            before = memory._read()[0]
            # fresh pages from the kernel, written: np.ones could reuse heap pages the
            # parent freed but kept resident, depending on the tests that ran before
            a = mmap.mmap(-1, 32 << 20)
            a.write(b"\1" * (32 << 20))
            grew = memory._read()[0] - before >= (30 << 20) and a[-1] == 1
            os.write(write, b"1" if grew else b"0")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    assert answer == b"1"
