"""TensorFlow is imported after triton where triton is installed: TF >= 2.20 loads its
LLVM globally and a later ``import triton`` (torch's CUDA builds import it lazily) crashes
the interpreter (agcheck.backends.tensorflow_loading)."""
import importlib.util
import subprocess
import sys
import textwrap

import pytest

# find_spec, not an import: TensorFlow loaded into this process here would make a later
# triton import (torch's) crash it
pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs tensorflow")

#: a stand-in for triton that records whether TensorFlow was already loaded when it was
STUB = "import sys\nTF_WAS_LOADED = 'tensorflow' in sys.modules\n"


def _run(code: str, path: str | None = None) -> subprocess.CompletedProcess:
    env_path = [path] if path else []
    prelude = f"import sys; sys.path[:0] = {env_path!r}\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture
def stub_triton(tmp_path):
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "__init__.py").write_text(STUB)
    return str(tmp_path)


def test_the_tensorflow_backend_loads_triton_before_tensorflow(stub_triton):
    proc = _run("""
        import agcheck
        agcheck.get_backend("tensorflow")
        import triton
        print(triton.TF_WAS_LOADED, 'tensorflow' in sys.modules)
    """, stub_triton)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True"]


def test_a_tensorflow_the_caller_loaded_first_is_left_as_it_is(stub_triton):
    # triton imported after TF would crash (the real one): not imported at all then
    proc = _run("""
        import tensorflow
        from agcheck.backends.tensorflow_loading import import_tensorflow
        assert import_tensorflow() is tensorflow
        print('triton' in sys.modules)
    """, stub_triton)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False"]


def test_without_triton_nothing_else_is_imported(tmp_path):
    proc = _run("""
        import importlib.util
        if importlib.util.find_spec('triton') is not None:  # hide an installed one
            sys.modules['triton'] = None
        from agcheck.backends.tensorflow_loading import import_tensorflow
        import_tensorflow()
        print(sys.modules.get('triton'))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["None"]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="triton is not installed (the CPU build of torch has none): the crash cannot occur")
def test_triton_after_the_tensorflow_backend_does_not_crash():
    proc = _run("""
        import agcheck
        agcheck.get_backend("tensorflow")
        import triton
        print('ok')
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (proc.returncode, proc.stderr[-2000:])
