"""agcheck in the place of torch's gradcheck: ``agcheck.patch_torch()`` and
``pytest --agcheck-torch`` (issue 13, items 2 and 3)."""
from __future__ import annotations

import sys
import types

import pytest

pytest_plugins = ["pytester"]

torch = pytest.importorskip("torch")
import torch.autograd.gradcheck  # noqa: E402,F401,F811  (the module, for its GradcheckError)
import torch.testing._internal.common_utils as common_utils  # noqa: E402
from torch.autograd import gradcheck as early_gradcheck  # noqa: E402  (bound before any patch)

import agcheck  # noqa: E402
from agcheck.frontends import dropin  # noqa: E402

from tests.test_pytest_plugin import run  # noqa: E402

GC_MODULE = sys.modules["torch.autograd.gradcheck"]
# kept in a dict: a module-level name bound to torch's function is rebound by the patch
_TORCH = {"gradcheck": GC_MODULE.gradcheck, "gradgradcheck": GC_MODULE.gradgradcheck}


class Doubled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, g):
        return 2 * g


class Tripled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, g):
        return 3 * g


def _x():
    return torch.randn(3, dtype=torch.float64, requires_grad=True)


def _all_original():
    return (torch.autograd.gradcheck is _TORCH["gradcheck"] and torch.autograd.gradgradcheck is _TORCH["gradgradcheck"]
            and GC_MODULE.gradcheck is _TORCH["gradcheck"] and GC_MODULE.gradgradcheck is _TORCH["gradgradcheck"]
            and early_gradcheck is _TORCH["gradcheck"])


def test_context_manager_routes_every_name_and_restores():
    assert _all_original()
    with agcheck.patch_torch() as patch:
        me = sys.modules[__name__]
        for f in (torch.autograd.gradcheck, GC_MODULE.gradcheck, me.early_gradcheck):
            assert f is not _TORCH["gradcheck"] and getattr(f, "agcheck_dropin", None) == "torch"
        assert torch.autograd.gradgradcheck is not _TORCH["gradgradcheck"]
        assert torch.autograd.gradcheck(Doubled.apply, (_x(),))
        assert me.early_gradcheck(Doubled.apply, (_x(),), fast_mode=True)
        assert common_utils.gradcheck(torch.sin, (_x(),))  # the wrapper reaches torch.autograd.gradcheck
        assert common_utils.gradgradcheck(torch.sin, (_x(),))
        with pytest.raises(GC_MODULE.GradcheckError) as info:
            me.early_gradcheck(Tripled.apply, (_x(),))
        assert isinstance(info.value, agcheck.GradcheckError)
        assert "Jacobian mismatch for output 0 with respect to input 0" in str(info.value)
        assert "agcheck report" in str(info.value)
        assert torch.autograd.gradcheck(Tripled.apply, (_x(),), raise_exception=False) is False
        assert patch.checks == 6 and patch.failures == 2
    assert not patch.active
    assert sys.modules[__name__].early_gradcheck is _TORCH["gradcheck"]
    assert _all_original()


def test_handle_restore_nesting_and_later_imports():
    handle = agcheck.patch_torch()
    try:
        late = types.ModuleType("agcheck_late_import")
        late.gradcheck = torch.autograd.gradcheck  # bound while patched
        sys.modules[late.__name__] = late
        with agcheck.patch_torch() as inner:  # nested: rebinds nothing, undoes nothing
            assert inner.rebound == 0
        assert torch.autograd.gradcheck is not _TORCH["gradcheck"]
        assert handle.active and repr(handle).startswith("<agcheck torch patch, active")
    finally:
        handle.restore()
        handle.restore()  # a second call does nothing
        sys.modules.pop("agcheck_late_import", None)
    assert late.gradcheck is _TORCH["gradcheck"]
    assert _all_original()


def test_keywords_pass_through_and_unknown_ones_are_refused():
    seen = {}

    def spy(kind, check, fn, inputs, kwargs):
        seen[kind] = dict(kwargs)
        return True

    with agcheck.patch_torch():
        mod = sys.modules["agcheck.backends.torch_dropin"]
        saved, mod.observer = mod.observer, spy
        try:
            torch.autograd.gradcheck(Doubled.apply, (_x(),), eps=1e-5, atol=1e-4, rtol=1e-2, nondet_tol=1e-9,
                                     check_undefined_grad=False, check_grad_dtypes=True, check_batched_grad=True,
                                     check_batched_forward_grad=False, check_forward_ad=False,
                                     check_backward_ad=True, fast_mode=True, masked=None, raise_exception=True)
            torch.autograd.gradgradcheck(Doubled.apply, (_x(),), (torch.ones(3, dtype=torch.float64),),
                                         gen_non_contig_grad_outputs=True, check_fwd_over_rev=True,
                                         check_rev_over_rev=False, masked=False)
        finally:
            mod.observer = saved
        with pytest.raises(TypeError, match="unexpected keyword argument 'foo'"):
            torch.autograd.gradcheck(Doubled.apply, (_x(),), foo=1)
    assert seen["gradcheck"]["nondet_tol"] == 1e-9 and seen["gradcheck"]["backend"] == "torch"
    assert seen["gradcheck"]["check_batched_grad"] is True and seen["gradcheck"]["fast_mode"] is True
    assert seen["gradgradcheck"]["check_fwd_over_rev"] is True and "grad_outputs" in seen["gradgradcheck"]


