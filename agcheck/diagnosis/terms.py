"""Hypotheses about the mismatch ``D = analytical - numerical`` itself: where no transformation
of the numerical block gives the analytical one, the backward may be right but for one term
it leaves out (or adds), of a simple form:

* ``constant_term``: ``D`` is ``c`` times the identity, or ``c`` on every entry (a ``c * x``
  term's derivative, a skip connection); tried before the local hypotheses, since a wrong
  diagonal of a small block is no "few entries";
* ``input_statistics``: per wrong output element, ``D`` is affine in the input's values (the
  derivative through detached statistics, a mean and a scale, is missing);
* ``low_rank``: ``D`` is one or two outer products (softmax's ``-s s^T``, a norm or sum).

Each takes the block's facts and its wrong entries, and fits as closely as
:meth:`~agcheck.diagnosis.facts.BlockFacts.fit` asks of the whole-block transformations.
"""
from __future__ import annotations

import numpy as np

from agcheck.report.values import fmt, index_text, unravel

from .facts import BlockFacts, coefficient_text

__all__ = ["MIN_DIAGONAL", "MIN_SUPPORT", "RANK_LINES", "TERM_ENTRIES", "TERMS", "constant_term",
           "input_statistics", "low_rank"]

#: a constant times the identity is reported on square blocks of at least this many rows
MIN_DIAGONAL = 3
#: one constant on every entry is reported on blocks of at least this many entries
MIN_CONSTANT_ENTRIES = 4

#: input elements that must reach each wrong output element for an affine fit in their
#: values (two coefficients) to be evidence
MIN_SUPPORT = 6
#: a rank-k mismatch is reported only on blocks with at least ``RANK_LINES * k`` rows and columns
RANK_LINES = 4
#: the largest rank reported
MAX_RANK = 2
#: blocks with more entries than this are not examined (each hypothesis holds a few copies)
TERM_ENTRIES = 4_000_000


def _real(facts: BlockFacts) -> bool:
    return not (np.iscomplexobj(facts.N) or np.iscomplexobj(facts.A))


def constant_term(facts: BlockFacts, wrong):
    """``constant_term``: ``D = c * I`` on a square block of ``MIN_DIAGONAL`` rows or more, or
    ``D = c`` on a block of ``MIN_CONSTANT_ENTRIES`` entries or more (``c`` the mean difference)."""
    if not wrong.count or facts.N.size > TERM_ENTRIES:
        return None
    N, A = facts.N, facts.A
    rows, cols = N.shape
    forms = []
    if rows == cols >= MIN_DIAGONAL:
        forms.append(("identity", np.diagonal(A).mean() - np.diagonal(N).mean()))
    if N.size >= MIN_CONSTANT_ENTRIES:
        forms.append(("every entry", A.mean() - N.mean()))
    for form, c in forms:
        c = complex(c) if np.iscomplexobj(c) and complex(c).imag != 0 else float(np.real(c))
        if not abs(c) > facts.floor:
            continue
        if form == "identity":
            X = N.astype(np.result_type(N, c), copy=True)
            X[np.diag_indices(rows)] += c
        else:
            X = N + c
        ok, rx = facts.fit(X)
        if ok:
            break
    else:
        return None
    fit = f"residual {fmt(rx)} vs mismatch {fmt(facts.r0)}"
    missing = not isinstance(c, complex) and c < 0
    term = coefficient_text(-c if missing else c)
    if form == "identity":
        cause = (f"leaves out a term {term} * grad_output, the derivative of a {term} * x term of the forward (a skip "
                 "connection x + g(x), the 2 * x of x**2 + 2 * x, a weight decay term)" if missing else
                 f"adds a term {term} * grad_output that no term of the forward accounts for (a skip connection's "
                 "gradient added twice, or where the forward has none)")
        message = (f"analytical - numerical = {coefficient_text(c)} x the identity: every derivative of an output "
                   f"element with respect to the input element of the same index is off by {coefficient_text(c)}, "
                   f"every other entry matches ({fit}): the backward likely {cause}")
    else:
        added = (f"adds {coefficient_text(c)} to every element of the gradient (a constant, or "
                 f"{coefficient_text(c)} * grad_output.sum(), added after the product)")
        left_out = (f"leaves out the derivative of a term {coefficient_text(-c)} * x.sum() that the forward adds to "
                    "every output element")
        message = (f"analytical - numerical = {coefficient_text(c)} on every entry ({fit}): the backward likely "
                   + (f"{left_out}, or {added}" if missing else f"{added}, or {left_out}"))
    return facts.diagnosis("constant_term", message,
                           {"max_abs_diff": facts.r0, "residual": rx, "form": form, "coefficient": c})


def _affine_in(M, reach, xc, count):
    """Per column of ``M``, its least-squares line in ``xc`` over the rows ``reach`` marks:
    ``(mean, slope, mean of xc, line)``, the line as a block (zero off ``reach``)."""
    scale = np.maximum(count, 1)
    mean_x = (xc @ reach) / scale
    spread = (xc ** 2) @ reach / scale - mean_x ** 2
    M = M * reach
    mean_m = M.sum(axis=0) / scale
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = np.where(spread > 0, ((xc @ M) / scale - mean_x * mean_m) / np.where(spread > 0, spread, 1), 0.0)
    return mean_m, slope, mean_x, reach * (mean_m - slope * mean_x + slope * xc[:, None])


