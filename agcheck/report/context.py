"""A failure report's context: what the check ran on, and the code that runs it again."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from agcheck.report.values import index_text, jsonable

__all__ = ["CheckContext"]


@dataclass
class CheckContext:
    """What a failed check was run on, and the code that runs it again.

    Attributes
    ----------
    call : str
        ``"gradcheck"`` or ``"gradgradcheck"``.
    function, module, source : str or None
        ``fn``'s qualified name (``"MatVec.apply"``, ``"test_x.<locals>.f"``), its module and
        ``"file:line"`` of its definition, where Python knows them.
    test : str or None
        The pytest test that ran the check (from ``PYTEST_CURRENT_TEST``).
    versions : dict
        ``{"agcheck": .., "<framework>": .., "numpy": .., "python": ..}``.
    random : str
        How the check's random draws are seeded (fast mode's vectors: the same on every run).
    seeds : dict
        The seeds behind ``random``.
    inputs : list of dict
        Per argument: ``position``, ``kind`` (``"array"`` or ``"value"``) and, for arrays,
        ``shape``, ``dtype``, ``checked``, ``layout``, ``device``; ``text`` for other values.
    setup : list of str
        Code lines before the call (imports, where ``fn`` comes from).
    function_code, inputs_code : str or None
        Python expressions for ``fn`` and its inputs (random values of the same shapes and
        dtypes: the failing values are not saved); ``None`` where unknown.
    keywords_code : dict
        The call's keywords that differ from their defaults, as Python expressions.
    """

    call: str = "gradcheck"
    function: str | None = None
    module: str | None = None
    source: str | None = None
    test: str | None = None
    versions: dict = field(default_factory=dict)
    random: str = ""
    seeds: dict = field(default_factory=dict)
    inputs: list = field(default_factory=list)
    setup: list = field(default_factory=list)
    function_code: str | None = None
    inputs_code: str | None = None
    keywords_code: dict = field(default_factory=dict)

    def call_code(self, inputs: str | None = None) -> str | None:
        """The check's call as one expression (``inputs`` inlined unless named)."""
        if self.function_code is None or self.inputs_code is None:
            return None
        keywords = "".join(f", {k}={v}" for k, v in self.keywords_code.items())
        return f"agcheck.{self.call}({self.function_code}, {inputs or self.inputs_code}{keywords})"

    @property
    def reproduce(self) -> str | None:
        """A script that runs the check again on inputs of the same shapes and dtypes."""
        call = self.call_code("inputs")
        if call is None:
            return None
        return "\n".join([*self.setup, f"inputs = {self.inputs_code}", call]) + "\n"

    def input_text(self, width: int = 6) -> str:
        shown = []
        for d in self.inputs[:width]:
            if d.get("kind") == "array":
                extra = "".join(f", {d[k]}" for k in ("layout", "device") if d.get(k) not in (None, "dense", "cpu"))
                shown.append(f"{d['position']}: {d['dtype']} {index_text(d['shape'])}"
                             f"{' checked' if d.get('checked') else ''}{extra}")
            else:
                shown.append(f"{d['position']}: {d.get('text', d.get('type', '?'))}")
        more = f"; ... ({len(self.inputs) - width} more)" if len(self.inputs) > width else ""
        return "; ".join(shown) + more

    def function_text(self) -> str:
        """``fn``'s name, with its module and source where known."""
        at = ", ".join(x for x in (self.module and f"module {self.module}", self.source) if x)
        return (self.function or "not recorded") + (f" ({at})" if at else "")

    def summary_lines(self, width: int = 240) -> list:
        where = ["function " + self.function_text()]
        if self.test:
            where.append(f"test {self.test}")
        lines = ["where: " + ", ".join(where)]
        if self.inputs:
            lines.append("inputs: " + self.input_text())
        if self.versions:
            lines.append("versions: " + ", ".join(f"{k} {v}" for k, v in self.versions.items()))
        if self.random:
            lines.append(f"random: {self.random}")
        call = self.call_code()
        if call is not None:
            lines.append("reproduce: " + (call if len(call) <= width else
                                          "print(error.report.context.reproduce) (the call is longer than a line)"))
        return lines

    def to_dict(self) -> dict:
        return {"call": self.call, "function": self.function, "module": self.module, "source": self.source,
                "test": self.test, "versions": dict(self.versions), "random": self.random,
                "seeds": jsonable(self.seeds), "inputs": jsonable(self.inputs), "setup": list(self.setup),
                "function_code": self.function_code, "inputs_code": self.inputs_code,
                "keywords_code": dict(self.keywords_code), "reproduce": self.reproduce}

    @classmethod
    def from_dict(cls, d: dict) -> "CheckContext":
        names = [f.name for f in fields(cls)]
        return cls(**{k: v for k, v in d.items() if k in names})
