"""Run the gradient checks of real third-party test suites through the framework's own
checker and through agcheck, call by call, and compare verdicts and times.

    python bench/real_suites.py --suite kornia --src /work/suites-src --repeat 3
    python bench/real_suites.py --suite roma --src /work/suites-src --force-slow
    python bench/real_suites.py --report bench/results/real-suites-kornia-....json

For each checker (``torch`` = the framework's own: torch.autograd.gradcheck /
gradgradcheck, jax.test_util.check_grads; ``agcheck``) it starts one pytest process in the
suite's source tree with bench/suites_plugin.py loaded, which records every outermost
checker call (test node id + call index, mode as passed, verdict, time inside the checker
for each of ``--repeat`` runs on the same arguments, a digest of the inputs). agcheck is
reached the drop-in way (``pytest --agcheck-torch`` / ``--agcheck-jax``) when the installed
agcheck has it (``--via dropin``), else through the plugin (``--via plugin``, which calls
``agcheck.gradcheck(..., backend="torch")`` in the checker's place); ``--via dropin-late``
calls ``agcheck.patch_torch()`` after collection instead, so the names the suite bound at
import time must be rebound by the patch.

Both processes reseed Python's, NumPy's and torch's global RNGs from the node id before each
test and from (node id, call index) after each check, so the two runs feed the checkers the
same inputs whatever the checkers draw from the global RNG; the digests prove it per call.

Printed: verdict agreement (every difference listed), the distribution of per-call time
ratios framework/agcheck (CPU and wall time; of the fastest repeat and of the first run)
for fast-mode and slow-mode calls separately, and the slowest calls. ``--interleave`` also
runs the framework's checker inside the agcheck process, alternating with agcheck on the
same arguments (ratios from one process and one moment); ``--force-slow`` passes
``fast_mode=False`` to every torch check whose differentiable inputs hold at most
``--force-slow-max-numel`` elements. The raw records and the summary are saved as JSON under
bench/results/.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from busy import busy_loops  # noqa: E402
from precompile import compile_agcheck, prime_pytest_rewrites  # noqa: E402

#: name -> how to run its gradient checks. ``dir`` is relative to --src; ``paths`` are the
#: test paths inside it; ``args`` extra pytest arguments; ``plugins`` pytest plugins from
#: bench/ to load; ``env`` extra environment; ``select: False`` keeps tests whose own source
#: does not name a checker (they call it through a helper of the suite's); ``pythonpath``
#: folders inside ``dir`` put on the path before the installed packages.
SUITES = {
    "kornia": {
        "framework": "torch",
        "dir": "kornia",
        "paths": ["tests"],
        "args": ["--device", "cpu", "--dtype", "float64"],
        "env": {"KORNIA_TEST_DEVICE": "cpu"},
        "source": "github kornia/kornia at commit b4f5a78a1 (v0.9.0rc1-61): "
                  "git archive of the repository (tests/, testing/, conftest.py and the kornia/ package "
                  "it imports, from the same tree)",
    },
    "roma": {
        "framework": "torch",
        "dir": "roma-1.8.0",
        "paths": ["test"],
        # the sdist's top folder has an __init__.py (for use as a git submodule), which makes
        # pytest import it as a package: run a copy of test/ alone (its modules do
        # `from test.utils import ...` with the working folder on sys.path)
        "stage": ["test"],
        "args": [],
        "env": {},
        "source": "roma 1.8.0 sdist (pip download --no-deps --no-binary :all: roma==1.8.0); test/ against the installed wheel",
    },
    "torchdiffeq": {
        "framework": "torch",
        "dir": "torchdiffeq",
        # the two files that call gradcheck: odeint and odeint_adjoint with every solver
        # (fixed-grid, implicit, adaptive, scipy's) on a scalar ODE over 10 time points
        "paths": ["tests/gradient_tests.py", "tests/api_tests.py"],
        "args": [],
        "env": {},
        "source": "github rtqichen/torchdiffeq at commit 657943a (0.2.5 and later): git archive of "
                  "tests/ and the torchdiffeq/ package they import, from the same tree",
    },
    "xitorch": {
        "framework": "torch",
        "dir": "xitorch-0.5.1",
        # the five files that call gradcheck / gradgradcheck: Jacobian operators, 1-D
        # interpolation, quadrature and ODE solvers, linear-operator functions (solve,
        # symeig, svd) and root finders / minimizers, most through implicit derivatives
        "paths": ["xitorch/_tests/test_jac.py", "xitorch/_tests/test_interp.py",
                  "xitorch/_tests/test_integrate.py", "xitorch/_tests/test_linop_fcns.py",
                  "xitorch/_tests/test_optimize.py"],
        "args": [],
        "env": {},
        "source": "xitorch 0.5.1 sdist (pip download --no-deps --no-binary :all: xitorch==0.5.1); "
                  "its tests ship inside the package",
    },
    "entmax": {
        "framework": "torch",
        "dir": "entmax-1.0",
        # sparsemax / entmax by bisection and by sorting, their losses, top-k variants
        "paths": ["entmax/test_root_finding.py", "entmax/test_losses.py", "entmax/test_topk.py"],
        "args": [],
        "env": {},
        "source": "entmax 1.0 sdist (pip download --no-deps --no-binary :all: entmax==1.0); "
                  "its tests ship inside the package",
    },
    "torch-harmonics": {
        "framework": "torch",
        "dir": "torch_harmonics-0.8.0",
        # real spherical-harmonic transforms and their inverses on 12x24 and 15x30 grids, three
        # quadratures, three normalisations; the inverse's check has complex inputs. Only the
        # tests are staged so that the installed package (with its C++ helpers) is the one imported
        "paths": ["tests/test_sht.py"],
        "stage": ["tests"],
        "args": ["-k", "test_grads"],
        "env": {},
        "source": "torch-harmonics 0.8.0 sdist (pip download --no-deps --no-binary :all: torch-harmonics==0.8.0), "
                  "installed from it (pip install --no-build-isolation --no-deps) and its tests/ run",
    },
    "pytorch-wavelets": {
        "framework": "torch",
        "dir": "pytorch_wavelets-1.3.0",
        # 2-D DWT / DTCWT analysis and synthesis filter banks (custom autograd Functions) and
        # scattering layers on 1x3x16x16 to 1x3x32x32 images. The suite marks every one of these
        # checks skip ("These tests take a very long time to compute"): -p no:skipping runs them
        "paths": ["tests/test_dwt_grad.py", "tests/test_dtcwt_grad.py", "tests/test_scatnet_bwd.py"],
        "stage": ["tests"],
        "args": ["-p", "no:skipping"],
        # its test modules set up their globals in a nose-style module setup() (pytest >= 8
        # no longer calls it)
        "plugins": ["suites_nose"],
        "env": {},
        "source": "pytorch-wavelets 1.3.0 sdist (pip download --no-deps --no-binary :all: pytorch-wavelets==1.3.0), "
                  "installed from it and its tests/ run",
    },
    "cvxpylayers": {
        "framework": "torch",
        "dir": "cvxpylayers",
        # differentiable convex programs: every call of fn solves a cone program (SCS through
        # diffcp, in NumPy) and its backward solves the adjoint system, so nothing batches
        "paths": ["tests"],
        "args": [],
        "env": {},
        "source": "github cvxgrp/cvxpylayers at commit e34fc65 (0.1.9): git archive of "
                  "cvxpylayers/torch/test_cvxpylayer.py, run as tests/test_cvxpylayer_torch.py "
                  "against the installed cvxpylayers 0.1.9",
    },
    "tad-dftd3": {
        "framework": "torch",
        "dir": "tad-dftd3",
        # the D3 dispersion energy of molecules and batches of molecules (up to 18 atoms):
        # gradients and second derivatives with respect to positions and damping parameters,
        # and the C6 coefficients' model, through tad-mctc's wrappers of torch's checkers
        # (fast mode, as the suite ships; `-- --slow` after the bench's own arguments runs
        # every check in slow mode through the suite's own flag)
        "paths": ["test/test_grad", "test/test_model/test_c6.py"],
        "args": [],
        "env": {},
        "source": "github dftd3/tad-dftd3 at commit 172449f (0.5.0 and later): its test/ (the blobs; "
                  "the snapshot lacks the package's data files) against the installed tad-dftd3 0.5.0 "
                  "and tad-mctc 0.5.3",
    },
    "tad-multicharge": {
        "framework": "torch",
        "dir": "tad-multicharge",
        # the EEQ charge model (a linear solve per molecule) of single molecules and batches:
        # charges and energies differentiated in positions and in the model's parameters, the
        # Hessian of the energy, each as a gradcheck and a gradgradcheck through tad-mctc's
        # wrappers (fast mode as the suite ships; `-- --slow` runs them in slow mode)
        "paths": ["test/test_grad"],
        "args": [],
        "env": {},
        "source": "github tad-mctc/tad-multicharge at tag v0.3.3 (7e7811f): its test/ against the installed "
                  "tad-multicharge 0.3.3 and tad-mctc 0.5.3",
    },
    "tad-mctc": {
        "framework": "torch",
        "dir": "tad-mctc",
        # tad-dftd3's and tad-multicharge's utility library: coordination numbers (a
        # gradcheck and a gradgradcheck per molecule and batch), an eigensolver with
        # broadened degeneracies (a custom autograd Function), and the batching helpers'
        # gradients (deflate, merge, pack; raise_exception=False); fast mode as the suite
        # ships (`-- --slow` runs them in slow mode). The tests are of tad-mctc 0.7.0, so
        # its package is imported from the same tree, not the installed 0.5.3
        "paths": ["test/test_ncoord/test_grad/test_autodiff.py", "test/test_storch/test_eighb.py",
                  "test/test_storch/test_linalg.py", "test/test_batch/test_deflate.py",
                  "test/test_batch/test_merge.py", "test/test_batch/test_pack.py"],
        "pythonpath": ["src"],
        "args": [],
        "env": {},
        "source": "github tad-mctc/tad-mctc at commit 0d3bb31 (0.7.0): git archive of the repository; its "
                  "test/ against its own src/ (tad_mctc 0.7.0)",
    },
    "torch-interpol": {
        "framework": "torch",
        "dir": "torch-interpol-0.2.6",
        # spline interpolation of volumes at a deformation grid (orders 0-7, seven boundary
        # conditions, 1-D to 3-D): pull, push, count and grid gradients, custom autograd
        # Functions over TorchScript kernels; the suite passes rtol=1, nondet_tol=1e-3 and
        # check_undefined_grad=False, and sets torch.use_deterministic_algorithms(True).
        # "device0" is its one-thread CPU case; its other CPU case sets 10 threads, which a
        # 2-core machine cannot time. Only the tests are staged, so the installed package runs
        "paths": ["interpol/tests/test_gradcheck_pushpull.py"],
        "stage": ["interpol/tests"],
        "args": ["-k", "device0"],
        "env": {},
        "source": "torch-interpol 0.2.6 sdist (pip download --no-deps --no-binary :all: torch-interpol==0.2.6); "
                  "its tests ship inside the package",
    },
    "torchlie": {
        "framework": "torch",
        "dir": "torchlie",
        # Lie-group operations of SO(3) and SE(3) (theseus' torchlie): left_project of a group
        # element and a tangent tensor, every pair of six batch shapes broadcast against each
        # other and three output ranks, 216 small slow-mode gradchecks through the suite's own
        # helper (whose test functions do not name the checker)
        "paths": ["tests/torchlie_tests/functional"],
        "args": ["-k", "left_project_broadcasting"],
        "select": False,
        "env": {},
        "source": "github facebookresearch/theseus at commit 5385180 (torchlie 0.1.0): git archive of "
                  "tests/__init__.py and tests/torchlie_tests, against the installed torchlie 0.1.0",
    },
    "gpytorch": {
        "framework": "torch",
        "dir": "gpytorch-1.15.2",
        # the Matern and RBF covariance functions (custom autograd Functions over a
        # distance module) of batched and unbatched point sets, in slow mode
        "paths": ["test/functions/test_matern_covariance.py", "test/functions/test_rbf_covariance.py"],
        "stage": ["test"],
        "args": [],
        "env": {},
        "source": "gpytorch 1.15.2 sdist (pip download --no-deps --no-binary :all: gpytorch==1.15.2); "
                  "its test/ against the installed gpytorch 1.15.2 and linear_operator 0.6.1",
    },
    "e3nn": {
        "framework": "torch",
        "dir": "e3nn-0.6.0",
        # the soft unit step on 1,000 points (a scalar sum) and the spherical harmonics of
        # degrees 0 to 3 of four points (generated code), in slow mode
        "paths": ["tests/math/soft_unit_step_test.py", "tests/o3/cartesian_spherical_harmonics_test.py"],
        "stage": ["tests"],
        "args": [],
        "env": {},
        "source": "e3nn 0.6.0 sdist (pip download --no-deps --no-binary :all: e3nn==0.6.0); its tests/ "
                  "against the installed e3nn 0.6.0",
    },
    "e3nn-jax": {
        "framework": "jax",
        "dir": "e3nn_jax-0.21.0",
        # the two files that call check_grads (the others need flax / haiku to collect)
        "paths": ["tests/_src/spherical_harmonics/sh_test.py", "tests/_src/utils/einsum_test.py"],
        "args": [],
        "env": {},
        "source": "e3nn-jax 0.21.0 sdist (pip download --no-deps --no-binary :all: e3nn-jax==0.21.0)",
    },
    "numpyro": {
        "framework": "jax",
        "dir": "numpyro-0.22.0",
        "paths": ["test/test_distributions_util.py"],
        "args": [],
        "env": {},
        "source": "numpyro 0.22.0 sdist (pip download --no-deps --no-binary :all: numpyro==0.22.0)",
    },
    "jaxopt": {
        "framework": "jax",
        "dir": "jaxopt-0.8.5",
        # implicit differentiation of solvers (fixed points, Anderson, Broyden, OSQP,
        # iterative refinement, isotonic regression): the test files that call check_grads
        "paths": ["tests/anderson_test.py", "tests/anderson_wrapper_test.py", "tests/broyden_test.py",
                  "tests/fixed_point_iteration_test.py", "tests/isotonic_test.py",
                  "tests/iterative_refinement_test.py", "tests/osqp_test.py"],
        "args": [],
        "env": {},
        "source": "github google/jaxopt at commit 2de13bf (0.8.5): its tests/, against the installed "
                  "jaxopt 0.8.5 (the sdist ships no tests)",
    },
    "jax": {
        "framework": "jax",
        "dir": "jax-0.10.2",
        # JAX's own tests of its derivatives: every lax primitive's JVP and transpose in
        # several dtypes and shapes (orders 1-3), linear algebra (factorisations, solves,
        # eigen- and singular decompositions), control flow (scan, while, cond, custom
        # linear solves and roots), jax.nn, odeint, FFTs, scipy special functions and
        # custom_jvp/vjp rules. Its pyproject turns every warning into an error.
        # lax_numpy_indexing_test is left out: it calls the private check_jvp / check_vjp,
        # which no drop-in of the public check_grads replaces.
        "paths": ["tests/lax_autodiff_test.py", "tests/linalg_test.py", "tests/nn_test.py",
                  "tests/lax_control_flow_test.py", "tests/custom_linear_solve_test.py", "tests/custom_root_test.py",
                  "tests/ode_test.py", "tests/lax_scipy_test.py", "tests/fft_test.py",
                  "tests/lax_scipy_special_functions_test.py",
                  "tests/lax_scipy_sparse_test.py", "tests/eigh_test.py", "tests/image_test.py",
                  "tests/custom_api_test.py", "tests/batching_test.py", "tests/api_test.py"],
        "args": ["--import-mode=importlib"],
        "env": {},
        "source": "github jax-ml/jax at tag jax-v0.10.2 (990e6a0): git archive of tests/, conftest.py and "
                  "pyproject.toml (its pytest settings), against the installed jax 0.10.2",
    },
    "jax-x64": {
        "framework": "jax",
        "dir": "jax-0.10.2",
        # the heaviest of those files with double precision enabled, as JAX's x64 CI runs
        # them: the float64 and complex128 cases run as such (default tolerances 1e-5)
        "paths": ["tests/lax_autodiff_test.py", "tests/linalg_test.py", "tests/nn_test.py",
                  "tests/lax_control_flow_test.py"],
        "args": ["--import-mode=importlib"],
        "env": {"JAX_ENABLE_X64": "1"},
        "source": "as the jax suite, with JAX_ENABLE_X64=1",
    },
    "optax": {
        "framework": "jax",
        "dir": "optax-0.2.8",
        "paths": ["optax/losses/_classification_test.py"],
        "args": [],
        "env": {},
        "source": "optax 0.2.8 sdist (pip download --no-deps --no-binary :all: optax==0.2.8)",
    },
}

THREAD_ENV = {
    "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    "JAX_PLATFORMS": "cpu", "PYTHONHASHSEED": "0",
}


def _has_dropin(framework):
    code = ("import agcheck, sys; "
            f"sys.exit(0 if hasattr(agcheck, 'patch_{framework}') else 1)")
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def run_suite(name, spec, src, checker, via, repeat, force_slow, extra, timeout, log_dir, interleave=False,
              warm_fn=False, count_fn=False, control=False):
    """One pytest process; returns (records, returncode, seconds)."""
    root = Path(src) / spec["dir"]
    if not root.is_dir():
        raise SystemExit(f"{root} does not exist: see bench/README.md for how to get {name}'s sources")
    stage = None
    if spec.get("stage"):
        stage = tempfile.mkdtemp(prefix=f"suite-{name}-")
        for rel in spec["stage"]:
            shutil.copytree(root / rel, Path(stage) / rel)
        root = Path(stage)
    fd, out = tempfile.mkstemp(prefix=f"suite-{name}-{checker}-", suffix=".jsonl")
    os.close(fd)
    plugin_checker = "torch" if checker == "torch" else via
    cmd = ["nice", "-n", "10", sys.executable, "-m", "pytest", "-p", "suites_plugin",
           "--suite-record", out, "--suite-checker", plugin_checker, "--suite-repeat", str(repeat),
           *(["--suite-select"] if spec.get("select", True) else []), "--suite-frameworks", spec["framework"],
           "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-o", "addopts=", "--no-header", "-rN", "--rootdir", str(root),
           *(spec["paths"] if not any(not a.startswith("-") for a in extra) else []), *spec["args"], *extra]
    for plugin in spec.get("plugins", ()):
        cmd += ["-p", plugin]
    if force_slow:
        cmd += ["--suite-force-slow", "--suite-force-slow-max-numel", str(force_slow)]
    if checker != "torch" and via == "dropin":
        cmd.append(f"--agcheck-{spec['framework']}")
    if checker != "torch" and interleave:
        cmd.append("--suite-interleave")
        if control:
            cmd.append("--suite-control")
    if warm_fn:
        cmd.append("--suite-warm-fn")
    if count_fn:
        cmd.append("--suite-count-fn")
    env = dict(os.environ, **THREAD_ENV, **spec["env"])
    own = [str(Path(src) / spec["dir"] / rel) for rel in spec.get("pythonpath", ())]  # the suite's own package
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), *own, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    log = Path(log_dir) / f"{name}-{checker}{'-slow' if force_slow else ''}{'-interleaved' if interleave else ''}.log"
    t0 = time.perf_counter()
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n\n")
        f.flush()
        try:
            rc = subprocess.run(cmd, cwd=root, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    seconds = time.perf_counter() - t0
    records = [json.loads(line) for line in open(out) if line.strip()]
    os.unlink(out)
    if stage:
        shutil.rmtree(stage, ignore_errors=True)
    return records, rc, seconds, " ".join(cmd), str(log)


# -- analysis ---------------------------------------------------------------------------------

def _best(rec, field="cpu", which="best"):
    """The fastest repeat (``best``), the median of the repeats (``median``: issue 16's
    per-call measure) or the first run (``first``: what the suite itself paid, including
    one-time costs such as JAX compiling a function the first time it is checked)."""
    if not rec["runs"]:
        return float("nan")
    if which == "first":
        return rec["runs"][0][field]
    if which == "median":
        return statistics.median(r[field] for r in rec["runs"])
    if which == "balanced":
        # interleaved repeats 1 and 2: each checker goes first once, both warm
        return sum(r[field] for r in rec["runs"][1:3]) if len(rec["runs"]) >= 3 else float("nan")
    return min(r[field] for r in rec["runs"])


def _gc_counts(runs):
    """(runs that recorded their full collections, how many of them had one); runs recorded
    before the recorder counted collections are left out."""
    counted = [r for r in runs if "full_gc" in r]
    return {"runs": len(counted), "with_full_gc": sum(1 for r in counted if r["full_gc"])}


def _verdict_class(v):
    if v.startswith("raise "):
        return v.split(":", 1)[0]
    return v


def _same_verdict(a, b):
    """Framework run ``a`` and agcheck run ``b`` (run records): the same verdict when the
    classes match, or when agcheck raised a subclass of the framework's exception (what a
    suite's ``except`` / ``pytest.raises`` sees is then the same)."""
    ca, cb = _verdict_class(a["verdict"]), _verdict_class(b["verdict"])
    if ca == cb:
        return True
    if ca.startswith("raise ") and cb.startswith("raise ") and a.get("types") and b.get("types"):
        return a["types"][0] in b["types"]
    return False


