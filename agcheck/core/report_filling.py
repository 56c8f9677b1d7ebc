"""Filling in a failure report: the failing Jacobian blocks, then backend, options,
diagnoses, what reproduces the check, and the summary in the message.

The only part of the report that knows the checks' machinery; never on the passing path.
"""
from __future__ import annotations

import functools
import importlib.metadata
import inspect
import os
import platform
import sys
import types
import weakref

import numpy as np

from agcheck.core.jacobian import PROBE_SEED, numerical_rows_at, outputs_at_input
from agcheck.stencil import Stencil
from agcheck.options import GradcheckOptions
from agcheck.diagnosis import diagnose
from agcheck.errors import GradcheckError
from agcheck.report.messages import complex_part, message_with_summary
from agcheck.report.context import CheckContext
from agcheck.report.model import JacobianBlock
from agcheck.report.values import FLOAT32_SAMPLE, float32_valued

__all__ = ["attach_jacobian_failure", "complete_report"]

#: the one-sided differences diagnosis asks for (``side="right"`` / ``"left"``)
ONE_SIDED = {
    "right": Stencil("right", (0, 1), (-1.0, 1.0), 0.5),
    "left": Stencil("left", (-1, 0), (-1.0, 1.0), 0.5),
}

#: report -> {block index: resample}, until complete_report releases fn and its inputs
_resamplers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
#: report -> {(fn, args, position) identities: fn's outputs at the points evaluated},
#: shared by the blocks of one input
_evaluated: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
#: report -> (fn, args) as the Jacobian comparison saw them, for a context without fn
_subjects: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
#: points are shared only where fn's outputs hold at most this many elements in all: a
#: diagnosis evaluates at most 2 blocks x 4 rows x 12 moves + 1 points (about 50 MB here)
SHARED_OUTPUT_ELEMENTS = 32768


def attach_jacobian_failure(error: GradcheckError, run, analytical, numerical, *, output: int, input: int,
                            complex_indices, test_imag: bool, forward: bool, where=None, projection=None) -> None:
    """Record the failing block of a Jacobian comparison in ``error.report``; never raises.

    ``where``, ``(fn, args, position, outputs, output_position)``, lets diagnosis recompute
    numerical entries with other steps.
    """
    rep = error.report
    try:
        _subjects.setdefault(rep, (run.fn, run.args))
        be, opts = run.be, run.opts
        kw = dict(mode="forward" if forward else "reverse", fast=projection is not None,
                  part=complex_part(output, input, complex_indices, test_imag, forward),
                  atol=float(opts.atol), rtol=float(opts.rtol))
        if where is not None:
            fn, args, position, outputs, output_position = where
            x, out = args[position], outputs[output_position]
            double = bool(be.is_double_precision(x))
            kw.update(input_shape=tuple(int(s) for s in x.shape), output_shape=tuple(int(s) for s in out.shape),
                      input_dtype=be.dtype_name(x), input_double=double,
                      output_float32_valued=double and _float32_valued(be, out), output_scale=_largest(be, out),
                      eps=float(run.eps_for(x)))
            shared = None
            if sum(be.numel(o) for o in outputs if be.is_array(o)) <= SHARED_OUTPUT_ELEMENTS:
                key = (id(fn), position, tuple(id(a) for a in args))
                shared = _evaluated.setdefault(rep, {}).setdefault(key, {})
            resample = _resampler(run, fn, args, position, output_position, shared, out)
        if projection is not None:
            kw["projection"] = {k: _to_scalar(be, v) for k, v in projection.items()}
        block = JacobianBlock.from_arrays(be.to_numpy(numerical), be.to_numpy(analytical),
                                          output=output, input=input, **kw)
        if where is not None:
            _resamplers.setdefault(rep, {})[len(rep.blocks)] = resample
        rep.blocks.append(block)
    except Exception as ex:  # the report must never hide the failure itself
        rep.notes.append(f"could not record the Jacobian blocks: {type(ex).__name__}: {ex}")


