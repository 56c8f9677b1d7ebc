"""pytest plugin for bench/real_suites.py: records every gradient check a third-party suite
makes, call by call.

Loaded with ``-p suites_plugin`` (bench/ on PYTHONPATH). It wraps the checker functions
of torch (``gradcheck``, ``gradgradcheck``) and JAX (``jax.test_util.check_grads``) at
every place a name is bound to them -- ``torch.autograd``, the module
``torch.autograd.gradcheck``, ``jax.test_util`` and any module that did ``from
torch.autograd import gradcheck`` before -- and records, for each outermost call:

* the test's node id and the call's index within the test,
* the mode as the test passed it (``fast_mode``; "slow" when not passed) and the mode run,
* which checker actually ran (torch's own function, agcheck's drop-in, agcheck called
  directly),
* the verdict: ``pass`` / ``False`` / ``raise <Type>: <first message line>``,
* the time inside the checker (wall and process CPU) of every repeat,
* a digest of the inputs, so a difference of inputs between two runs is seen as such.

Options (``--suite-checker``):

``torch``
    the suite's calls go to torch's (or JAX's) own checker; nothing else changes.
``agcheck``
    this plugin routes the calls to ``agcheck.gradcheck`` / ``agcheck.gradgradcheck`` /
    ``agcheck.check_grads`` itself (used before agcheck had a drop-in).
``dropin``
    agcheck's own drop-in does the routing (run pytest with ``--agcheck-torch`` /
    ``--agcheck-jax``); this plugin only wraps what the drop-in installed and records. A
    call that still reaches the framework's own checker is recorded with
    ``checker="torch"`` / ``"jax"``, which real_suites.py reports as a drop-in miss.
``dropin-late``
    like ``dropin``, but ``agcheck.patch_torch()`` / ``patch_jax()`` is called by this
    plugin after collection, i.e. after the suite's modules bound the names: tests the
    rebinding of names bound earlier.

``--suite-repeat N`` runs each check N times on the same arguments (the test sees the first
run's result); ``--suite-force-slow`` passes ``fast_mode=False`` to every torch call;
``--suite-select`` keeps only tests whose source mentions a checker; ``--suite-count-fn``
records, for every timed run, how many times the checker called the checked function
(``fn_calls``) and ran torch's backward engine (``backward_calls``; a batched pass is one),
and the CPU time inside each (``fn_cpu``, ``backward_cpu``; a second spent in one inside the
other counts once, for the outermost).
"""
from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import inspect
import json
import random
import sys
import threading
import time
import zlib

import pytest

_STATE = {
    "out": None,
    "checker": "torch",
    "repeat": 1,
    "force_slow": False,
    "nodeid": None,
    "counters": {},
    "installed": False,
    "wrappers": {},  # id(target) -> wrapper
    "tests": {},
}
_LOCAL = threading.local()

SELECT_WORDS = ("gradcheck", "gradgradcheck", "check_grads")


def pytest_addoption(parser):
    group = parser.getgroup("suites", "bench/real_suites.py recorder")
    group.addoption("--suite-record", default=None, help="JSON-lines file to append records to")
    group.addoption("--suite-checker", default="torch",
                    choices=("torch", "agcheck", "dropin", "dropin-late"))
    group.addoption("--suite-repeat", type=int, default=1)
    group.addoption("--suite-force-slow", action="store_true", default=False)
    group.addoption("--suite-force-slow-max-numel", type=int, default=20000,
                    help="leave calls whose differentiable inputs hold more elements in the mode passed")
    group.addoption("--suite-interleave", action="store_true", default=False,
                    help="with an agcheck checker, also run the framework's own checker on the same arguments "
                         "in the same process, alternating with agcheck's runs (timing robust to machine load)")
    group.addoption("--suite-control", action="store_true", default=False,
                    help="with --suite-interleave, run the framework's own checker a second time in each repeat "
                         "(an A/A control: its ratio to the first is the noise of timing the same work)")
    group.addoption("--suite-warm-fn", action="store_true", default=False,
                    help="before a torch check's first timed run, call the checked function once (forward and "
                         "backward, untimed, RNG state restored), so its own first-call costs are billed to "
                         "neither checker")
    group.addoption("--suite-count-fn", action="store_true", default=False,
                    help="count the checked function's calls and torch's backward passes in each timed run, "
                         "and the CPU time inside each, to tell evaluation and differentiation from the "
                         "checker's own work")
    group.addoption("--suite-select", action="store_true", default=False,
                    help="keep only tests whose source mentions gradcheck/check_grads")
    group.addoption("--suite-frameworks", default="torch,jax",
                    help="frameworks to import before the suite's conftest files (so their checkers are wrapped)")


