"""Regenerate docs/img/report-example.png, the failure report shown on the Reports page.

Run from the repository root (needs torch and matplotlib, i.e. ``agcheck[torch,report]``):

    python docs/scripts/make_report_image.py

The function is a matrix-vector product ``y = W @ x`` written as a custom
``torch.autograd.Function`` whose backward forgets to transpose ``W`` (it returns
``W @ g`` instead of ``W.T @ g``). ``agcheck.gradcheck`` rejects it; the script catches the
``GradcheckError``, prints the report's summary and saves the report as a PNG.
"""
import os
import sys

import torch

import agcheck

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "img", "report-example.png")


class MatVec(torch.autograd.Function):
    """y = W @ x for a fixed square matrix W, differentiated with respect to x."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(w)
        return w @ x

    @staticmethod
    def backward(ctx, grad_y):
        (w,) = ctx.saved_tensors
        return w @ grad_y, None  # bug: should be w.T @ grad_y


def main(out=OUT):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(8, 8, dtype=torch.float64, generator=gen)
    x = torch.randn(8, dtype=torch.float64, generator=gen, requires_grad=True)
    try:
        agcheck.gradcheck(MatVec.apply, (x, w))
    except agcheck.GradcheckError as err:
        print(err.report.summary())
        path = err.report.save(out)
        print(f"saved {os.path.relpath(path)}")
        return 0
    print("gradcheck passed: the broken backward was not caught", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
