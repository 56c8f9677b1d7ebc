from unittest import mock

import numpy as np
import pytest
import hypothesis
import hypothesis.strategies as st
import torch

import agcheck
from agcheck.backend import BackendUnavailableError, get_backend, infer_backend
from agcheck.backends import torch_backend

from .helpers import make, property_settings


def test_torch_backend_is_inferred_and_named():
    be = infer_backend((make(3), 2.0, "text"))
    assert be.name == "torch"
    assert get_backend("torch") is be


def test_numpy_arrays_pass_through_beside_tensors():
    assert infer_backend((make(3), np.ones(3))).name == "torch"


def test_unknown_backend_lists_the_known_ones():
    # (TensorFlow, the example here before, is a backend now)
    with pytest.raises(ValueError, match=r"unknown backend 'mxnet'.*torch \(installed\)"):
        get_backend("mxnet")


def test_no_arrays_cannot_infer():
    with pytest.raises(TypeError, match="could not infer the backend"):
        agcheck.gradcheck(lambda a: a, (1.0, 2))


def test_torch_backend_takes_no_extra_keywords():
    with pytest.raises(TypeError, match="unexpected keyword argument\(s\) 'wrt'.*'torch' backend takes sparse_vjp= only"):
        agcheck.gradcheck(lambda t: t, (make(2),), wrt=0)


def test_missing_framework_names_the_extra(monkeypatch):
    from agcheck.backends import registry

    monkeypatch.setitem(registry._REGISTRY, "fake", ("agcheck.backends.fake", "no_such_framework_xyz", "fake"))
    with pytest.raises(BackendUnavailableError, match=r"pip install 'agcheck\[fake\]'"):
        get_backend("fake")


def test_available_backends_reports_torch():
    assert agcheck.available_backends()["torch"] is True


def test_core_imports_no_framework():
    import subprocess
    import sys

    code = (
        "import sys, agcheck, agcheck.gradcheck, agcheck.gradgradcheck, agcheck.engine.batched;"
        "bad = [m for m in ('torch', 'jax', 'tensorflow') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_fn_must_be_callable():
    with pytest.raises(TypeError, match="callable"):
        agcheck.gradcheck(42, (make(2),))


def test_non_array_output_is_a_clear_error_and_an_attribute_error():
    with pytest.raises(AttributeError, match="output 0 is NoneType"):
        agcheck.gradcheck(lambda t: None, (make(2),))
    with pytest.raises(TypeError, match="output 1 is int"):
        agcheck.gradcheck(lambda t: (t * 2, 3), (make(2),))


def test_list_outputs_are_accepted():
    assert agcheck.gradcheck(lambda t: [t * 2, t.sin()], (make(3),))


def test_torch_tensor_roundtrip_to_numpy():
    be = get_backend("torch")
    z = torch.tensor([1 + 2j], dtype=torch.complex128).conj()
    assert be.to_numpy(z)[0] == 1 - 2j


def test_lazily_negated_and_efficient_zero_tensors_convert_to_numpy():
    # a conjugate's imaginary part is a view with torch's negative bit, the gradient of sgn
    # may be an efficient zero tensor; numpy() refuses both (the forced OpInfo sweep found
    # the engine's second pass handing such checks to the reference engine on that error)
    be = get_backend("torch")
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex128)
    imag = z.conj().imag
    assert imag.is_neg()
    np.testing.assert_array_equal(be.to_numpy(imag), [-2.0, 4.0])
    zeros = torch._efficientzerotensor(2, 3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="ZeroTensor"):
        zeros.numpy()
    converted = be.to_numpy(zeros)
    assert converted.shape == (2, 3) and converted.dtype == np.float64 and not converted.any()


_SPECIAL = [0.0, -0.0, 1.0, -1.0, 1e-5, 1e300, float("inf"), float("-inf"), float("nan")]


@property_settings(200)
@hypothesis.given(
    st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64), st.sampled_from(_SPECIAL)),
             min_size=1, max_size=8),
    st.lists(st.floats(-1e-3, 1e-3), min_size=8, max_size=8),
    st.sampled_from([(1e-3, 1e-5), (0.0, 0.0), (1e-7, 1e-12)]),
    st.booleans(),
)
# |b| overflows where |rtol * b| does not: rtol * |b| would be inf * 0 = NaN
@hypothesis.example([1.2711610061536464e308], [0.0] * 8, (0.0, 0.0), True)
# differences just beyond the bound, and just within it: set by rtol, and by atol
@hypothesis.example([0.5, -0.25], [7e-4, -2e-4] + [0.0] * 6, (1e-3, 1e-5), False)
@hypothesis.example([0.5, -0.25], [4e-4, -2e-4] + [0.0] * 6, (1e-3, 1e-5), True)
@hypothesis.example([0.0, 1e-300], [1.2e-5, 9e-6] + [0.0] * 6, (1e-3, 1e-5), False)
@hypothesis.example([0.0, 1e-300], [9e-6, 0.0] + [0.0] * 6, (1e-3, 1e-5), True)
def test_torch_allclose_shortcut_agrees_with_torch_allclose(values, shifts, tolerances, complex_):
    be = agcheck.get_backend("torch")
    a = torch.tensor(values, dtype=torch.float64)
    b = a + torch.tensor(shifts[: len(values)], dtype=torch.float64)
    if complex_:
        a, b = torch.complex(a, b.flip(0)), torch.complex(b, a.flip(0))
    rtol, atol = tolerances
    # the shortcut is taken from _FEWER_PASSES_NUMEL entries on: here on any size
    with mock.patch.object(torch_backend, "_FEWER_PASSES_NUMEL", 1):
        assert be.allclose(a, b, rtol, atol) == bool(torch.allclose(a, b, rtol, atol))
        assert be.allclose(b, a, rtol, atol) == bool(torch.allclose(b, a, rtol, atol))


