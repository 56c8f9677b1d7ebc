"""The names of the backend contract: the optional parts (:class:`Capability`), the verb
lists a backend is checked against, and the contract's two errors.

Re-exported by :mod:`agcheck.backends.base`, the contract's documented home.
"""
from __future__ import annotations

__all__ = ["Capability", "REQUIRED_METHODS", "DEFAULTED_METHODS", "CORE_METHODS", "BATCHED_FORMS",
           "CAPABILITY_METHODS", "UnsupportedError", "BackendUnavailableError"]


class Capability:
    """The names of the optional parts of the contract, as a backend lists them in
    :attr:`Backend.capabilities`. The core asks :meth:`Backend.supports` before it uses
    an optional method; a check whose capability is missing is refused before any work
    (:meth:`Backend.refusal`), never passed silently."""

    REVERSE = "reverse"  #: reverse mode: Trace.vjp (check_backward_ad)
    FORWARD = "forward"  #: forward mode: jvp, jvp_wrt (check_forward_ad)
    BATCHED_GRAD = "batched"  #: Trace.vjp_batched (check_batched_grad)
    BATCHED_FORWARD = "batched_forward"  #: jvp_batched (check_batched_forward_grad)
    UNDEFINED_GRAD = "undefined_grad"  #: vjp_with_undefined_outputs (check_undefined_grad)
    MASKED = "masked"  #: masked=True is meaningful (sparse layouts, or dense arrays only)
    SPARSE = "sparse"  #: sparse layouts: layout, densify, to_dense, gradient_layout_problem
    SECOND_ORDER = "second_order"  #: differentiable_vjp, random_cotangent (gradgradcheck)
    BATCHED_EVALUATION = "batched_evaluation"  #: evaluate_batch, element_moves, one_hots (engine)
    BATCHED_JVP = "batched_jvp"  #: jvp_rows, jvp_along (engine, forward mode)
    STACKED_EVALUATION = "stacked_evaluation"  #: evaluate_stacked (engine)
    FUNCTIONAL_BATCHED_EVALUATION = "functional_batched_evaluation"  #: evaluate_batch_functional (engine)


#: the verbs every backend writes itself (the base class has no default for them)
REQUIRED_METHODS = (
    "owns", "is_checked", "is_complex", "is_floating_or_complex", "is_double_precision",
    "is_differentiable_output", "is_bool", "trace", "perturber", "jvp", "allclose",
    "generator", "uniform_unit_vector", "normal_like", "from_numpy",
)

#: the rest of the required core, with defaults written against the array API
DEFAULTED_METHODS = ("xp", "to_numpy", "precision", "one_hot", "as_int")

#: the required core of the contract
CORE_METHODS = REQUIRED_METHODS + DEFAULTED_METHODS

#: the capabilities of the engine's faster paths: :meth:`Backend.supports` grants them only
#: to a backend that implements :class:`~agcheck.backends.batched_forms.BatchedForms`
BATCHED_FORMS = frozenset({
    Capability.BATCHED_EVALUATION, Capability.BATCHED_JVP, Capability.STACKED_EVALUATION,
    Capability.FUNCTIONAL_BATCHED_EVALUATION,
})

#: the methods a backend implements when it lists a capability
CAPABILITY_METHODS = {
    Capability.FORWARD: ("jvp_wrt", "part_as_input"),
    Capability.BATCHED_FORWARD: ("jvp_batched",),
    Capability.UNDEFINED_GRAD: ("vjp_with_undefined_outputs",),
    Capability.BATCHED_EVALUATION: ("evaluate_batch", "element_moves", "one_hots"),
    Capability.BATCHED_JVP: ("jvp_rows", "jvp_along"),
    Capability.STACKED_EVALUATION: ("evaluate_stacked",),
    Capability.FUNCTIONAL_BATCHED_EVALUATION: ("evaluate_batch_functional",),
    Capability.SECOND_ORDER: ("random_cotangent", "differentiable_vjp"),
}


class UnsupportedError(NotImplementedError):
    """An optional method was called on a backend that does not declare its capability."""


class BackendUnavailableError(ImportError):
    """The framework behind a backend is not installed."""