# -- what is wrapped --------------------------------------------------------------------------

def _torch_targets():
    """(kind, framework original, current binding) for torch's checkers."""
    if "torch" not in sys.modules:
        return []
    import torch.autograd  # noqa: F401
    mod = sys.modules["torch.autograd.gradcheck"]
    out = []
    for kind in ("gradcheck", "gradgradcheck"):
        current = getattr(mod, kind)
        current = getattr(current, "suite_inner", current)
        original = getattr(current, "agcheck_original", current)
        out.append((kind, original, current))
    return out


def _jax_targets():
    if "jax" not in sys.modules:
        return []
    import jax.test_util as jtu
    current = getattr(jtu.check_grads, "suite_inner", jtu.check_grads)
    original = getattr(current, "agcheck_original", current)
    return [("check_grads", original, current)]


def _which(fn, original):
    if getattr(fn, "agcheck_dropin", None):
        return "agcheck-dropin"
    if fn is original:
        return "jax" if getattr(fn, "__module__", "").startswith("jax") else "torch"
    return getattr(fn, "__module__", "?")


def _agcheck_direct(kind):
    import agcheck
    if kind == "gradcheck":
        return functools.partial(agcheck.gradcheck, backend="torch")
    if kind == "gradgradcheck":
        return functools.partial(agcheck.gradgradcheck, backend="torch")
    return agcheck.check_grads


def _rebind(pairs):
    by_id = {id(old): new for old, new in pairs}
    n = 0
    for module in list(sys.modules.values()):
        try:
            ns = vars(module)
        except TypeError:
            continue
        if not isinstance(ns, dict):
            continue
        for name, value in list(ns.items()):
            new = by_id.get(id(value))
            if new is not None and new is not value:
                try:
                    ns[name] = new
                except Exception:  # noqa: BLE001
                    continue
                n += 1
    return n


def install():
    """Wrap every binding of the checkers (the framework's originals and, when a drop-in
    is active, its replacements)."""
    checker = _STATE["checker"]
    pairs = []
    for kind, original, current in _torch_targets() + _jax_targets():
        for target in {id(original): original, id(current): current}.values():
            if id(target) in _STATE["wrappers"]:
                continue
            inner = _agcheck_direct(kind) if checker == "agcheck" else target
            wrapper = _make_wrapper(kind, inner, _which(inner, original) if checker != "agcheck" else "agcheck-direct",
                                    original)
            wrapper.suite_inner = target
            _STATE["wrappers"][id(target)] = wrapper
            pairs.append((target, wrapper))
    n = _rebind(pairs)
    _STATE["installed"] = True
    return n


# -- one call -----------------------------------------------------------------------------

def _digest(inputs):
    h = hashlib.sha1()
    shapes = []

    def visit(x):
        mod = type(x).__module__
        if mod.startswith("torch") and hasattr(x, "layout"):
            import torch
            shapes.append(f"{tuple(x.shape)}:{str(x.dtype).replace('torch.', '')}"
                          + ("" if x.layout == torch.strided else f":{x.layout}"))
            if x.layout == torch.strided:
                t = x.detach()
                if t.is_complex():
                    t = torch.view_as_real(t.resolve_conj())
                h.update(t.cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                         if t.dtype != torch.bool and t.numel() else b"")
            return
        if hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, (str, bytes)):
            import numpy as np
            a = np.asarray(x)
            shapes.append(f"{a.shape}:{a.dtype}")
            h.update(np.ascontiguousarray(a).tobytes())
            return
        if isinstance(x, (list, tuple)):
            for y in x:
                visit(y)
            return
        if isinstance(x, dict):
            for k in sorted(x, key=str):
                visit(x[k])
            return
        if isinstance(x, (int, float, complex, bool, str)) or x is None:
            h.update(repr(x).encode())
            shapes.append(repr(x) if len(repr(x)) < 20 else type(x).__name__)
            return
        shapes.append(type(x).__name__)

    try:
        visit(inputs)
    except Exception as e:  # noqa: BLE001
        return f"digest-error:{type(e).__name__}", shapes
    return h.hexdigest()[:16], shapes