def _quantile(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    pos = q * (len(xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def ratio_stats(pairs):
    """pairs: [(t_fw, t_ag)]; per-call ratios fw/ag."""
    pairs = [(a, b) for a, b in pairs if a > 0 and b > 0]
    if not pairs:
        return None
    ratios = [a / b for a, b in pairs]
    return {
        "calls": len(pairs), "min": min(ratios), "p10": _quantile(ratios, 0.10),
        "median": _quantile(ratios, 0.5), "geomean": math.exp(sum(map(math.log, ratios)) / len(ratios)),
        "p90": _quantile(ratios, 0.9), "max": max(ratios),
        "total_fw": sum(a for a, _ in pairs), "total_ag": sum(b for _, b in pairs),
        "total_ratio": sum(a for a, _ in pairs) / sum(b for _, b in pairs),
        "slower_calls": sum(1 for r in ratios if r < 1.0),
        "below_0_8": sum(1 for r in ratios if r < 0.8),
    }


def evaluation_share(pairs):
    """Where the checkers' CPU time goes, from runs recorded with ``--count-fn``.

    ``pairs``: [(framework runs, agcheck runs)] per call, each a list of timed runs holding
    ``cpu``, ``fn_cpu`` / ``fn_calls`` and ``backward_cpu`` / ``backward_calls``; the
    median run of each side counts. Returns per side (``fw``, ``ag``) the totals of the
    checker's CPU time, the time inside the checked function and inside torch's backward
    passes, their calls, and ``rest`` (the checker's own work: perturbing, comparing, its
    bookkeeping); on how many checks agcheck called fn more or less often; and
    ``ceiling``: the framework's total over agcheck's time in fn and backward passes, the
    ratio agcheck would reach if its own work cost nothing. ``None`` when no run was
    counted."""
    def median_run(runs):
        counted = sorted((r for r in runs if "fn_cpu" in r), key=lambda r: r["cpu"])
        return counted[len(counted) // 2] if counted else None

    totals = {"calls": 0, "ag_more_fn_calls": 0, "ag_fewer_fn_calls": 0}
    for side in ("fw", "ag"):
        totals.update({f"{side}_cpu": 0.0, f"{side}_fn_cpu": 0.0, f"{side}_fn_calls": 0,
                       f"{side}_backward_cpu": 0.0, f"{side}_backward_calls": 0})
    for fw_runs, ag_runs in pairs:
        a, b = median_run(fw_runs), median_run(ag_runs)
        if a is None or b is None:
            continue
        totals["calls"] += 1
        for side, r in (("fw", a), ("ag", b)):
            totals[f"{side}_cpu"] += r["cpu"]
            for what in ("fn", "backward"):
                totals[f"{side}_{what}_cpu"] += r.get(f"{what}_cpu", 0.0)
                totals[f"{side}_{what}_calls"] += r.get(f"{what}_calls", 0)
        totals["ag_more_fn_calls"] += b["fn_calls"] > a["fn_calls"]
        totals["ag_fewer_fn_calls"] += b["fn_calls"] < a["fn_calls"]
    if not totals["calls"]:
        return None
    for side in ("fw", "ag"):
        totals[f"{side}_rest"] = totals[f"{side}_cpu"] - totals[f"{side}_fn_cpu"] - totals[f"{side}_backward_cpu"]
    floor = totals["ag_fn_cpu"] + totals["ag_backward_cpu"]
    totals["ceiling"] = totals["fw_cpu"] / floor if floor > 0 else float("inf")
    return totals


def analyse(data):
    runs = data["runs"]
    calls = {c: {(r["nodeid"], r["index"]): r for r in runs[c]["records"] if r["type"] == "call"}
             for c in runs}
    fw, ag = calls.get("torch", {}), calls.get("agcheck", {})
    keys = sorted(set(fw) | set(ag)) if fw and ag else []
    diffs, msgdiffs, digestdiffs, misses, subclassed = [], [], [], [], []
    pairs = {}
    # a call that reached the framework's own checker in the agcheck process
    misses = [f"{k[0]} #{k[1]}" for k, b in sorted(ag.items()) if b["checker"] in ("torch", "jax")]
    for k in keys:
        a, b = fw.get(k), ag.get(k)
        if a is None or b is None:
            diffs.append({"call": f"{k[0]} #{k[1]}", "torch": a and a["verdict"], "agcheck": b and b["verdict"],
                          "why": "call made in one run only"})
            continue
        if a["digest"] != b["digest"]:
            digestdiffs.append(f"{k[0]} #{k[1]}")
        if not _same_verdict(a["runs"][0], b["runs"][0]):
            diffs.append({"call": f"{k[0]} #{k[1]}", "torch": a["verdict"], "agcheck": b["verdict"],
                          "same_inputs": a["digest"] == b["digest"], "mode": a["mode_run"], "fn": a["fn"]})
        elif a["verdict"].split(":", 1)[-1] != b["verdict"].split(":", 1)[-1]:
            msgdiffs.append({"call": f"{k[0]} #{k[1]}", "torch": a["verdict"], "agcheck": b["verdict"]})
        if _verdict_class(a["verdict"]) != _verdict_class(b["verdict"]) and _same_verdict(a["runs"][0], b["runs"][0]):
            subclassed.append({"call": f"{k[0]} #{k[1]}", "torch": a["verdict"], "agcheck": b["verdict"],
                               "agcheck_types": b["runs"][0].get("types")})
        if any(len({_verdict_class(r["verdict"]) for r in side["runs"]}) > 1 for side in (a, b)):
            diffs.append({"call": f"{k[0]} #{k[1]}", "torch": [r["verdict"] for r in a["runs"]],
                          "agcheck": [r["verdict"] for r in b["runs"]], "why": "verdict varies between repeats"})
        pairs[k] = (a, b)
    stats, slowest = {}, []
    for mode in ("fast", "slow", "-"):
        sel = [(a, b) for a, b in pairs.values() if a["mode_run"] == mode]
        for which in ("best", "median", "first"):
            for field in ("cpu", "wall"):
                s = ratio_stats([(_best(a, field, which), _best(b, field, which)) for a, b in sel])
                if s:
                    stats[f"{mode}/{field}/{which}"] = s
    # the slowest calls and the lowest ratios: of the two processes (fastest repeat) when
    # both ran, else of the interleaved runs (median of the repeats, issue 16's measure)
    which, timed = "best", pairs
    if not pairs:
        which = "median"
        timed = {(b["nodeid"], b["index"]): ({**b, "runs": b["runs_fw"]}, b) for b in ag.values() if b.get("runs_fw")}

    def entry(k, a, b):
        e = {"call": f"{k[0]} #{k[1]}", "kind": a["kind"], "mode": a["mode_run"], "inputs": a["inputs"],
             "torch_cpu": _best(a, which=which), "agcheck_cpu": _best(b, which=which),
             "ratio": _best(a, which=which) / max(_best(b, which=which), 1e-12),
             "torch_first": _best(a, which="first"), "agcheck_first": _best(b, which="first"), "measure": which}
        counted = [statistics.median(r["fn_calls"] for r in rec["runs"] if "fn_calls" in r)
                   for rec in (a, b) if any("fn_calls" in r for r in rec["runs"])]
        if len(counted) == 2:
            e["fn_calls"] = counted
        return e

    slowest = [entry(k, a, b) for k, (a, b) in sorted(timed.items(), key=lambda kv: -_best(kv[1][0], which=which))[:12]]
    worst = [entry(k, a, b) for k, (a, b) in sorted(
        timed.items(), key=lambda kv: _best(kv[1][0], which=which) / max(_best(kv[1][1], which=which), 1e-12))[:8]]
    inter_stats, inter_diffs = {}, []
    inter = [b for b in ag.values() if b.get("runs_fw")]
    for b in inter:
        va, vb = b["runs_fw"][0]["verdict"], b["runs"][0]["verdict"]
        if not _same_verdict(b["runs_fw"][0], b["runs"][0]):
            inter_diffs.append({"call": f"{b['nodeid']} #{b['index']}", "torch": va, "agcheck": vb,
                                "why": "same process, same arguments (interleaved)"})
    control_stats = {}
    for mode in ("fast", "slow", "-"):
        sel = [b for b in inter if b["mode_run"] == mode]
        for which in ("best", "median", "balanced", "first"):
            st = ratio_stats([(_best({"runs": b["runs_fw"]}, "cpu", which), _best(b, "cpu", which)) for b in sel])
            if st:
                inter_stats[f"{mode}/cpu/{which}"] = st
        # the framework's checker against itself: the same ratios of the same work
        st = ratio_stats([(_best({"runs": b["runs_fw"]}, "cpu", "median"), _best({"runs": b["runs_control"]}, "cpu", "median"))
                          for b in sel if b.get("runs_control")])
        if st:
            control_stats[f"{mode}/cpu/median"] = st
    evaluations = {}
    for mode in ("fast", "slow", "-"):
        share = evaluation_share([(a["runs"], b["runs"]) for a, b in pairs.values() if a["mode_run"] == mode])
        if share:
            evaluations[mode] = share
        share = evaluation_share([(b["runs_fw"], b["runs"]) for b in inter if b["mode_run"] == mode])
        if share:
            evaluations[f"{mode}, interleaved"] = share
    full_gc = {c: _gc_counts([x for r in cs.values() for x in r["runs"]]) for c, cs in calls.items()}
    if inter:
        full_gc["torch, interleaved"] = _gc_counts([x for b in inter for x in b["runs_fw"]])
    tests = {}
    for c in runs:
        outcomes = {}
        for r in runs[c]["records"]:
            if r["type"] == "test":
                outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
        tests[c] = outcomes
    verdicts = {}
    for c, cs in calls.items():
        counts = {}
        for r in cs.values():
            counts[_verdict_class(r["verdict"])] = counts.get(_verdict_class(r["verdict"]), 0) + 1
        verdicts[c] = counts
    checkers = {c: sorted({r["checker"] for r in cs.values()}) for c, cs in calls.items()}
    modes = {}
    for r in fw.values():
        modes[f"{r['kind']}/{r['mode']}"] = modes.get(f"{r['kind']}/{r['mode']}", 0) + 1
    modes_run, not_forced = {}, []
    for r in fw.values():
        modes_run[f"{r['kind']}/{r['mode_run']}"] = modes_run.get(f"{r['kind']}/{r['mode_run']}", 0) + 1
        if r.get("not_forced"):
            not_forced.append(f"{r['nodeid']} #{r['index']} ({r['not_forced']})")
    return {
        "calls": {c: len(cs) for c, cs in calls.items()}, "paired": len(pairs), "modes_passed": modes,
        "modes_run": modes_run, "not_forced": not_forced,
        "verdicts": verdicts, "checkers": checkers, "tests": tests,
        "verdict_differences": diffs, "message_differences": msgdiffs, "subclass_verdicts": subclassed,
        "input_digest_differences": digestdiffs, "dropin_misses": misses,
        "ratios": stats, "slowest": slowest, "worst_ratios": worst,
        "interleaved_ratios": inter_stats, "interleaved_verdict_differences": inter_diffs,
        "control_ratios": control_stats,
        "full_gc": full_gc, "evaluations": evaluations,
        # checks a run left with an input moved (torch's checker does where fn raised inside
        # its finite differences), put back by the recorder before the next run
        "inputs_put_back": {c: sum(1 for r in cs.values() if r.get("inputs_put_back")) for c, cs in calls.items()},
    }


def _fmt_stats(s, slower="slower under agcheck"):
    return (f"{s['calls']:5d} calls  min {s['min']:.2f}  p10 {s['p10']:.2f}  median {s['median']:.2f}  "
            f"geomean {s['geomean']:.2f}  max {s['max']:.2f}  total {s['total_fw']:.2f}s/{s['total_ag']:.2f}s "
            f"= {s['total_ratio']:.2f}x  ({s['slower_calls']} calls {slower}, "
            f"{s.get('below_0_8', '?')} below 0.8x)")


_MODE_LABELS = {"fast": "fast mode", "slow": "slow mode", "-": "check_grads"}


def _print_ratios(p, stats, slower="slower under agcheck"):
    """One line per ``"mode/field/which"`` key of ``stats`` (:func:`ratio_stats` each)."""
    for key, s in stats.items():
        mode, field, which = key.split("/")
        p(f"   {_MODE_LABELS[mode]:11s} {which:8s} {field:4s} {_fmt_stats(s, slower)}")


def print_report(data, summary, out=sys.stdout):
    p = lambda *a: print(*a, file=out)  # noqa: E731
    fwname = "jax" if data["framework"] == "jax" else "torch"
    p(f"== {data['suite']} ({data['framework']}): {data['source']}")
    p(f"   via={data['via']} repeat={data['repeat']} force_slow={data['force_slow']} "
      f"warm_fn={data.get('warm_fn', False)}"
      + (f" beside {data['busy']} busy loop(s)" if data.get("busy") else ""))
    versions = data.get("versions", {})
    if "agcheck_source" in versions:
        p(f"   agcheck from {versions['agcheck_source']} at {versions.get('agcheck_commit', '?')}")
    for c, r in data["runs"].items():
        p(f"   {c:8s} pytest rc={r['rc']} in {r['seconds']:.0f}s; tests {summary['tests'].get(c)}; "
          f"checks {summary['calls'].get(c, 0)} {summary['verdicts'].get(c)}; checker(s) {summary['checkers'].get(c)}")
    p(f"   calls by kind/mode as passed: {summary['modes_passed']}; as run: {summary['modes_run']}")
    for c in summary.get("not_forced", []):
        p(f"   kept in fast mode: {c}")
    nd = len([d for d in summary["verdict_differences"]])
    if len(data["runs"]) < 2:
        p("-- verdicts: one process only (see the interleaved comparison below, if any); "
          f"{len(summary['dropin_misses'])} call(s) the drop-in missed")
    else:
        p(f"-- verdicts: {summary['paired']} calls paired; {nd} verdict difference(s); "
          f"{len(summary['message_differences'])} first-line message difference(s) with the same verdict; "
          f"{len(summary['input_digest_differences'])} call(s) with different inputs; "
          f"{len(summary['dropin_misses'])} call(s) the drop-in missed")
    for d in summary["verdict_differences"]:
        p(f"   DIFF {d['call']}\n        {fwname}:   {d['torch']}\n        agcheck: {d['agcheck']}"
          + (f"\n        ({d['why']})" if d.get("why") else f"\n        (same inputs: {d.get('same_inputs')}, mode {d.get('mode')}, fn {d.get('fn')})"))
    for d in summary.get("subclass_verdicts", []):
        p(f"   same failure, exception a subclass of the framework's: {d['call']}\n        {fwname}:   {d['torch']}"
          f"\n        agcheck: {d['agcheck']}\n        agcheck's classes: {d['agcheck_types']}")
    for d in summary["message_differences"][:20]:
        p(f"   msg  {d['call']}\n        {fwname}:   {d['torch']}\n        agcheck: {d['agcheck']}")
    for m in summary["dropin_misses"][:20]:
        p(f"   MISS {m} reached {fwname}'s own checker under the drop-in")
    p(f"-- time ratios {fwname}/agcheck per call; >1 = agcheck faster. best = fastest of {data['repeat']} "
      "repeat(s) on the same arguments; median = of the repeats; first = the first run, the one the suite pays; "
      "interleaved only: balanced = repeats 1 and 2 summed, where each checker goes first once")
    _print_ratios(p, summary["ratios"])
    if summary.get("interleaved_ratios"):
        p(f"-- interleaved in the agcheck process ({fwname}'s checker and agcheck alternating on the same arguments): "
          f"{len(summary['interleaved_verdict_differences'])} verdict difference(s)")
        for d in summary["interleaved_verdict_differences"]:
            p(f"   DIFF {d['call']}\n        {fwname}:   {d['torch']}\n        agcheck: {d['agcheck']}")
        _print_ratios(p, summary["interleaved_ratios"])
    if summary.get("control_ratios"):
        p(f"-- control: {fwname}'s checker against itself, run once more in each repeat (ratio first run / "
          "control per call; how far the same work's timings scatter, below 0.8x included)")
        _print_ratios(p, summary["control_ratios"], "slower in the control")
    if summary.get("evaluations"):
        p(f"-- where the time goes (--count-fn; median run of each call; CPU s): inside the checked function, "
          f"inside torch's backward passes, the rest (the checker's own work), and calls; ceiling = {fwname}'s "
          "total / agcheck's time in fn and backward passes (the ratio agcheck would reach if its own work "
          "cost nothing)")
        for key, e in summary["evaluations"].items():
            mode, _, how = key.partition(", ")
            p(f"   {_MODE_LABELS[mode]:11s} {how or 'separate':11s} {e['calls']:5d} checks; ceiling {e['ceiling']:.2f}x; agcheck "
              f"calls fn more often on {e['ag_more_fn_calls']}, less often on {e['ag_fewer_fn_calls']}")
            for side, name in (("fw", fwname), ("ag", "agcheck")):
                p(f"      {name:8s} total {e[f'{side}_cpu']:8.2f}  fn {e[f'{side}_fn_cpu']:8.2f} "
                  f"({e[f'{side}_fn_calls']} calls)  backward {e[f'{side}_backward_cpu']:8.2f} "
                  f"({e[f'{side}_backward_calls']} passes)  rest {e[f'{side}_rest']:8.2f}")
    if any(summary.get("inputs_put_back", {}).values()):
        p("-- checks where a run left an input moved (torch's checker does where fn raises inside its finite "
          "differences); the recorder put it back before the next run: "
          + "; ".join(f"{c} {n}" for c, n in summary["inputs_put_back"].items()))
    if any(g["runs"] for g in summary.get("full_gc", {}).values()):
        p("-- timed runs with a full garbage collection inside (0.2-0.3 s each in a large pytest session; "
          "they land on whichever check's allocations trip them): "
          + "; ".join(f"{c} {g['with_full_gc']} of {g['runs']}" for c, g in summary["full_gc"].items()))
    measure = (summary["slowest"] or [{}])[0].get("measure", "best")
    fn_calls = lambda s: (f"  fn calls {s['fn_calls'][0]:g} vs {s['fn_calls'][1]:g}" if "fn_calls" in s else "")  # noqa: E731
    p(f"-- slowest calls (by the framework's {measure} CPU time; CPU seconds, framework vs agcheck"
      f"{', interleaved' if measure == 'median' else ''})")
    for s in summary["slowest"]:
        p(f"   {measure} {s['torch_cpu']:8.3f}s vs {s['agcheck_cpu']:8.3f}s  x{s['ratio']:6.2f}  "
          f"(first {s.get('torch_first', float('nan')):7.3f}s vs {s.get('agcheck_first', float('nan')):7.3f}s)  "
          f"{s['mode']:4s} {s['kind']:13s} {s['call']}  {' '.join(s['inputs'])[:60]}{fn_calls(s)}")
    p(f"-- lowest ratios ({measure} of the repeats)")
    for s in summary["worst_ratios"]:
        p(f"   {s['torch_cpu']:8.4f}s vs {s['agcheck_cpu']:8.4f}s  x{s['ratio']:6.2f}  {s['mode']:4s} {s['call']}  "
          f"{' '.join(s['inputs'])[:60]}{fn_calls(s)}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=sorted(SUITES), help="which suite")
    ap.add_argument("--src", default="/work/suites-src", help="folder holding the suites' source trees")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each check on the same arguments")
    ap.add_argument("--force-slow", action="store_true", help="fast_mode=False for every torch call")
    ap.add_argument("--force-slow-max-numel", type=int, default=20000,
                    help="with --force-slow, calls whose differentiable inputs hold more elements keep fast mode "
                         "(torch's slow mode is O(n) evaluations: a 224x224 image model would take hours)")
    ap.add_argument("--via", choices=("auto", "dropin", "dropin-late", "plugin"), default="auto")
    ap.add_argument("--checkers", default="torch,agcheck")
    ap.add_argument("--interleave", action="store_true",
                    help="in the agcheck process, also run the framework's own checker on the same arguments, "
                         "alternating with agcheck's repeats: per-call ratios from one process and one moment, "
                         "robust to the load of a shared machine (JAX: both share JAX's compilation caches, "
                         "so 'first' figures are not meaningful there)")
    ap.add_argument("--warm-fn", action=argparse.BooleanOptionalAction, default=True,
                    help="call each checked torch function once, forward and backward, untimed and with the "
                         "RNG states restored, before its first timed run (default): the function's own "
                         "first-call costs then land on neither checker; with --no-warm-fn they land on the "
                         "checker that runs first (agcheck, in the first interleaved repeat)")
    ap.add_argument("--control", action="store_true",
                    help="with --interleave, run the framework's checker once more in each repeat, as an A/A "
                         "control: the report gives its per-call ratios to the framework's first run, the noise "
                         "the agcheck ratios are read against")
    ap.add_argument("--count-fn", action="store_true",
                    help="count the checked function's calls and torch's backward passes in every timed run, "
                         "and the CPU time inside each (reported as 'where the time goes': how much of each "
                         "checker's time is evaluation, differentiation and its own work)")
    ap.add_argument("--busy", type=int, default=0,
                    help="run this many busy loops beside the suite, at its niceness, for the whole run: the "
                         "load of a shared machine (a CI runner running tests in parallel), made repeatable")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", default=None, help="JSON file (default bench/results/real-suites-SUITE-DATE[-slow].json)")
    ap.add_argument("--report", default=None, help="print the report of a saved JSON file and exit")
    ap.add_argument("pytest_args", nargs="*",
                    help="extra pytest arguments (after --), e.g. -k expr; test paths given here replace the suite's")
    args = ap.parse_args(argv)

    if args.report:
        data = json.load(open(args.report))
        print_report(data, analyse(data))
        return 0
    if not args.suite:
        ap.error("--suite is required")
    if args.control and not args.interleave:
        ap.error("--control needs --interleave (the control runs in the agcheck process, beside agcheck's runs)")
    spec = SUITES[args.suite]
    print(compile_agcheck(), file=sys.stderr, flush=True)
    print(prime_pytest_rewrites(), file=sys.stderr, flush=True)
    via = args.via
    if via == "auto":
        via = "dropin" if _has_dropin(spec["framework"]) else "plugin"
    via_plugin = {"plugin": "agcheck", "dropin": "dropin", "dropin-late": "dropin-late"}[via]
    log_dir = HERE / "results" / "logs"
    if args.out:  # runs of one suite side by side, each with its --out, keep their own logs
        log_dir = log_dir / Path(args.out).stem
    log_dir.mkdir(parents=True, exist_ok=True)
    data = {"suite": args.suite, "framework": spec["framework"], "source": spec["source"], "via": via,
            "repeat": args.repeat, "force_slow": args.force_slow, "interleave": args.interleave,
            "warm_fn": args.warm_fn, "count_fn": args.count_fn, "control": args.control,
            "pytest_args": args.pytest_args, "busy": args.busy,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "python": sys.version.split()[0], "versions": _versions(spec["framework"]), "runs": {}}
    with busy_loops(args.busy):
        for checker in args.checkers.split(","):
            print(f"running {args.suite} with {checker} ...", file=sys.stderr, flush=True)
            records, rc, seconds, cmd, log = run_suite(
                args.suite, spec, args.src, checker, via_plugin, args.repeat,
                args.force_slow and args.force_slow_max_numel, args.pytest_args, args.timeout, log_dir,
                interleave=args.interleave, warm_fn=args.warm_fn, count_fn=args.count_fn, control=args.control)
            data["runs"][checker] = {"rc": rc, "seconds": seconds, "command": cmd, "log": log, "records": records}
    summary = analyse(data)
    data["summary"] = summary
    out = args.out or HERE / "results" / (f"real-suites-{args.suite}-{_dt.date.today().isoformat()}"
                                          + ("-slow" if args.force_slow else "") + ".json")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        json.dump(data, f, separators=(",", ":"))
    print_report(data, summary)
    print(f"raw records: {out}")
    return 1 if summary["verdict_differences"] or summary["interleaved_verdict_differences"] else 0


def _versions(framework):
    code = ("import importlib.metadata as m, json; out = {}\n"
            "for n in ('torch','jax','jaxlib','numpy','agcheck','kornia','roma','e3nn','e3nn-jax','optax','numpyro','xitorch','entmax','torch-interpol','tad-dftd3','tad-mctc','tad-multicharge','torchlie'):\n"
            "    try: out[n] = m.version(n)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))")
    try:
        out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)
    except ValueError:
        out = {}
    out.update(_agcheck_source())
    return out


def _agcheck_source() -> dict:
    """Which agcheck the suites import (from a neutral directory, as the suites' pytest
    processes do), and its git commit: an editable install may point at another checkout
    than this script's."""
    code = "import agcheck, os; print(os.path.dirname(os.path.dirname(os.path.abspath(agcheck.__file__))))"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/").stdout.strip()
    if not found:
        return {}
    info = {"agcheck_source": found}
    head = subprocess.run(["git", "-C", found, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", found, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True)
    if head.returncode == 0:
        info["agcheck_commit"] = head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
    if Path(found).resolve() != HERE.parent.resolve():
        print(f"WARNING: the suites import agcheck from {found}, not from this checkout ({HERE.parent})",
              file=sys.stderr)
    return info


if __name__ == "__main__":
    sys.exit(main())