def _float32_valued(be, out):
    """True below double precision (bfloat16 included, which NumPy cannot hold), else
    ``float32_valued`` of the first elements; ``None`` where unreadable (a sparse output)."""
    try:
        if not be.is_double_precision(out):
            return True
        return float32_valued(be.to_numpy(be.xp(out).reshape(out, (-1,))[:FLOAT32_SAMPLE]))
    except Exception:  # noqa: BLE001 - a hint for the diagnosis, never a reason to lose the block
        return None


def _largest(be, out):
    """The largest |entry| of a backend array, or ``None`` where it cannot be read."""
    try:
        a = np.abs(np.asarray(be.to_numpy(out)))
        return float(a.max()) if a.size else None
    except Exception:  # noqa: BLE001 - a hint for the diagnosis, never a reason to lose the block
        return None


def _to_scalar(be, v):
    if isinstance(v, (int, float, complex)):
        return v
    a = np.asarray(be.to_numpy(v))
    return a.item() if a.size == 1 else a


def _resampler(run, fn, args, position, output_position, shared=None, checked=None):
    """A callable giving the block's numerical rows for each ``(eps, side)``, as
    ``(len(rows), output.numel)`` NumPy arrays; points in ``shared`` are not evaluated again.

    ``unmoved()`` gives the output at the unmoved input as the check computed it and from
    fn now; ``evaluated_rows()`` (with ``shared``) the elements whose moved points it holds."""
    def resample(steps, rows):
        found = numerical_rows_at(run.be, fn, args, position, output_position, rows,
                                  [(eps, run.stencil if side == "central" else ONE_SIDED[side]) for eps, side in steps],
                                  evaluated=shared)
        return [np.stack([np.asarray(run.be.to_numpy(row)).reshape(-1) for row in step]) for step in found]

    def unmoved():
        again = outputs_at_input(run.be, fn, args, position, evaluated=shared)[output_position]
        return np.asarray(run.be.to_numpy(checked)), np.asarray(run.be.to_numpy(again))

    def values():
        return np.asarray(run.be.to_numpy(checked))

    def input_values():
        return np.asarray(run.be.to_numpy(args[position])).reshape(-1)

    resample.unmoved = unmoved
    resample.values = values
    resample.input_values = input_values
    if shared is not None:
        resample.evaluated_rows = lambda: {element for element, _ in shared if element is not None}
    return resample


def complete_report(error: GradcheckError, backend=None, options=None, *, fn=None, inputs=None,
                    call: str = "gradcheck", keywords: dict | None = None) -> None:
    """Fill in backend, options, diagnoses and context, and put the summary in the message.

    ``keywords`` are the call's keywords beyond ``options``, repeated in the report's code.
    Called after a failure while the caller's state is still guarded (diagnosis may call
    ``fn`` again). Never raises.
    """
    rep = getattr(error, "report", None)
    if rep is None or rep.completed:
        return
    try:
        rep.backend = getattr(backend, "name", backend)
        if options is not None:
            rep.options = options.as_dict() if hasattr(options, "as_dict") else dict(options)
            rep.option_defaults = {k: getattr(GradcheckOptions, k, None) for k in rep.options}
        try:
            if fn is None and rep in _subjects:
                fn, inputs = _subjects[rep]
                while _internal(fn) and hasattr(fn, "__wrapped__"):  # the check's own wrappers
                    fn = fn.__wrapped__
                if _internal(fn):  # a function agcheck built (gradgradcheck's VJP, say): not the caller's
                    fn = inputs = None
            rep.context = check_context(backend, rep.options, fn, inputs, call, keywords)
        except Exception as ex:  # noqa: BLE001 - the context must never hide the failure
            rep.notes.append(f"context not recorded: {type(ex).__name__}: {ex}")
        try:
            rep.diagnoses = diagnose(rep, _resamplers.get(rep))
        except Exception as ex:
            rep.notes.append(f"diagnosis failed: {type(ex).__name__}: {ex}")
        rep.completed = True
        summary = rep.summary()
        if error.args and isinstance(error.args[0], str):
            error.args = (message_with_summary(error.args[0], summary),) + tuple(error.args[1:])
    except Exception as ex:
        rep.notes.append(f"report incomplete: {type(ex).__name__}: {ex}")
    finally:
        _resamplers.pop(rep, None)  # release fn and its inputs
        _evaluated.pop(rep, None)
        _subjects.pop(rep, None)