def _leaves(inputs):
    """Everything in ``inputs`` that is not a list, tuple or dict, however nested."""
    stack = [inputs]
    while stack:
        x = stack.pop()
        if isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
        else:
            yield x


def _snapshot(inputs):
    """``[(tensor, copy of its values)]`` for every dense torch tensor among the inputs."""
    if "torch" not in sys.modules:
        return []
    import torch
    return [(x, x.detach().clone()) for x in _leaves(inputs)
            if isinstance(x, torch.Tensor) and x.layout == torch.strided]


def _put_back(snapshot) -> bool:
    """Restore the snapshot's tensors whose values changed (a checker that raised inside
    its finite differences may leave an input moved: torch's does); whether any had."""
    if not snapshot:
        return False
    import torch
    changed = False
    for tensor, values in snapshot:
        now = tensor.detach()
        same = (torch.allclose(now, values, rtol=0, atol=0, equal_nan=True)  # NaN stays NaN
                if now.is_floating_point() or now.is_complex() else torch.equal(now, values))
        if not same:
            with torch.no_grad():
                tensor.copy_(values)
            changed = True
    return changed


def _grad_numel(inputs):
    """Elements of the inputs a torch check differentiates (floating/complex, requires_grad)."""
    return sum(x.numel() for x in _leaves(inputs) if getattr(x, "requires_grad", False))


def _verdict(result, error):
    if error is not None:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"raise {type(error).__name__}: {first[:300]}"
    if result is True or result is None:
        return "pass"
    if result is False:
        return "False"
    return f"returned {type(result).__name__}"


def _reseed(key):
    seed = zlib.crc32(key.encode()) & 0x7FFFFFFF
    random.seed(seed)
    try:
        import numpy as np
        np.random.seed(seed)
    except ImportError:
        pass
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(seed)


def _rng_states():
    import numpy as np
    import torch
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda


def _set_rng_states(states):
    import numpy as np
    import torch
    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])
    if states[3] is not None:
        torch.cuda.set_rng_state_all(states[3])


def _warm_function(fn, inputs):
    """Call ``fn`` once on the check's inputs, forward and backward (a cotangent of ones on
    every differentiable output), outside both checkers and untimed.

    The first call of a suite's function in a process pays the function's own one-time costs
    (first dispatch of its ops, lazily built tables, Python-level caches); without this they
    land on whichever checker runs first. The global RNG states are restored afterwards, so
    the checks draw what they would have drawn (a function that changes its inputs in place
    would change them for the checks too, as each checker's own calls do). Returns whether
    the warm-up ran through; whatever the function raises (pytest's skips included) is left
    for the checkers to meet again.
    """
    import torch
    states = _rng_states()
    try:
        xs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        wrt = [x for x in xs if isinstance(x, torch.Tensor) and x.requires_grad]
        with torch.enable_grad():
            out = fn(*xs)
        outs, stack = [], [out]
        while stack:
            o = stack.pop()
            if isinstance(o, (tuple, list)):
                stack.extend(o)
            elif isinstance(o, torch.Tensor) and o.requires_grad and o.layout == torch.strided:
                outs.append(o.real if o.is_complex() else o)
        if outs and wrt:
            torch.autograd.grad(sum(o.sum() for o in outs), wrt, allow_unused=True)
        return True
    except BaseException as e:  # noqa: BLE001 - best effort: the checkers report the function's errors
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return False
    finally:
        _set_rng_states(states)


def _kw_summary(kwargs):
    out = {}
    for k, v in kwargs.items():
        r = repr(v)
        out[k] = r if len(r) <= 60 else type(v).__name__
    return out


