"""Failing ``check_grads`` calls: what JAX's checker and agcheck's drop-in each cost per failure.

JAX's checker raises at the first level whose projection differs; agcheck raises the same
``AssertionError`` message and adds its account of that level, by default from the arrays
the check compared (``--account full``: the level's full Jacobians compared in slow mode,
element by element, on the JAX backend, and their diagnosis). The derivatives
are broken as in the real-suite run with ``-p suites_broken_jax`` (the JVPs of ``sin``,
``exp``, ``log`` and ``tanh`` scaled by 1.1). This prints the medians of the warm CPU
times (each call run twice untimed first: JAX compiles on first use, and whichever checker
ran first would pay for both), alternating the checkers in one process.

    python bench/jax_failures.py [--repeat 7] [--account full]
"""
from __future__ import annotations

import argparse
import os
import statistics
from functools import partial

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax._src import public_test_util  # noqa: E402

import agcheck  # noqa: E402
import suites_broken_jax  # noqa: E402
from alternation import alternated, median_ratio  # noqa: E402


def _cases():
    rng = np.random.RandomState(0)
    return {
        "softmax, (4,)": (jax.nn.softmax, (np.array([0.3, -1.2, 0.5, 2.0], np.float32),)),
        "sin, (3, 4)": (jnp.sin, (rng.randn(3, 4).astype(np.float32),)),
        "tanh, (30,)": (jnp.tanh, (rng.randn(30).astype(np.float32),)),
        "exp, (3, 4, 5)": (jnp.exp, (rng.randn(3, 4, 5).astype(np.float32),)),
    }


def _failing(check, f, args):
    def call():
        try:
            check(f, args, 2, ["fwd", "rev"])
        except AssertionError:  # the failure is the point
            return
        raise SystemExit("the broken derivative passed: the bench measures nothing")

    return call


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7, help="alternations of the checkers per case")
    ap.add_argument("--account", choices=("direction", "full"), default="direction",
                    help="agcheck's account of the failing level")
    args = ap.parse_args(argv)
    suites_broken_jax.pytest_configure(None)
    reference = getattr(public_test_util.check_grads, "agcheck_original", public_test_util.check_grads)
    ours = partial(agcheck.check_grads, account=args.account)
    print(f"failing check_grads (order 2, fwd and rev), median of {args.repeat} warm alternations (CPU ms); "
          f"agcheck's account: {args.account}")
    for name, (f, inputs) in _cases().items():
        times = alternated({"jax": _failing(reference, f, inputs), "agcheck": _failing(ours, f, inputs)},
                           args.repeat, warm=2)
        print(f"  {name:16s} jax {statistics.median(times['jax']) * 1e3:8.2f}  agcheck "
              f"{statistics.median(times['agcheck']) * 1e3:8.2f}  ({median_ratio(times['jax'], times['agcheck']):.3f}x)")


if __name__ == "__main__":
    main()
