"""One e3nn-jax check (spherical harmonics of degree 10, the slowest check_grads call of
its suite) in a fresh process, timed on its first and second run, for one checker:

    python bench/jax_first_run.py jax        # jax.test_util.check_grads
    python bench/jax_first_run.py agcheck    # agcheck.check_grads
    python bench/jax_first_run.py dropin     # jax.test_util.check_grads under agcheck.patch_jax()

(docs/verification.md, "Real third-party suites"; needs e3nn-jax from suites-requirements.txt.)
"""
import sys
import time

import jax
import e3nn_jax as e3nn

which = sys.argv[1] if len(sys.argv) > 1 else "jax"
if which == "dropin":
    import agcheck
    import jax.test_util as jtu
    agcheck.patch_jax()
    check = jtu.check_grads
elif which == "agcheck":
    import agcheck
    check = agcheck.check_grads
else:
    from jax.test_util import check_grads as check


def f(x):
    return e3nn.spherical_harmonics("10e", x, normalize=False, normalization="integral",
                                    algorithm=("recursive", "sparse", "custom_jvp")).array


x = jax.random.normal(jax.random.PRNGKey(0), (10, 3))
for i in range(2):
    c, w = time.process_time(), time.perf_counter()
    check(f, (x,), 1, modes=["fwd", "rev"], atol=3e-3, rtol=3e-3)
    print(f"{which} run {i}: cpu {time.process_time() - c:.2f} s, wall {time.perf_counter() - w:.2f} s", flush=True)