def _tallied(kind, call, tally, *a, **k):
    """``call(*a, **k)``, counted in ``tally[kind + "_calls"]`` and, unless another tallied
    call is already being timed (fn calling itself, a backward pass inside fn, fn run
    again inside a backward pass), its CPU time added to ``tally[kind + "_cpu"]``: each
    second is billed once, to the outermost."""
    tally[f"{kind}_calls"] += 1
    if getattr(_LOCAL, "tallying", False):
        return call(*a, **k)
    _LOCAL.tallying = True
    c0 = time.process_time()
    try:
        return call(*a, **k)
    finally:
        tally[f"{kind}_cpu"] += time.process_time() - c0
        _LOCAL.tallying = False


def _counting(fn, tally):
    """``fn`` with its calls tallied as ``fn`` (:func:`_tallied`)."""
    def counted(*a, **k):
        return _tallied("fn", fn, tally, *a, **k)

    return counted


class _EngineStandIn:
    """torch's autograd engine with its backward passes tallied as ``backward``
    (:func:`_tallied`): one batched pass is one call. Everything else is the engine's."""

    def __init__(self, engine, tally):
        self._engine, self._tally = engine, tally

    def run_backward(self, *a, **k):
        return _tallied("backward", self._engine.run_backward, self._tally, *a, **k)

    def __getattr__(self, name):
        return getattr(self._engine, name)


def _engine_bindings():
    """(namespace, name) of every binding of torch's autograd engine object: the class
    attribute ``torch.autograd.Variable._execution_engine`` (torch.autograd.grad and
    .backward read it at each call) and the module global agcheck's direct VJPs keep."""
    found = []
    if "torch" in sys.modules:
        import torch
        found.append((torch.autograd.Variable, "_execution_engine"))
        direct = sys.modules.get("agcheck.backends.torch_engine")
        if direct is None and "agcheck" in sys.modules:
            # imported now, not during a counted check: it would bind the stand-in of that
            # check for good (and count every later check's direct VJPs into it as well)
            import importlib
            direct = importlib.import_module("agcheck.backends.torch_engine")
        if direct is not None and getattr(direct, "_ENGINE", None) is not None:
            found.append((direct, "_ENGINE"))
    return found


@contextlib.contextmanager
def _counted(args, kwargs):
    """The checker's arguments with the checked function tallied, and torch's backward
    passes tallied while the checker runs; yields ``(args, kwargs, tally)``."""
    tally = {"fn_calls": 0, "fn_cpu": 0.0, "backward_calls": 0, "backward_cpu": 0.0}
    if args:
        args = (_counting(args[0], tally), *args[1:])
    else:
        for name in ("func", "f"):
            if name in kwargs:
                kwargs = dict(kwargs, **{name: _counting(kwargs[name], tally)})
                break
    bindings = _engine_bindings()
    saved = [getattr(ns, name) for ns, name in bindings]
    for (ns, name), engine in zip(bindings, saved):
        setattr(ns, name, _EngineStandIn(engine, tally))
    try:
        yield args, kwargs, tally
    finally:
        for (ns, name), engine in zip(bindings, saved):
            setattr(ns, name, engine)


def _timed(fn, args, kwargs, side="inner"):
    if not _STATE.get("count_fn"):
        return _timed_run(fn, args, kwargs, side)
    with _counted(args, kwargs) as (args, kwargs, tally):
        result, error, run = _timed_run(fn, args, kwargs, side)
    run.update(tally)
    return result, error, run


def _timed_run(fn, args, kwargs, side):
    result = error = None
    _LOCAL.side = side
    full_gc = gc.get_stats()[-1]["collections"]
    c0, w0 = time.process_time(), time.perf_counter()
    try:
        result = fn(*args, **kwargs)
    except BaseException as e:  # noqa: BLE001 - recorded by the caller
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        error = e
    finally:
        _LOCAL.side = None
    w1, c1 = time.perf_counter(), time.process_time()
    # a full (oldest-generation) collection traverses the whole process's heap: in a pytest
    # session of thousands of collected tests, 0.2-0.3 s that lands on whichever check's
    # allocations trip it
    run = {"wall": w1 - w0, "cpu": c1 - c0, "verdict": _verdict(result, error),
           "full_gc": gc.get_stats()[-1]["collections"] - full_gc}
    if error is not None:
        # the exception's classes, so that a subclass of the framework's error counts as it
        run["types"] = [f"{c.__module__}.{c.__qualname__}" for c in type(error).__mro__]
    return result, error, run


