"""Open an HTML failure report in headless Chromium and take a screenshot of it.

The documented check that the self-contained HTML report renders in a real browser (the
Reports page shows the result, docs/img/report-html.png). Run from the repository root
(needs torch and matplotlib, i.e. ``agcheck[torch,report]``, and Chromium: on Debian
``apt-get install chromium``):

    python docs/scripts/screenshot_report.py [--out docs/img/report-html.png] [--keep-html PATH]

The report is a real failure with two wrong blocks: ``(x * y, x + y)`` whose backward
doubles ``d(x*y)/dx`` and flips the sign of ``d(x+y)/dy``. The script writes the HTML to a
temporary folder, runs Chromium with a fresh profile and no network (file:// only), and
prints the PNG's path and size; it exits non-zero if Chromium is missing or fails.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import torch

import agcheck

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "img", "report-html.png")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


class TwoBugs(torch.autograd.Function):
    """(x * y, x + y); the backward doubles d(x*y)/dx and flips the sign of d(x+y)/dy."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y, x + y

    @staticmethod
    def backward(ctx, g1, g2):
        x, y = ctx.saved_tensors
        return 2 * g1 * y + g2, g1 * x - g2


def failing_report():
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randn(5, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(2))
    try:
        agcheck.gradcheck(TwoBugs.apply, (x, y))
    except agcheck.GradcheckError as error:
        return error.report
    raise SystemExit("the broken function passed: nothing to show")


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("Chromium not found: apt-get install chromium (Debian) or put chromium on PATH")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="the PNG to write")
    ap.add_argument("--keep-html", default=None, metavar="PATH", help="also keep the HTML report here")
    ap.add_argument("--window", default="1400,2600", help="window size WIDTH,HEIGHT in CSS pixels")
    a = ap.parse_args(argv)
    report = failing_report()
    print(report.summary())
    with tempfile.TemporaryDirectory() as tmp:
        html = report.save(os.path.join(tmp, "report.html"))
        if a.keep_html:
            shutil.copyfile(html, a.keep_html)
        out = os.path.abspath(a.out)
        cmd = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={os.path.join(tmp, 'profile')}",
               f"--window-size={a.window}", f"--screenshot={out}", "file://" + html]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0 or not os.path.exists(out):
            sys.stderr.write(done.stderr[-2000:])
            return 1
    print(f"screenshot: {out} ({os.path.getsize(out)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
