"""The packages as users install them: the wheel ships what the package reads at run time
(py.typed, the report's templates), the sdist what its tests and docs use, and the
metadata is valid (an environment marker that is not PEP 508 fails every install)."""
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    build_meta = pytest.importorskip("setuptools.build_meta")
    out = tmp_path_factory.mktemp("dist")
    source = tmp_path_factory.mktemp("src") / "agcheck"
    # a copy without the checkout's build leftovers, as a clean clone has it
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv*", "build", "*.egg-info", "site",
                                                                "__pycache__", ".pytest_cache", ".hypothesis"))
    import os

    here = os.getcwd()
    os.chdir(source)
    try:
        sdist = out / build_meta.build_sdist(str(out))
        wheel = out / build_meta.build_wheel(str(out))
    finally:
        os.chdir(here)
    return sdist, wheel


def test_the_wheel_ships_the_type_marker_and_the_report_templates(built):
    _, wheel = built
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("agcheck/py.typed", "agcheck/report/templates/report.html",
                   "agcheck/report/templates/agcheck.css", "agcheck/backends/torch_backend.py",
                   "agcheck/backends/base.py"):
        assert needed in names, f"{needed} missing from the wheel"
    metadata = next(n for n in names if n.endswith("METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "Classifier: Typing :: Typed" in text
    assert "tensorflow>=2.16; (sys_platform == \"darwin\" and platform_machine == \"arm64\")" in text


def test_the_sdist_ships_what_its_tests_and_docs_use(built):
    sdist, _ = built
    names = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n}
    for needed in ("constraints.txt", "CHANGELOG.md", "mkdocs.yml", "docs/index.md", "tests/conftest.py",
                   "bench/README.md"):
        assert needed in names, f"{needed} missing from the sdist"
    assert not any(n.startswith("bench/results/") for n in names)


def test_the_wheel_installed_alone_imports_its_backends_as_agcheck_backends(built, tmp_path):
    """backends/ is the top-level folder of the repository and agcheck.backends in the
    wheel: unpacked on its own, the package imports its backends from beneath it."""
    import subprocess
    import sys

    _, wheel = built
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import agcheck, agcheck.backends.base as base, agcheck.backends.registry as registry\n"
            "from pathlib import Path\n"
            "assert Path(base.__file__).parent == Path(agcheck.__file__).parent / 'backends', base.__file__\n"
            "assert 'torch' in registry.available_backends()\n")
    subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r})\n" + code],
                   check=True, cwd=tmp_path)


def test_this_editable_install_takes_the_backends_from_the_top_level_folder():
    """The checkout the tests run from is an editable install (.ci/run: pip install -e):
    agcheck.backends is the repository's top-level backends/, not a copy."""
    import agcheck.backends.base as base

    assert Path(base.__file__).resolve().parent == ROOT / "backends"
    assert not (ROOT / "agcheck" / "backends").exists()
