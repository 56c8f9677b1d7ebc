"""A Griffe extension for the API reference (loaded by mkdocs.yml, not a page of the site).

agcheck's docstrings are NumPy style with two habits that Griffe renders badly:

- Sphinx cross-reference roles (``:class:`GradcheckError```, ``:func:`agcheck.gradcheck```)
  come out literally. They are rewritten to plain code spans.
- Parameters documented together (``atol, rtol : float``) all receive the *first* name's
  default in the parameter table (so ``rtol`` would show ``1e-05``), and, when the
  docstring gives no type, the first name's annotation. Each parameter's default (and
  such a borrowed annotation) is taken from the signature by its own name instead.

And the repository keeps ``agcheck.backends`` in its top-level ``backends/`` folder (the
package maps it there when installed): it is loaded as the package's member here.
"""
import re
from pathlib import Path

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|exc|data|obj):`~?\.?([^`]+)`")


class AgcheckDocstrings(griffe.Extension):
    def on_package(self, *, pkg, loader, **kwargs):
        if pkg.name != "agcheck" or "backends" in pkg.members:
            return
        folder = Path(pkg.filepath).parent.parent / "backends"
        backends = loader._visit_module("backends", folder / "__init__.py", pkg)  # noqa: SLF001 - no public hook
        pkg.set_member("backends", backends)
        loader._load_submodules(backends)  # noqa: SLF001

    def on_object(self, *, obj, loader, **kwargs):
        doc = obj.docstring
        if doc is None:
            return
        doc.value = _ROLE.sub(lambda m: f"``{m.group(1)}``", doc.value)
        if not obj.is_function:
            return
        signature = {p.name: p for p in obj.parameters}
        for section in doc.parsed:  # cached: the renderer reuses this parse
            if section.kind is not griffe.DocstringSectionKind.parameters:
                continue
            for param in section.value:
                name = param.name.lstrip("*")
                if name not in signature:
                    continue
                param.value = signature[name].default
                borrowed = any(param.annotation is p.annotation for n, p in signature.items()
                               if n != name and p.annotation is not None)
                if borrowed:
                    param.annotation = signature[name].annotation
