"""Consecutive ``agcheck.gradcheck(backend="jax")`` calls of one function, per engine, each
engine in a fresh process: what the first call of a shape pays (JAX compiles every program
for every new shape, including every batch size the engine evaluates) and what the calls
after it cost. Slow mode, forward and reverse, float64.

    python bench/jax_engine_calls.py [--calls 4]

The element-by-element engine (``"reference"``) compiles only what ``fn`` itself needs at
its shape; the batched engine (``"batched"``, and ``"auto"``, which tries it) evaluates
``fn`` on batches of moved copies, one compilation per batch shape.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CASES = ("tanh, (30,)", "mlp 20x20, (20, 5)", "softmax, (8, 8)", "jvp of exp, 2 x (3, 4, 5) float32, failing",
         "logsumexp over axis 1, (3, 4, 5)", "cumsum of sin, (40,)", "conv 3x3, 2 filters, (1, 1, 6, 6)",
         "tanh(a @ b), 2 x (10, 10)")
ENGINES = ("reference", "batched", "auto")


def _child(engine: str, calls: int) -> None:
    import time

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    import agcheck

    rng = np.random.RandomState(0)
    w = jnp.asarray(rng.randn(20, 20))

    @jax.custom_jvp
    def exp(x):
        return jnp.exp(x)

    exp.defjvp(lambda p, t: (jnp.exp(p[0]), 1.1 * jnp.exp(p[0]) * t[0]))  # a wrong derivative
    x32 = jnp.asarray(rng.randn(3, 4, 5).astype(np.float32))
    kernel = jnp.asarray(rng.randn(2, 1, 3, 3))
    cases = {
        CASES[0]: (jnp.tanh, (jnp.asarray(rng.randn(30)),), {}),
        CASES[1]: (lambda x: jnp.tanh(w @ jnp.tanh(w @ x)), (jnp.asarray(rng.randn(20, 5)),), {}),
        CASES[2]: (jax.nn.softmax, (jnp.asarray(rng.randn(8, 8)),), {}),
        CASES[3]: (lambda x, t: jax.jvp(exp, (x,), (t,)), (x32, x32), {"eps": 1e-4, "atol": 2e-3, "rtol": 2e-3}),
        CASES[4]: (lambda x: jax.nn.logsumexp(x, axis=1), (jnp.asarray(rng.randn(3, 4, 5)),), {}),
        CASES[5]: (lambda x: jnp.cumsum(jnp.sin(x)), (jnp.asarray(rng.randn(40)),), {}),
        CASES[6]: (lambda x: jax.lax.conv(x, kernel, (1, 1), "SAME"), (jnp.asarray(rng.randn(1, 1, 6, 6)),), {}),
        CASES[7]: (lambda a, b: jnp.tanh(a @ b), (jnp.asarray(rng.randn(10, 10)), jnp.asarray(rng.randn(10, 10))), {}),
    }
    times = {}
    for name, (f, args, kw) in cases.items():
        times[name] = []
        for _ in range(calls):
            start = time.process_time()
            agcheck.gradcheck(f, args, backend="jax", engine=engine, check_forward_ad=True,
                              raise_exception=False, **kw)
            times[name].append(time.process_time() - start)
    print(json.dumps(times))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=4, help="consecutive calls per function")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child, args.calls)
        return
    results = {}
    for engine in ENGINES:
        out = subprocess.run([sys.executable, __file__, "--child", engine, "--calls", str(args.calls)],
                             capture_output=True, text=True, check=True)
        results[engine] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"gradcheck(backend='jax'), {args.calls} consecutive calls per function, CPU s, fresh process per engine")
    for name in CASES:
        print(f"  {name}")
        for engine in ENGINES:
            row = "  ".join(f"{t:6.3f}" for t in results[engine][name])
            print(f"    {engine:9s} {row}   total {sum(results[engine][name]):6.2f}")


if __name__ == "__main__":
    main()