def test_inference_follows_a_backend_registered_again(monkeypatch):
    """Inference remembers which backends own an input type; registering a backend again
    (or importing another framework) makes it ask afresh."""
    from agcheck.backends import registry

    assert infer_backend((make(3),)).name == "torch"
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_INSTANCES", dict(registry._INSTANCES))
    fake = type(registry.get_backend("numpy"))()
    fake.owns = lambda x: isinstance(x, torch.Tensor)
    fake.name = "fake"
    registry._INSTANCES["fake"] = fake
    registry.register_backend("fake", "agcheck.backends.numpy_backend", "torch", "fake")
    with pytest.raises(TypeError, match="inputs mix arrays of several frameworks"):
        infer_backend((make(3),))
    monkeypatch.undo()  # the registry as it was: asked afresh again
    assert infer_backend((make(3),)).name == "torch"


#: the checkout, so that ``tests.helpers`` imports in a fresh interpreter
_ROOT = str(__import__("pathlib").Path(__file__).resolve().parent.parent)

_FIRST_TORCH_CHECK = r"""
import sys
import numpy, torch
import agcheck
from tests.helpers import ScaledSin

fn = ScaledSin.apply
x = torch.rand(5, dtype=torch.float64, requires_grad=True)
verdicts = [agcheck.gradcheck(fn, (x,), fast_mode=fast) for fast in (True, False)]
ScaledSin.factor = 1.1
verdicts += [agcheck.gradcheck(fn, (x,), fast_mode=fast, raise_exception=False) for fast in (True, False)]
print(verdicts, sorted(m for m in ("numpy.random", "agcheck.backends.numpy_backend") if m in sys.modules))
"""


def test_a_torch_check_imports_neither_numpy_random_nor_the_numpy_backend():
    """The first check of a process pays no import it does not need: NumPy's random module
    (no global state to keep before it is imported) and the NumPy backend (the fallback of
    inference, asked only for leaves no other backend owns)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _FIRST_TORCH_CHECK], capture_output=True, text=True, cwd=_ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[0] == "[True, True, False, False] []"


def test_a_check_whose_fn_first_imports_numpy_random_leaves_its_draws_alone():
    """With ``numpy.random`` imported by ``fn`` during the check, there was no state to keep:
    the check runs and decides as usual."""
    import subprocess
    import sys

    drawing = ("def fn(a):\n"
               "    import numpy.random\n"
               "    numpy.random.rand(2)\n"
               "    return ScaledSin.apply(a)\n")
    code = _FIRST_TORCH_CHECK.replace("fn = ScaledSin.apply\n", drawing)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=_ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[0] == "[True, True, False, False] ['numpy.random']"


def test_torchs_func_keyword_names_the_function():
    x = make(3)
    assert agcheck.gradcheck(func=lambda t: t.sin(), inputs=(x,))
    assert agcheck.gradgradcheck(func=lambda t: t.sin(), inputs=(x,))
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'fn'"):
        agcheck.gradcheck(inputs=(x,))
    with pytest.raises(TypeError, match="got the function twice"):
        agcheck.gradcheck(lambda t: t, (x,), func=lambda t: t)


def test_a_misspelt_keyword_is_named_with_the_keyword_meant():
    x = make(3)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'atoll'; did you mean 'atol'\?"):
        agcheck.gradcheck(lambda t: t.sin(), (x,), atoll=1e-3)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'fast_mdoe'; did you mean 'fast_mode'\?"):
        agcheck.gradgradcheck(lambda t: t.sin(), (x,), fast_mdoe=True)
    assert agcheck.gradcheck(lambda t: t.sin(), (x,), atol=1e-3)


class _Boxed:
    """A framework's array as a host namespace meets it: shape, dtype, values behind it."""

    def __init__(self, values):
        self.values = np.asarray(values)
        self.shape, self.dtype = self.values.shape, self.values.dtype


def test_the_host_namespace_computes_on_host_views_and_hands_framework_arrays_back():
    from types import SimpleNamespace

    from agcheck.backends.host_checks import HostNamespace

    backs = []

    def back(values, like, dtype):
        backs.append(dtype)
        return _Boxed(values)

    xp = HostNamespace(lambda a: a.values if isinstance(a, _Boxed) else None, back,
                       native=SimpleNamespace(reshape=lambda x, shape: ("native", shape)))
    b = _Boxed(np.arange(-3.0, 3.0))
    assert isinstance(xp.reshape(b, (2, 3)), _Boxed) and xp.reshape(b, (2, 3)).shape == (2, 3)
    np.testing.assert_array_equal(xp.stack([b, b], axis=0).values, np.stack([b.values, b.values]))
    assert xp.astype(b, np.int8).dtype == np.int8 and backs[-1] is np.int8  # the dtype asked for reaches back
    assert float(xp.max(xp.abs(b))) == 3.0 and xp.int8 is np.int8  # reductions stay on the host; dtypes unwrapped
    traced = SimpleNamespace(shape=(1,), dtype=np.float64)  # no host view: the framework's own namespace
    assert xp.reshape(traced, (1,)) == ("native", (1,))
