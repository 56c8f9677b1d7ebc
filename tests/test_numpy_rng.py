"""NumPy's global random state is left as it was by a check, read and restored by address."""
import numpy as np
import pytest

from agcheck.core import numpy_rng
from agcheck.core.numpy_rng import numpy_rng_preserved


def _state():
    name, key, pos, has_gauss, gauss = np.random.get_state()
    return name, key.copy(), pos, has_gauss, gauss if has_gauss else None


def _same(a, b):
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and a[2:] == b[2:]


def test_the_gaussian_cache_is_located_on_this_numpy():
    assert numpy_rng._gauss_cache_offset() is not None


@pytest.mark.parametrize("draw", [
    lambda: np.random.rand(3),
    lambda: np.random.randn(),          # leaves a cached Gaussian behind
    lambda: np.random.randn(2),         # uses pairs: no cache change
    lambda: np.random.randint(0, 10, size=5),
], ids=["uniform", "one_gaussian", "two_gaussians", "integers"])
@pytest.mark.parametrize("cached_before", [False, True])
def test_whatever_fn_draws_the_state_comes_back(draw, cached_before):
    np.random.seed(7)
    if cached_before:
        np.random.randn()  # a cached Gaussian is waiting
    before = _state()
    with numpy_rng_preserved():
        draw()
        assert not _same(_state(), before)  # the draw did change the state
    assert _same(_state(), before)
    expected = np.random.rand(4)
    np.random.seed(7)
    if cached_before:
        np.random.randn()
    assert np.array_equal(np.random.rand(4), expected)


def test_consuming_only_the_cached_gaussian_is_undone():
    # the generator's words do not move: only the cache tells
    np.random.seed(3)
    np.random.randn()
    before = _state()
    assert before[3] == 1
    with numpy_rng_preserved():
        np.random.randn()
        assert np.random.get_state()[3] == 0
    assert _same(_state(), before)


def test_without_a_known_layout_the_public_api_is_used(monkeypatch):
    monkeypatch.setattr(numpy_rng, "_gauss_offset", None)
    np.random.seed(11)
    before = _state()
    with numpy_rng_preserved():
        np.random.randn(5)
    assert _same(_state(), before)


def test_an_error_inside_still_restores():
    np.random.seed(5)
    before = _state()
    with pytest.raises(ZeroDivisionError):
        with numpy_rng_preserved():
            np.random.rand(10)
            1 / 0
    assert _same(_state(), before)
