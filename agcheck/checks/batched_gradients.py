"""Batched (vmapped) gradients must equal the gradients computed one at a time."""
from __future__ import annotations

from agcheck.errors import GradcheckError
from agcheck.report.messages import BATCHED_FWD_HINT, BATCHED_HINT, batched_mismatch_message

BATCHED_SEED = 20211
_BATCH = 2


def _zeros_for_undefined(be, grads, inputs):
    return [be.xp(x).zeros_like(x) if g is None else g for g, x in zip(grads, inputs)]


def check_backward(run, piece) -> None:
    """vmap of the VJP over two random cotangents vs. two separate VJPs, output by output."""
    for output_index, output_position in enumerate(piece.diff):
        _check_output(run.be, piece.trace, output_position, output_index, piece.inputs)


def _check_output(be, trace, output_position, output_index, inputs) -> None:
    out = trace.outputs[output_position]
    gen = be.generator(out, BATCHED_SEED + output_index)
    cotangents = [be.normal_like(out, gen) for _ in range(_BATCH)]
    one_by_one = [_zeros_for_undefined(be, trace.vjp([output_position], [c]), inputs) for c in cotangents]
    xp = be.xp(out)
    expected = [xp.stack(list(per_input), axis=0) for per_input in zip(*one_by_one)]
    try:
        batched = trace.vjp_batched(output_position, xp.stack(cotangents, axis=0))
    except RuntimeError as ex:
        raise GradcheckError(f"While computing batched gradients, got: {ex}\n\n{BATCHED_HINT}",
                             check="batched_grad") from ex
    batched = [be.zeros((_BATCH, *x.shape), like=x) if g is None else g for g, x in zip(batched, inputs)]
    for input_index, (got, exp) in enumerate(zip(batched, expected)):
        if not be.allclose(got, exp, rtol=1e-5, atol=1e-8):
            raise GradcheckError(batched_mismatch_message(output_index, input_index, got, exp),
                                 check="batched_grad", details={"output": output_index, "input": input_index,
                                                                "max_difference": float(be.max_abs_difference(got, exp))})


def check_forward(run, piece) -> None:
    """vmap of the JVP over two random tangents vs. two separate JVPs, input by input."""
    be, fn, args, checked = run.be, piece.fn, piece.args, piece.checked
    for pos in checked:
        x = args[pos]
        gen = be.generator(x, BATCHED_SEED + pos)
        tangents = [be.normal_like(x, gen) for _ in range(_BATCH)]
        one_by_one = [be.jvp_wrt(fn, args, pos, t) for t in tangents]
        xp = be.xp(x)
        expected = [xp.stack(list(per_output), axis=0) for per_output in zip(*one_by_one)]
        try:
            batched = be.jvp_batched(fn, args, pos, xp.stack(tangents, axis=0))
        except RuntimeError as ex:
            raise GradcheckError(f"While computing batched gradients, got: {ex}\n\n{BATCHED_FWD_HINT}",
                                 check="batched_forward_grad") from ex
        for output_index, (got, exp) in enumerate(zip(batched, expected)):
            if not be.allclose(got, exp, rtol=1e-5, atol=1e-8):
                raise GradcheckError(
                    batched_mismatch_message(output_index, checked.index(pos), got, exp, forward=True),
                    check="batched_forward_grad",
                    details={"output": output_index, "input": checked.index(pos),
                             "max_difference": float(be.max_abs_difference(got, exp))},
                )