# -- the check's context: what runs it again ----------------------------------------------------

#: options never worth repeating in a reproduction (their value there is fixed or cosmetic)
_NOT_REPEATED = ("raise_exception", "progress")
#: gradgradcheck's keywords for the options gradcheck names otherwise
_GRADGRAD_NAMES = {"check_forward_ad": "check_fwd_over_rev", "check_backward_ad": "check_rev_over_rev"}
#: the frameworks whose functions are named from their top-level module (``torch.sin``)
_FRAMEWORKS = ("torch", "jax", "numpy", "tensorflow", "tf", "cupy", "scipy")


def check_context(backend, options: dict | None, fn=None, inputs=None, call: str = "gradcheck",
                  keywords: dict | None = None) -> CheckContext:
    """The :class:`CheckContext` of a check of ``fn`` (or None) on ``inputs`` (or None)."""
    name = getattr(backend, "name", backend)
    ctx = CheckContext(call=call, test=_current_test(), versions=_versions(backend))
    fast = bool(options and options.get("fast_mode"))
    ctx.seeds = {"fast_mode_vectors": PROBE_SEED}
    ctx.random = (f"fast mode's vectors u, v from a private generator seeded {PROBE_SEED} at each check "
                  "(the same on every run)" if fast else
                  "none in slow mode's comparison; agcheck's random draws have fixed seeds (the same on every run)")
    if fn is not None:
        _describe_function(ctx, fn)
    if inputs is not None and backend is not None and not isinstance(backend, str):
        args = backend.as_tuple(inputs)
        try:
            checked = set(backend.checked_positions(args))
        except Exception:  # noqa: BLE001 - the check's own refusal comes from elsewhere
            checked = set()
        ctx.inputs = [_describe_input(backend, k, x, k in checked) for k, x in enumerate(args)]
        codes = [_input_code(name, d, k) for k, d in enumerate(ctx.inputs)]
        ctx.inputs_code = "(" + ", ".join(codes) + ("," if len(codes) == 1 else "") + ")"
        ctx.setup = _setup_lines(name, ctx)
    given = {k: v for k, v in (options or {}).items() if k not in _NOT_REPEATED and v != getattr(GradcheckOptions, k, v)}
    if call == "gradgradcheck":  # gradgradcheck's names of the two modes, and its default of masked
        given = {_GRADGRAD_NAMES.get(k, k): v for k, v in given.items() if (k, v) != ("masked", False)}
    given.update(keywords or {})
    ctx.keywords_code = {k: _value_code(name, backend, v) for k, v in given.items()}
    if name not in (None, "torch") and "backend" not in ctx.keywords_code:
        ctx.keywords_code["backend"] = repr(name)
    return ctx


def _current_test() -> str | None:
    """pytest's id of the running test (``PYTEST_CURRENT_TEST`` less its phase)."""
    running = os.environ.get("PYTEST_CURRENT_TEST")
    return running.rsplit(" (", 1)[0] if running else None


@functools.lru_cache(maxsize=None)
def _agcheck_version() -> str:
    try:
        return importlib.metadata.version("agcheck")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _versions(backend) -> dict:
    versions = {"agcheck": _agcheck_version()}
    if backend is not None and not isinstance(backend, str):
        try:
            versions[backend.name] = backend.framework_version()
        except Exception:  # noqa: BLE001 - a version is a courtesy
            versions[backend.name] = "unknown"
    versions.setdefault("numpy", np.__version__)
    versions["python"] = platform.python_version()
    return versions


def _internal(fn) -> bool:
    """Whether ``fn`` is a function agcheck made (a VJP, a flattened function), not the caller's."""
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return module == "agcheck" or module.startswith("agcheck.")


