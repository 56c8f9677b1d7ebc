"""The pytest plugin's options as a run configured them (command line or ini), checked at
start-up: a bad one is a ``pytest.UsageError`` before any test runs."""
from __future__ import annotations

import difflib
import os

import pytest

__all__ = ["configured_backends", "configured_report_dir", "validate_options", "setting", "option_value",
           "installed", "JAX_ACCOUNTS"]

#: the accounts ``--agcheck-jax-account`` takes
JAX_ACCOUNTS = ("direction", "full")


def split_names(values) -> list:
    names = []
    for v in values or ():
        for name in str(v).split(","):
            name = name.strip()
            if name and name not in names:
                names.append(name)
    return names


def option_value(config, name: str):
    """``config.getoption(name)``, also while the initial conftests load (when only the
    known arguments are parsed)."""
    value = config.getoption(name, None)
    if value is None:
        value = getattr(getattr(config, "known_args_namespace", None), name, None)
    return value


def configured_backends(config) -> list:
    """The backends named by ``--agcheck-backend`` (or the ini setting), in order."""
    names = split_names(option_value(config, "agcheck_backend"))
    if not names:
        names = split_names([config.getini("agcheck_backend")])
    return names


def configured_report_dir(config) -> str | None:
    """The absolute report folder (``--agcheck-report-dir`` or the ini setting), or ``None``."""
    d = option_value(config, "agcheck_report_dir") or config.getini("agcheck_report_dir") or None
    if d and not os.path.isabs(d):
        d = os.path.join(str(config.invocation_params.dir), d)
    return d


def setting(config, name: str) -> str:
    """``--agcheck-NAME`` or the ini setting ``agcheck_NAME`` (``""`` when neither is set)."""
    value = option_value(config, f"agcheck_{name}")
    if value:
        return str(value)
    try:
        return str(config.getini(f"agcheck_{name}") or "").strip()
    except (ValueError, KeyError):
        return ""


def unknown_choice(kind: str, given: str, known) -> str:
    known = list(known)
    close = difflib.get_close_matches(given, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {kind} {given!r} (choose from {', '.join(known)}){hint}"


def validate_options(config) -> None:
    """A ``pytest.UsageError`` naming the first bad agcheck option or ini setting."""
    names = configured_backends(config)
    if names:
        from agcheck.backends.registry import _ALIASES, available_backends, canonical_name

        known = available_backends()
        for name in names:
            if canonical_name(name) not in known:
                raise pytest.UsageError("--agcheck-backend / agcheck_backend: "
                                        + unknown_choice("backend", name, list(known) + list(_ALIASES)))
    engine = setting(config, "engine")
    if engine:
        from agcheck.options import GradcheckOptions

        try:
            GradcheckOptions(engine=engine)
        except ValueError as error:
            raise pytest.UsageError(f"--agcheck-engine / agcheck_engine: {error}") from None
    account = setting(config, "jax_account")
    if account and account not in JAX_ACCOUNTS:
        raise pytest.UsageError("--agcheck-jax-account / agcheck_jax_account: "
                                + unknown_choice("account", account, JAX_ACCOUNTS))


def installed(name: str) -> bool | None:
    """Whether the backend's framework is installed (``None``: unknown backend)."""
    from agcheck.backends.registry import available_backends, canonical_name

    return available_backends().get(canonical_name(name))