def test_stats_count_checks():
    before = dropin.stats("torch")
    with agcheck.patch_torch():
        torch.autograd.gradcheck(torch.sin, (_x(),))
    after = dropin.stats("torch")
    assert after["checks"] == before["checks"] + 1


# -- pytest --agcheck-torch ---------------------------------------------------------------------

CONFTEST = """
from torch.autograd import gradcheck as conftest_gradcheck   # bound while conftest is imported
"""

SUITE = """
import torch
from torch.autograd import gradcheck
from torch.autograd.gradcheck import GradcheckError
import conftest


class Doubled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, g):
        return 2 * g


class Tripled(Doubled):
    @staticmethod
    def backward(ctx, g):
        return 3 * g


def x():
    return torch.randn(3, dtype=torch.float64, requires_grad=True)


def test_correct():
    assert gradcheck(Doubled.apply, (x(),))
    assert torch.autograd.gradgradcheck(lambda t: Doubled.apply(t) ** 2, (x(),))


def test_broken():
    gradcheck(Tripled.apply, (x(),))


def test_broken_caught():
    try:
        conftest.conftest_gradcheck(Tripled.apply, (x(),), fast_mode=True)
    except GradcheckError as e:
        assert "Jacobian mismatch" in str(e)
        print("ROUTED", getattr(gradcheck, "agcheck_dropin", None),
              getattr(conftest.conftest_gradcheck, "agcheck_dropin", None))
    else:
        raise AssertionError("not raised")
"""


def test_plugin_routes_the_suite(pytester, tmp_path):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    out = tmp_path / "reports"
    result = run(pytester, "--agcheck-torch", f"--agcheck-report-dir={out}", "-s")
    result.assert_outcomes(passed=2, failed=1)
    text = result.stdout.str()
    assert "Jacobian mismatch for output 0 with respect to input 0" in text
    assert "agcheck report: check 'jacobian' failed" in text
    assert "ROUTED torch torch" in text
    assert "4 torch gradcheck/gradgradcheck calls went through agcheck (2 failed)" in text
    saved = sorted(p.name for p in out.iterdir())
    # saved for the test that fails, not for the one that catches its own failure and passes
    assert saved == ["test_suite.py_test_broken.html"]
    assert "agcheck report saved to" in text
    assert _all_original()


def test_without_the_flag_torch_runs(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    result = run(pytester, "-s")
    result.assert_outcomes(passed=2, failed=1)
    text = result.stdout.str()
    assert "Jacobian mismatch" in text and "agcheck report" not in text and "ROUTED None None" in text
    assert "went through agcheck" not in text


def test_ini_option(pytester):
    pytester.makeini("[pytest]\nagcheck_torch = true\n")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    result = run(pytester, "-s")
    result.assert_outcomes(passed=2, failed=1)
    assert "ROUTED torch" in result.stdout.str()
    assert "went through agcheck" in result.stdout.str()


def test_agcheck_keywords_for_every_routed_call():
    calls = [0]

    class Counted(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            calls[0] += 1
            return 2 * x

        @staticmethod
        def backward(ctx, g):
            return 2 * g

    x = torch.rand(20, dtype=torch.float64, requires_grad=True)
    calls[0] = 0
    _TORCH["gradcheck"](Counted.apply, (x,))
    torch_calls = calls[0]
    with agcheck.patch_torch(engine="reference"):
        calls[0] = 0
        torch.autograd.gradcheck(Counted.apply, (x,))
        assert calls[0] == torch_calls
    with pytest.raises(TypeError, match="engine, memory_budget"):
        agcheck.patch_torch(eps=1e-3)


def test_plugin_engine_option(pytester):
    pytester.makepyfile(test_count="""
import torch

calls = [0]

class Counted(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        calls[0] += 1
        return 2 * x

    @staticmethod
    def backward(ctx, g):
        return 2 * g


def test_count():
    x = torch.rand(20, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(Counted.apply, (x,))
    print("CALLS", calls[0])
""")
    result = run(pytester, "--agcheck-torch", "--agcheck-engine=reference", "-s")
    result.assert_outcomes(passed=1)
    x = torch.rand(20, dtype=torch.float64, requires_grad=True)
    calls = [0]

    class Counted(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            calls[0] += 1
            return 2 * x

        @staticmethod
        def backward(ctx, g):
            return 2 * g

    _TORCH["gradcheck"](Counted.apply, (x,))
    assert f"CALLS {calls[0]}" in result.stdout.str()
