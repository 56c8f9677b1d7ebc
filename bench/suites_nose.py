"""pytest plugin for suites written for nose-style module set-up: calls a test module's own
``setup()`` once before its first test, as pytest did until version 8 removed nose support
(pytest still calls ``setup_module()`` itself). Loaded by bench/real_suites.py for the
suites whose spec lists it under ``plugins``."""
import pytest


@pytest.fixture(autouse=True, scope="module")
def _nose_module_setup(request):
    setup = getattr(request.module, "setup", None)
    if callable(setup) and getattr(setup, "__module__", None) == request.module.__name__:
        setup()
    yield
