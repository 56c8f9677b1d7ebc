import os

import pytest

# the engine's own errors fail the tests instead of falling back to the reference engine
# (agcheck.checks.jacobian.STRICT_ENGINE); set before any test runs, in every worker
os.environ.setdefault("AGCHECK_STRICT_ENGINE", "1")


def _load_the_public_api():
    """agcheck loads its public names on first use; the tests load them all at once, so
    that pytester's in-process runs (which drop the modules first imported inside them
    from sys.modules afterwards) leave one copy of each class, not two."""
    import agcheck

    for name in agcheck.__all__:
        getattr(agcheck, name)


_load_the_public_api()


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    skip = pytest.mark.skip(reason="needs a CUDA device; none is present")
    for item in items:
        if "cuda" in item.keywords and not has_cuda:
            item.add_marker(skip)


def pytest_configure(config):
    # pytest-xdist runs one worker per core: torch's intra-op threads on top of that
    # oversubscribe the cores, and OpenMP's spinning then makes tiny ops thousands of
    # times slower whenever another process competes for a core.
    import os

    if os.environ.get("PYTEST_XDIST_WORKER"):
        try:
            import torch
        except ImportError:
            return
        torch.set_num_threads(1)
