"""The documentation: the site builds, its pages and links exist, its examples run.

- every page in mkdocs.yml's nav exists, every page under docs/ is in the nav, and every
  relative link in docs/*.md and README.md points at a file that exists;
- every keyword of ``gradcheck`` and ``gradgradcheck`` has a row in docs/semantics.md;
- the Python blocks of docs/quickstart.md run (in a fresh process) and print the output
  shown under them;
- every other ``python`` block of README.md and docs/*.md runs as written: one fresh
  process per page, its blocks in order in one namespace. A block that cannot run on its
  own (it needs a user's file, a GPU, a pytest session, or is pseudo-code) is marked by the
  line ``<!-- fragment -->`` directly above its fence, which the site does not show. A page
  is skipped only when a framework its blocks import (torch, jax, tensorflow) is missing;
- ``mkdocs build --strict`` succeeds without a warning (skipped without the ``docs`` extra);
- docs/scripts/make_report_image.py still makes its PNG.
"""
import ast
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import agcheck

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MKDOCS_YML = ROOT / "mkdocs.yml"

LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
# Any fence, also one indented inside a list item; group 1 is the line above it.
ANY_FENCE = re.compile(r"(?:^([^\n]*)\n)?^( *)```(\w*)\n(.*?)^\2```", re.S | re.M)
FRAGMENT = "<!-- fragment -->"
OPTIONAL_FRAMEWORKS = ("torch", "jax", "tensorflow", "mlx", "matplotlib", "jinja2")


def _missing(*modules):
    return [m for m in modules if importlib.util.find_spec(m) is None]


def nav_pages():
    """The .md files named in mkdocs.yml's nav (read without a YAML parser)."""
    text = MKDOCS_YML.read_text()
    nav = text[text.index("\nnav:"):]
    return re.findall(r"^\s*-\s*(?:[^:\n]+:\s*)?(\S+\.md)\s*$", nav, re.M)


def doc_pages():
    return sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")
                  if "scripts" not in p.relative_to(DOCS).parts)


def strip_code(text):
    """Markdown without fenced blocks and inline code (links there are not links)."""
    text = FENCE.sub("", text)
    return re.sub(r"`[^`\n]*`", "", text)


def test_nav_lists_every_page_and_every_page_exists():
    nav = nav_pages()
    assert nav, "no pages found in mkdocs.yml's nav"
    assert nav[0] == "index.md"
    missing = [p for p in nav if not (DOCS / p).is_file()]
    assert not missing, f"pages in mkdocs.yml's nav that do not exist: {missing}"
    assert len(set(nav)) == len(nav), "a page is listed twice in the nav"
    left_out = sorted(set(doc_pages()) - set(nav))
    assert not left_out, f"pages under docs/ missing from mkdocs.yml's nav: {left_out}"