def _describe_function(ctx: CheckContext, fn) -> None:
    """``fn``'s name, module, definition site and a Python expression for it."""
    target, partial = fn, isinstance(fn, functools.partial)
    while isinstance(target, functools.partial):
        target = target.func
    owner = getattr(target, "__self__", None)
    path = None  # the attribute path from the module, where fn can be named so
    if isinstance(owner, type):  # a classmethod, e.g. a custom autograd Function's apply
        ctx.function, ctx.module = f"{owner.__qualname__}.{target.__name__}", owner.__module__
        path, where = ctx.function, owner
    elif owner is not None and not isinstance(owner, types.ModuleType):  # a method of an instance
        ctx.function, ctx.module = f"{type(owner).__qualname__}.{target.__name__}", type(owner).__module__
        where = target
    elif hasattr(target, "__qualname__"):
        ctx.function, ctx.module = target.__qualname__, getattr(target, "__module__", None)
        path, where = ctx.function, target
    else:  # a callable object (a module of a network, say)
        ctx.function, ctx.module = f"{type(target).__qualname__} instance", type(target).__module__
        where = type(target)
    if partial:
        ctx.function, path = f"functools.partial({ctx.function}, ...)", None
    ctx.source = _source(where)
    ctx.function_code = _function_code(ctx, target, path)


def _source(obj) -> str | None:
    """``"file:line"`` of ``obj``'s definition (relative to the working directory when inside it)."""
    code = getattr(inspect.unwrap(obj) if callable(obj) else obj, "__code__", None)
    try:
        if code is not None:
            file, line = code.co_filename, code.co_firstlineno
        else:
            file, line = inspect.getsourcefile(obj), inspect.getsourcelines(obj)[1]
    except (TypeError, OSError):
        return None
    if not file:
        return None
    try:
        relative = os.path.relpath(file)
        file = relative if not relative.startswith("..") else file
    except ValueError:  # another drive
        pass
    return f"{file}:{line}"


def _function_code(ctx: CheckContext, target, path: str | None) -> str:
    """A Python expression naming ``target`` (``torch.sin``, ``MatVec.apply``), or ``"fn"``."""
    module = ctx.module
    if path is None or module is None or "<" in path:
        return "fn"
    if module.split(".")[0] in _FRAMEWORKS:  # torch.sin, not torch._VariableFunctionsClass.sin
        name = getattr(target, "__name__", "")
        for candidate in (name, path):
            if candidate and _resolves(module, candidate, target):
                return f"{module}.{candidate}"
        return "fn"
    return path if _resolves(module, path, target) else "fn"


def _resolves(module: str, path: str, target) -> bool:
    obj = sys.modules.get(module)
    for part in path.split("."):
        obj = getattr(obj, part, None)
    try:
        return obj is target or (obj is not None and bool(obj == target))
    except Exception:  # noqa: BLE001 - an object whose == does not answer
        return False


def _describe_input(be, position: int, x, checked: bool) -> dict:
    if be.is_array(x):
        d = {"position": position, "kind": "array", "shape": [int(s) for s in x.shape],
             "dtype": be.dtype_name(x).rsplit(".", 1)[-1], "checked": checked}
        for key, read in (("layout", be.layout), ("device", be.device_name)):
            try:
                d[key] = str(read(x))
            except Exception:  # noqa: BLE001 - a detail, where the framework tells it
                pass
        return d
    text = repr(x) if x is None or isinstance(x, (bool, int, float, complex, str)) else type(x).__qualname__
    return {"position": position, "kind": "value", "type": type(x).__qualname__,
            "text": text if len(text) <= 80 else text[:77] + "...", "code": repr(x) if text == repr(x) else None}


