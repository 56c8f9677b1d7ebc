"""A small progress display: a rich progress bar when wanted, silence otherwise::

    with Progress(enabled=True) as bar:
        bar.start(total=len(items), description="checking")
        for item in items:
            bar.update(description=f"checking {item}")
            bar.advance()

It writes to ``sys.stderr`` (stdout stays clean for results), is transient, and draws
nothing when the stream is not a terminal, so logs get no control codes. rich is imported
only when a bar starts; without it the object is silent.
"""
from __future__ import annotations

import sys
import threading

__all__ = ["Progress"]


class Progress:
    """A progress bar with ``start(total, description)``, ``advance(n=1)`` and ``close()``: a
    context manager, restartable after closing, safe to advance from several threads.

    ``enabled=False`` makes every method a no-op; ``file`` (default ``sys.stderr``, looked up
    at start) is where to draw, unless a rich ``console`` is given to share with the caller.
    """

    def __init__(self, enabled: bool = True, *, file=None, transient: bool = True, console=None):
        self.enabled = bool(enabled)
        self.file = file
        self.transient = transient
        self.console = console
        self.total: int | None = None
        self.completed = 0
        self.description = ""
        self._bar = None  # the rich.progress.Progress while started
        self._task = None
        self._lock = threading.Lock()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self, total: int | None, description: str = "") -> "Progress":
        """Show a bar of ``total`` steps (``None``: unknown) labelled ``description``; a started
        bar is reset to them."""
        with self._lock:
            self.total = None if total is None else int(total)
            self.completed = 0
            self.description = str(description)
            if not self.enabled:
                return self
            if self._bar is None:
                self._bar = self._make_bar()
                if self._bar is None:
                    return self
                self._bar.start()
                self._task = self._bar.add_task(self.description, total=self.total)
            else:
                self._bar.reset(self._task, total=self.total, description=self.description)
            return self

    def advance(self, n: int = 1) -> None:
        """Mark ``n`` more steps done."""
        with self._lock:
            self.completed += n
            if self._bar is not None:
                self._bar.advance(self._task, n)

    def update(self, *, description: str | None = None, total: int | None = None) -> None:
        """Change the label (e.g. the item in progress) or the total of a started bar."""
        with self._lock:
            if description is not None:
                self.description = str(description)
            if total is not None:
                self.total = int(total)
            if self._bar is not None:
                kwargs = {}
                if description is not None:
                    kwargs["description"] = self.description
                if total is not None:
                    kwargs["total"] = self.total
                self._bar.update(self._task, **kwargs)

    def close(self) -> None:
        """Stop drawing (and, when transient, erase the bar). Idempotent."""
        with self._lock:
            bar, self._bar, self._task = self._bar, None, None
            if bar is not None:
                bar.stop()

    def _make_bar(self):
        try:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress,
                                       TextColumn, TimeElapsedColumn)
        except ImportError:  # rich is a dependency of agcheck, but stay silent without it
            return None
        console = self.console
        if console is None:
            console = Console(file=self.file if self.file is not None else sys.stderr)
        if not (console.is_terminal or console.is_jupyter):
            return None  # a pipe or a file: no bar at all (rich would still write a newline)
        return RichProgress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=self.transient,
        )

    def __repr__(self) -> str:
        state = "started" if self._bar is not None else ("disabled" if not self.enabled else "idle")
        return f"<Progress {state} {self.completed}/{self.total} {self.description!r}>"