@pytest.mark.parametrize("page", ["README.md"] + [f"docs/{p}" for p in doc_pages()])
def test_relative_links_resolve(page):
    path = ROOT / page
    broken = []
    for target in LINK.findall(strip_code(path.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # external (http:, mailto:) or an anchor on the same page
        file_part = target.split("#", 1)[0]
        resolved = (path.parent / file_part).resolve()
        if not resolved.exists():
            broken.append(target)
        elif page.startswith("docs/") and DOCS not in resolved.parents:
            broken.append(f"{target} (outside docs/: not part of the site)")
    assert not broken, f"{page}: broken relative links: {broken}"


@pytest.mark.parametrize("func", [agcheck.gradcheck, agcheck.gradgradcheck],
                         ids=["gradcheck", "gradgradcheck"])
def test_every_keyword_is_documented_with_its_default(func):
    text = (DOCS / "semantics.md").read_text()
    section = text if func is agcheck.gradcheck else text[text.index("\n## gradgradcheck"):]
    undocumented, wrong = [], []
    for name, param in inspect.signature(func).parameters.items():
        if name in ("fn", "inputs"):
            continue
        label = f"**{name}" if param.kind is param.VAR_KEYWORD else name
        row = re.search(rf"^\| `{re.escape(label)}` \| ([^|]+) \|", section, re.M)
        if row is None:
            undocumented.append(name)
        elif param.default is not param.empty and name != "memory_budget":
            shown = row.group(1).strip()
            try:
                value = ast.literal_eval(shown.strip("`"))
            except (ValueError, SyntaxError):
                value = shown
            if value != param.default or type(value) is not type(param.default):
                wrong.append(f"{name}: page {shown}, signature {param.default!r}")
    assert not wrong, f"defaults in docs/semantics.md that differ from {func.__name__}'s: {wrong}"
    assert not undocumented, f"keywords of {func.__name__} without a row in docs/semantics.md: {undocumented}"


def _numbers_close(expected, actual):
    """Lines equal except for numbers, which may differ in the last digits (rounding)."""
    num = r"[-+]?\d+\.?\d*(?:e[-+]?\d+)?"
    if re.split(num, expected) != re.split(num, actual):
        return False
    for e, a in zip(re.findall(num, expected), re.findall(num, actual)):
        e, a = float(e), float(a)
        if abs(e - a) > 1e-9 + 1e-4 * abs(e):
            return False
    return True


def test_quickstart_examples_run_and_print_what_the_page_shows(tmp_path):
    missing = _missing("torch", "jax", "array_api_compat")
    if missing:
        pytest.skip(f"the quickstart uses {', '.join(missing)}, not installed")
    text = (DOCS / "quickstart.md").read_text()
    blocks = [(m.group(1), m.group(2)) for m in FENCE.finditer(text)]
    examples = []  # (code, expected output or None)
    for i, (lang, body) in enumerate(blocks):
        if lang == "python":
            follows = blocks[i + 1] if i + 1 < len(blocks) else None
            examples.append((body, follows[1] if follows and follows[0] == "text" else None))
    assert len(examples) >= 4, "the quickstart lost its examples"
    marker = "----- agcheck docs example {} -----"
    script = "".join(f"{code}\nprint({marker.format(k)!r})\n" for k, (code, _) in enumerate(examples))
    (tmp_path / "quickstart.py").write_text(script)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.pop("PYTEST_CURRENT_TEST", None)  # a reader runs the page outside pytest: reports name no test
    run = subprocess.run([sys.executable, str(tmp_path / "quickstart.py")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"the quickstart's code failed:\n{run.stderr[-3000:]}"
    outputs = re.split(r"^----- agcheck docs example \d+ -----\n", run.stdout, flags=re.M)
    for k, (_, expected) in enumerate(examples):
        if expected is None:
            continue
        want = [line.rstrip() for line in expected.strip("\n").splitlines()]
        got = [line.rstrip() for line in outputs[k].strip("\n").splitlines()]
        assert len(want) == len(got) and all(map(_numbers_close, want, got)), (
            f"quickstart example {k + 1} printed\n" + "\n".join(got) + "\nbut the page shows\n" + "\n".join(want))


def python_blocks(page):
    """``(line, code, is_fragment)`` for every ``python`` block of a page, in order."""
    text = (ROOT / page).read_text()
    blocks = []
    for m in ANY_FENCE.finditer(text):
        above, indent, lang, body = m.groups()
        if lang != "python":
            continue
        line = text.count("\n", 0, m.start(2)) + 1
        code = textwrap.dedent(body) if indent else body
        blocks.append((line, code, (above or "").strip() == FRAGMENT))
    return blocks


def _imported_modules(code):
    names = set()
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return names  # the run reports it, with the block's line
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


# The quickstart's blocks run in their own test above, which also compares their output.
EXAMPLE_PAGES = [p for p in ["README.md"] + [f"docs/{p}" for p in doc_pages()]
                 if p != "docs/quickstart.md" and any(not frag for _, _, frag in python_blocks(p))]

RUNNER = """
import json, sys, traceback
namespace = {"__name__": "__main__"}
for label, code in json.load(open(sys.argv[1])):
    try:
        exec(compile(code, label, "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"the block at {label} failed", file=sys.stderr)
        sys.exit(1)
"""


def test_fragment_markers_stand_above_python_blocks():
    """The pages still have examples that run, and the fragment marker sits only directly
    above a python fence (anywhere else it would mark nothing)."""
    run = sum(1 for p in EXAMPLE_PAGES for _, _, frag in python_blocks(p) if not frag)
    assert run >= 30, f"only {run} python blocks of the docs run"
    for page in ["README.md"] + [f"docs/{p}" for p in doc_pages()]:
        text = (ROOT / page).read_text()
        for m in re.finditer(rf"^\s*{re.escape(FRAGMENT)}\s*\n\s*(\S*)", text, re.M):
            assert m.group(1) == "```python", (
                f"{page}: {FRAGMENT} must stand directly above a ```python fence")


@pytest.mark.parametrize("page", EXAMPLE_PAGES)
def test_docs_python_blocks_run(page, tmp_path):
    blocks = [(f"{page}:{line}", code) for line, code, frag in python_blocks(page) if not frag]
    imported = set().union(*(_imported_modules(code) for _, code in blocks))
    missing = _missing(*sorted(imported & set(OPTIONAL_FRAMEWORKS)))
    if missing:
        pytest.skip(f"{page}'s examples import {', '.join(missing)}, not installed")
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    (tmp_path / "run_blocks.py").write_text(RUNNER)
    env = dict(os.environ, PYTHONWARNINGS="ignore", MPLBACKEND="Agg",
               TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    run = subprocess.run([sys.executable, "run_blocks.py", "blocks.json"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{page}: a python block failed:\n{run.stderr[-4000:]}"


def test_mkdocs_build_strict(tmp_path):
    missing = _missing("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
    if missing:
        pytest.skip("the docs extra is not installed (pip install -c constraints.txt -e '.[docs]'): "
                    f"missing {', '.join(missing)}")
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(MKDOCS_YML),
         "--site-dir", str(site)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    log = run.stdout + run.stderr
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{log[-5000:]}"
    assert "WARNING" not in log, log
    api = (site / "api" / "index.html").read_text()
    for name in ("gradcheck", "gradgradcheck", "crosscheck", "CrosscheckResult", "GradcheckError",
                 "FailureReport", "GradcheckOptions", "register_backend"):
        assert f"{name}</" in api or f"{name}<" in api, f"{name} missing from the API reference"
    assert (site / "img" / "report-example.png").is_file()


def test_report_image_script(tmp_path):
    missing = _missing("torch", "matplotlib")
    if missing:
        pytest.skip(f"the script needs {', '.join(missing)}, not installed")
    out = tmp_path / "report.png"
    run = subprocess.run([sys.executable, str(DOCS / "scripts" / "make_report_image.py"), str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "[transposed]" in run.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
