"""The texts of a failed check's messages: torch's key phrases (which tests match) in
agcheck's own words around them."""
from __future__ import annotations

__all__ = ["NONDET_HINT", "FAST_MODE_NOTE", "FAST_FAIL_SLOW_OK", "BATCHED_HINT", "BATCHED_FWD_HINT",
           "UNDEFINED_GRAD_HINT", "REPORT_POINTER", "jacobian_mismatch_message", "complex_part",
           "not_reentrant_message", "batched_mismatch_message", "message_with_summary"]

NONDET_HINT = (
    "\n\nIf the backward relies on non-deterministic kernels (atomic adds on GPUs, for "
    "example), this can be expected: pass nondet_tol=<tolerance> to accept run-to-run "
    "differences up to that size."
)

#: torch's note, word for word (suites match it), then the slow-mode Jacobians follow
FAST_MODE_NOTE = (
    "\nThe above quantities relating the numerical and analytical jacobians are computed \n"
    "in fast mode. See: https://github.com/pytorch/pytorch/issues/53876 for more background \n"
    "about fast mode. Below, we recompute numerical and analytical jacobians in slow mode:\n\n"
)

FAST_FAIL_SLOW_OK = (
    "Fast gradcheck failed but element-wise differences are small. This means that the\n"
    "test might've passed in slow_mode!\n\n"
    "To check this function element by element, pass fast_mode=False (for OpInfo-based "
    "tests: gradcheck_fast_mode=False in the OpInfo; for module tests: in the module_test entry)."
)

BATCHED_HINT = (
    "gradcheck or gradgradcheck failed while testing batched gradient computation. "
    "Batched gradients are computed by vmapping the backward computation; an operation "
    "in the backward that vmap cannot batch makes this check fail. Pass "
    "check_batched_grad=False to skip it."
)

BATCHED_FWD_HINT = (
    "gradcheck failed while testing batched gradient computation with forward-mode AD. "
    "Batched forward gradients are computed by vmapping the forward-mode computation; "
    "pass check_batched_forward_grad=False to skip this check."
)

UNDEFINED_GRAD_HINT = (
    'See "Notes about undefined output gradients" in torch\'s tools/autograd/derivatives.yaml, '
    "or pass check_undefined_grad=False."
)


def jacobian_mismatch_message(
    analytical,
    numerical,
    output_idx: int,
    input_idx: int,
    complex_indices,
    test_imag: bool = False,
    forward: bool = False,
) -> str:
    """The message for a numerical/analytical Jacobian disagreement."""
    prefix = ""
    part = complex_part(output_idx, input_idx, complex_indices, test_imag, forward)
    if part is not None:
        prefix = f"While considering the {part} part of complex {'inputs' if forward else 'outputs'} only, "
    how = "computed with forward mode " if forward else ""
    return (
        f"{prefix}Jacobian {how}mismatch for output {output_idx:d} with respect to input "
        f"{input_idx:d},\nnumerical:{numerical}\nanalytical:{analytical}\n"
    )


def complex_part(output_idx, input_idx, complex_indices, test_imag, forward) -> str | None:
    """``"real"``/``"imaginary"`` when the failing pair is one half of a complex split."""
    if not complex_indices or (input_idx if forward else output_idx) not in complex_indices:
        return None
    return "imaginary" if test_imag else "real"


def not_reentrant_message(nondet_tol: float, observed: float | None = None) -> str:
    """torch's sentence byte for byte (without a space after "gradient.", as torch writes
    it), then agcheck's facts on lines of their own."""
    seen = "" if observed is None else f"\nThe largest run-to-run difference seen was {observed:.3e}."
    return (
        "Backward is not reentrant, i.e., running backward with same input and "
        "grad_output multiple times gives different values, although analytical "
        f"gradient matches numerical gradient.The tolerance for nondeterminism was {nondet_tol}."
        + seen + NONDET_HINT
    )


def batched_mismatch_message(output_idx, input_idx, got, expected, forward=False) -> str:
    """torch's "For output i and input j:", what failed on the same first line, then torch's
    hint and the two results."""
    hint = BATCHED_FWD_HINT if forward else BATCHED_HINT
    mode = "forward-mode " if forward else ""
    return (
        f"For output {output_idx} and input {input_idx}: the batched {mode}gradient differs from the "
        f"gradients computed one at a time.\n\n{hint}\n\nGot:\n{got}\n\nExpected:\n{expected}"
    )


#: the last line of agcheck's summary in an exception's message (not in saved reports)
REPORT_POINTER = "details: error.report (summary(), to_dict(), save('report.html'))"

_OPENING, _CLOSING = "([{", ")]}"


def message_with_summary(message: str, summary: str) -> str:
    """torch's first line, agcheck's ``summary`` and :data:`REPORT_POINTER`, a blank line, then
    the rest of torch's message. The first line stays first for pytest's one-line summary
    and tests matching it; where it opens a multi-line tensor, the summary goes last."""
    summary = summary.rstrip("\n") + "\n" + REPORT_POINTER
    message = message.rstrip("\n")
    first, newline, rest = message.partition("\n")
    balanced = all(first.count(o) == first.count(c) for o, c in zip(_OPENING, _CLOSING))
    if not newline:
        return message + "\n" + summary
    if not balanced or rest[:1].isspace() and rest[:1] != "\n":
        return message + "\n\n" + summary
    return first + "\n" + summary + "\n\n" + rest.lstrip("\n")