def _order(r, interleave, control):
    """Who runs in repeat ``r``: ``inner`` (the checker under test), ``fw`` (the framework's
    own, interleaved) and ``control`` (the framework's own once more: its ratio to ``fw`` is
    the timing noise of the same work). Interleaved, agcheck goes first on even repeats and
    the framework's checker on odd ones; with the control the three take turns going first."""
    if not interleave:
        return ("inner",)
    if control:
        turn = ("inner", "fw", "control")
        return turn[r % 3:] + turn[:r % 3]
    return ("inner", "fw") if r % 2 == 0 else ("fw", "inner")


def _make_wrapper(kind, inner, which, original=None):
    def wrapper(*args, **kwargs):
        __tracebackhide__ = True
        if getattr(_LOCAL, "depth", 0):
            # a nested call (torch's gradgradcheck calls its module's gradcheck): inside an
            # interleaved run of the framework's own checker it must stay the framework's
            if getattr(_LOCAL, "side", None) == "fw" and original is not None:
                return original(*args, **kwargs)
            return inner(*args, **kwargs)
        nodeid = _STATE["nodeid"] or "<outside a test>"
        index = _STATE["counters"].get(nodeid, 0)
        _STATE["counters"][nodeid] = index + 1
        passed_fast = bool(kwargs.get("fast_mode", False))
        inputs = args[1] if len(args) > 1 else kwargs.get("inputs", kwargs.get("args"))
        numel = _grad_numel(inputs)
        not_forced = None
        if kind != "check_grads" and _STATE["force_slow"] and passed_fast:
            if numel <= _STATE.get("force_slow_max", 20000):
                kwargs = dict(kwargs, fast_mode=False)
            else:
                not_forced = f"{numel} differentiable elements > --suite-force-slow-max-numel"
        run_fast = bool(kwargs.get("fast_mode", False))
        digest, shapes = _digest(inputs)
        fn = args[0] if args else kwargs.get("func", kwargs.get("f"))
        record = {
            "type": "call", "nodeid": nodeid, "index": index, "kind": kind, "checker": which,
            "mode": "-" if kind == "check_grads" else ("fast" if passed_fast else "slow"),
            "mode_run": "-" if kind == "check_grads" else ("fast" if run_fast else "slow"),
            "fn": getattr(fn, "__qualname__", type(fn).__name__),
            "kwargs": _kw_summary({k: v for k, v in kwargs.items() if k not in ("func", "inputs", "f", "args")}),
            "positional": len(args), "inputs": shapes, "digest": digest, "grad_numel": numel,
            "not_forced": not_forced,
            "runs": [],
        }
        first = (None, None)
        interleave = (_STATE.get("interleave") and original is not None and inner is not original
                      and which != _which(original, original))
        if interleave:
            record["runs_fw"] = []
            if _STATE.get("control"):
                record["runs_control"] = []
        _LOCAL.depth = 1
        try:
            if _STATE.get("warm_fn") and kind != "check_grads":
                record["warmed"] = _warm_function(fn, inputs)
            # every run on the same values: a checker that raised may have left an input moved
            snapshot, started = _snapshot(inputs), False
            record["inputs_put_back"] = 0
            for r in range(max(1, _STATE["repeat"])):
                for side in _order(r, interleave, "runs_control" in record):
                    if started and _put_back(snapshot):
                        record["inputs_put_back"] += 1
                    started = True
                    if side == "inner":
                        result, error, run = _timed(inner, args, kwargs)
                        record["runs"].append(run)
                    else:
                        record["runs_fw" if side == "fw" else "runs_control"].append(
                            _timed(original, args, kwargs, "fw")[2])
                if r == 0:
                    first = (result, error)
                    # pytest's own skip/xfail exceptions, or an interrupt-like outcome: no repeats
                    if error is not None and type(error).__module__.startswith(("_pytest", "pytest")):
                        break
        finally:
            _LOCAL.depth = 0
            record["verdict"] = record["runs"][0]["verdict"] if record["runs"] else "no run"
            _write(record)
            _reseed(f"{nodeid}#{index}")
        result, error = first
        if error is not None:
            raise error
        return result

    wrapper.__name__ = kind
    wrapper.__qualname__ = kind
    wrapper.__wrapped_checker__ = inner
    return wrapper