def _input_code(name: str, d: dict, key: int) -> str:
    """A Python expression for an input like ``d`` (random values of its shape and dtype)."""
    if d["kind"] != "array":
        return d.get("code") or "..."
    shape, dtype = tuple(d["shape"]), d["dtype"]
    floating = dtype.startswith(("float", "complex", "bfloat"))
    if name == "torch":
        dims = ", ".join(map(str, shape)) if shape else "()"
        if not floating:
            return f"torch.zeros({dims}, dtype=torch.{dtype})"
        device = f", device={d['device']!r}" if d.get("device") not in (None, "cpu") else ""
        layout = {"sparse_coo": ".to_sparse()", "sparse_csr": ".to_sparse_csr()"}.get(d.get("layout"), "")
        if layout:
            return f"torch.randn({dims}, dtype=torch.{dtype}{device}){layout}" + (".requires_grad_()" if d["checked"] else "")
        return f"torch.randn({dims}, dtype=torch.{dtype}{device}" + (", requires_grad=True)" if d["checked"] else ")")
    if name == "jax":
        if not floating:
            return f"jnp.zeros({shape}, dtype=jnp.{dtype})"
        return f"jax.random.normal(jax.random.key({key}), {shape}, dtype=jnp.{dtype})"
    if name == "numpy":
        if not floating:
            return f"np.zeros({shape}, dtype=np.{dtype})"
        value = f"rng.standard_normal({shape})"
        if dtype.startswith("complex"):
            value = f"({value} + 1j * rng.standard_normal({shape}))"
        return value if dtype in ("float64", "complex128") else f"{value}.astype(np.{dtype})"
    if name == "tensorflow":
        if not floating:
            return f"tf.zeros({shape}, dtype=tf.{dtype})"
        if dtype.startswith("complex"):
            real = "float64" if dtype == "complex128" else "float32"
            return f"tf.complex(tf.random.normal({shape}, dtype=tf.{real}), tf.random.normal({shape}, dtype=tf.{real}))"
        return f"tf.random.normal({shape}, dtype=tf.{dtype})"
    return "..."


#: the imports a reproduction on each backend needs
_IMPORTS = {"torch": ["import torch"], "jax": ["import jax", "import jax.numpy as jnp"],
            "numpy": ["import numpy as np", "rng = np.random.default_rng(0)"], "tensorflow": ["import tensorflow as tf"]}


def _setup_lines(name: str, ctx: CheckContext) -> list:
    lines = list(_IMPORTS.get(name, [])) + ["import agcheck"]
    if name == "jax" and any(d.get("dtype", "").endswith(("64", "128")) for d in ctx.inputs):
        lines.insert(2, 'jax.config.update("jax_enable_x64", True)')
    if ctx.function_code == "fn":
        where = f" ({ctx.source})" if ctx.source else ""
        lines.append(f"fn = ...  # {ctx.function or 'the checked function'}{where}: not importable, define it here")
    elif ctx.module == "__main__":
        lines.append(f"# {ctx.function_code}: from the script that ran the check")
    elif ctx.module and ctx.module.split(".")[0] not in _FRAMEWORKS:
        lines.append(f"from {ctx.module} import {ctx.function_code.split('.')[0]}")
    elif ctx.module and f"import {ctx.module.split('.')[0]}" not in lines:  # numpy.sin beside "import numpy as np"
        lines.insert(0, f"import {ctx.module.split('.')[0]}")
    lines.append("# inputs of the failing shapes and dtypes; the failing values are not saved")
    if any(d["kind"] != "array" and d.get("code") is None for d in ctx.inputs):
        lines.append("# replace each ... by the argument the check was given")
    if name not in (None, "torch"):
        lines.append("# add the backend keywords the check was given (wrt=, vjp=, jvp=), if any")
    return lines


def _value_code(name, be, v) -> str:
    """A keyword's value as Python code: arrays as random ones of their shapes, functions by name."""
    if callable(v) and not isinstance(v, type):
        named = CheckContext()
        _describe_function(named, v)
        if named.function_code != "fn":
            return named.function_code
        name = getattr(v, "__name__", "")
        return name if name.isidentifier() else "..."
    if be is not None and not isinstance(be, str):
        if isinstance(v, (tuple, list)) and v and all(be.is_array(a) for a in v):
            codes = [_input_code(name, _describe_input(be, k, a, False), k) for k, a in enumerate(v)]
            return "(" + ", ".join(codes) + ("," if len(codes) == 1 else "") + ")"
        if be.is_array(v):
            return _input_code(name, _describe_input(be, 0, v, False), 0)
    return repr(v)