def input_statistics(facts: BlockFacts, wrong):
    """``input_statistics``: per output element, ``D = alpha + beta * x`` over the (at least
    ``MIN_SUPPORT``) input elements reaching it, where the numerical block is no such function
    itself (a quadratic's Jacobian is affine in ``x``, and so is any error in it)."""
    x = facts.inputs
    if x is None or not _real(facts) or np.iscomplexobj(x) or x.shape != (facts.N.shape[0],) \
            or facts.N.size > TERM_ENTRIES:
        return None
    columns = wrong.cols
    reach = ((np.abs(facts.N) > facts.floor) | (np.abs(facts.A) > facts.floor)).astype(facts.N.dtype)
    count = reach.sum(axis=0)
    xc = x - x.mean()  # centred: the normal equations stay well conditioned
    if not len(columns) or (count[columns] < MIN_SUPPORT).any() or (np.ptp(xc) == 0):
        return None
    mean_d, beta, mean_x, line = _affine_in(facts.A - facts.N, reach, xc, count)
    ok, rx = facts.fit(facts.N + line)
    if not ok:
        return None
    constant, rc = facts.fit(facts.N + reach * mean_d)
    rx = rc if constant else rx
    *_, numerical_line = _affine_in(facts.N, reach, xc, count)
    if float(np.abs(facts.N * reach - numerical_line).max()) <= max(0.01 * facts.r0, facts.floor):
        return None
    beta = np.zeros_like(beta) if constant else beta
    alpha = mean_d if constant else mean_d - beta * (mean_x + x.mean())  # the coefficients of x itself
    reaching = sorted({int(count[c]) for c in columns})
    size = str(reaching[0]) if len(reaching) == 1 else f"{reaching[0]} to {reaching[-1]}"
    if constant:
        what = ("a constant per output element (the same for every input element that reaches it): the backward "
                "likely misses the derivative through a mean or sum of the input that the forward uses (a "
                "detached mean, x - x.mean().detach()), or adds a constant to the gradient")
    else:
        what = ("an affine function of the input's values, alpha + beta * x, per output element: the backward "
                "likely misses the derivative through statistics of the input that the forward treats as "
                "constants, a mean (alpha) and a scale such as a standard deviation or norm (beta * x), as in a "
                "normalisation written with detached statistics, (x - x.mean().detach()) / x.std().detach()")
    fits = [{"output": int(c), "alpha": float(alpha[c]), "beta": float(beta[c]), "inputs": int(count[c])}
            for c in columns[:16]]
    lines = [f"output{index_text(unravel(f['output'], facts.block.output_shape))}: alpha {fmt(f['alpha'])}, "
             f"beta {fmt(f['beta'])} over {f['inputs']} input elements" for f in fits[:3]]
    return facts.diagnosis(
        "input_statistics",
        f"for the {len(columns)} wrong output element(s), analytical - numerical over the {size} input elements "
        f"that reach each is {what} (residual {fmt(rx)} vs mismatch {fmt(facts.r0)})",
        {"max_abs_diff": facts.r0, "residual": rx, "constant": bool(constant), "fits": fits},
        lines)


def low_rank(facts: BlockFacts, wrong):
    """``low_rank``: ``D`` is a sum of at most ``MAX_RANK`` outer products (``wrong`` unused)."""
    lines = min(facts.N.shape)
    if not _real(facts) or lines < RANK_LINES or facts.N.size > TERM_ENTRIES:
        return None
    D = facts.A - facts.N
    try:
        u, s, vt = _leading(D)
    except np.linalg.LinAlgError:
        return None
    for k in range(1, MAX_RANK + 1):
        if lines < RANK_LINES * k:
            return None
        term = (u[:, :k] * s[:k]) @ vt[:k]
        ok, rx = facts.fit(facts.N + term)
        if ok:
            break
    else:
        return None
    # a numerical block of rank k itself makes any error within its spaces rank k: no evidence
    try:
        un, sn, vnt = _leading(facts.N)
    except np.linalg.LinAlgError:
        return None
    if float(np.abs(facts.N - (un[:, :k] * sn[:k]) @ vnt[:k]).max()) <= max(0.01 * facts.r0, facts.floor):
        return None
    shape = f"{D.shape[0]} x {D.shape[1]}"
    product = "an outer product u v^T" if k == 1 else f"a sum of {k} outer products"
    return facts.diagnosis(
        "low_rank",
        f"analytical - numerical is a rank-{k} matrix, {product} of an input-side and an output-side vector, on a "
        f"{shape} block (residual {fmt(rx)} vs mismatch {fmt(facts.r0)}): the backward likely leaves out (or adds) "
        "a term that couples every input element with every output element through a few shared quantities: "
        "softmax's -s s^T, the mean or variance terms of a normalisation, a norm or sum the forward computes",
        {"max_abs_diff": facts.r0, "residual": rx, "rank": k,
         "singular_values": [float(v) for v in s[:MAX_RANK + 1]]})


def _leading(M):
    """A few leading singular triplets ``u, s, vt`` of ``M``, from its range sampled by
    ``MAX_RANK + 4`` Gaussian vectors (exact up to that rank) of a private generator, which
    leaves the caller's random state alone: a few products instead of a full SVD."""
    sample = np.random.default_rng(0).standard_normal((M.shape[1], MAX_RANK + 4))
    q, _ = np.linalg.qr(M @ sample)
    ub, s, vt = np.linalg.svd(q.T @ M, full_matrices=False)
    return q @ ub, s, vt


#: tried in order after the whole-block and local hypotheses
TERMS = (input_statistics, low_rank)