def _write(record):
    path = _STATE["out"]
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


# -- pytest hooks -------------------------------------------------------------------------------

def _late(config):
    return config.getoption("suite_checker") == "dropin-late"


@pytest.hookimpl(trylast=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Wrap after agcheck's drop-in (which patches tryfirst here) and before the suite's
    conftest files import anything."""
    ns = early_config.known_args_namespace
    _STATE["out"] = getattr(ns, "suite_record", None)
    _STATE["checker"] = getattr(ns, "suite_checker", "torch") or "torch"
    _STATE["repeat"] = getattr(ns, "suite_repeat", 1) or 1
    _STATE["force_slow"] = bool(getattr(ns, "suite_force_slow", False))
    _STATE["interleave"] = bool(getattr(ns, "suite_interleave", False))
    _STATE["warm_fn"] = bool(getattr(ns, "suite_warm_fn", False))
    _STATE["count_fn"] = bool(getattr(ns, "suite_count_fn", False))
    _STATE["control"] = bool(getattr(ns, "suite_control", False))
    _STATE["force_slow_max"] = getattr(ns, "suite_force_slow_max_numel", 20000)
    frameworks = (getattr(ns, "suite_frameworks", "torch,jax") or "").split(",")
    if "torch" in frameworks:
        try:
            import torch
            torch.set_num_threads(1)
        except ImportError:
            pass
    if "jax" in frameworks:
        try:
            import jax.test_util  # noqa: F401
        except ImportError:
            pass
    if _STATE["checker"] != "dropin-late":
        install()


def pytest_configure(config):
    if not _STATE["installed"] and not _late(config):
        install()


def _mentions_checker(fn):
    """Whether the test's source, or the source of the function it wraps, names a checker.
    parameterized.expand's wrappers keep the original in ``place_as`` (not ``__wrapped__``)."""
    seen = set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        try:
            if any(w in inspect.getsource(fn) for w in SELECT_WORDS):
                return True
        except (OSError, TypeError):
            return True
        fn = getattr(fn, "place_as", None) or getattr(fn, "__wrapped__", None)
    return False


def pytest_collection_modifyitems(session, config, items):
    if not config.getoption("suite_select"):
        return
    keep, drop = [], []
    cache = {}
    for item in items:
        fn = getattr(item, "function", None)
        if fn is None:
            keep.append(item)
            continue
        key = id(fn)
        if key not in cache:
            cache[key] = _mentions_checker(fn)
        (keep if cache[key] else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_finish(session):
    if _late(session.config):
        import agcheck
        if "torch" in sys.modules:
            _STATE["late_patch_torch"] = agcheck.patch_torch()
        if "jax" in sys.modules and hasattr(agcheck, "patch_jax"):
            try:
                _STATE["late_patch_jax"] = agcheck.patch_jax()
            except Exception as e:  # noqa: BLE001
                _write({"type": "note", "note": f"patch_jax failed: {type(e).__name__}: {e}"})
    # a module imported during collection may have bound an original after install()
    n = install()
    _write({"type": "session", "checker": _STATE["checker"], "rebound_after_collection": n,
            "selected": len(session.items), "repeat": _STATE["repeat"],
            "force_slow": _STATE["force_slow"]})


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _STATE["nodeid"] = item.nodeid
    _reseed(item.nodeid)


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcome = report.outcome
        if hasattr(report, "wasxfail"):
            outcome = "xfail" if report.outcome == "skipped" else "xpass"
        _write({"type": "test", "nodeid": report.nodeid, "when": report.when, "outcome": outcome,
                "duration": report.duration})
