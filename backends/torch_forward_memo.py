"""The forward pass of a VJP function, reused while only its cotangents move.

gradgradcheck checks ``vjp(fn)(inputs, cotangents)``; each of its evaluations runs
``fn`` forward and then a backward pass with the cotangents. The forward does not depend
on the cotangents, so where consecutive evaluations differ only in them (the numerical
rows of the cotangent inputs, and the traced call after the call that drew the random
cotangents) the last forward's outputs, graph retained, serve again: only the backward
runs. A forward is reused while the inputs are the same objects with the same values
(their content digests), and grad mode is the same.

A backward that runs a second time on the same graph could see state its first run
changed (a custom Function that frees what it saved, or writes into it): the first
repeated backward of a check is therefore compared, bit for bit, with a fresh forward and
backward, and the memo stops on any difference, or when a repeated backward raises, a
fresh one does not and the graph refuses another backward (the evaluation then runs
fresh). Where the fresh one raises too, the call is at fault: its error is raised, and
only the graph that raised is dropped; where the graph takes another backward, the user's
code raised once, and that error is raised, as a fresh evaluation would have raised it.
It also stops when digesting the inputs costs a good part of the forwards it would save,
as the first calls' digests and forwards measure it (:data:`DIGEST_RULE_CALLS`): a ratio of
the two, timed side by side on the calling thread's CPU clock (digests are taken of CPU
tensors only). A digest of a few microseconds that the scheduler preempted on a busy
machine would count milliseconds on a wall clock and close the memo (it did in 6 of 16
gradgradchecks of a 5 x 5 eigenproblem beside three busy loops, one of them then calling
``fn`` twice as often).
"""
from __future__ import annotations

import time

import torch

__all__ = ["RetainedForward"]

#: the memo stops once digests cost this fraction of the forwards they are taken for
DIGEST_SHARE_LIMIT = 0.4
#: forwards timed before that rule applies
DIGEST_TIMED_CALLS = 4
#: the memo stops at once where a digest costs this many forwards (on the calls timed so
#: far, from the first): each call pays a digest and a reuse saves at most one forward, so
#: no reuse can repay it (a fast-mode gradgradcheck of a small function makes six or seven
#: calls, and paid a digest for each before the rule above applied)
DIGEST_NEVER_PAYS = 1.0
#: calls timed for that rule: digests and forwards keep their sizes through a check, so
#: the rule is decided on the first ones, and later calls pay no clock readings
DIGEST_RULE_CALLS = 64
_IMMUTABLE = (int, float, complex, bool, str, bytes, type(None), torch.dtype, torch.device)


class RetainedForward:
    """``fn``'s last forward: its inputs' key, its outputs that require grad (graph
    retained), and how many backward passes ran on it."""

    def __init__(self, backend, fn, decide_after: int | None = None):
        self.backend, self.fn = backend, fn
        #: forwards timed before the share rule applies (fewer where few calls follow)
        self.decide_after = DIGEST_TIMED_CALLS if decide_after is None else decide_after
        self.enabled = True
        self.validated = False  # a repeated backward matched a fresh one, bit for bit
        self.reused = 0
        self._entry = None  # [key, inputs, outputs that require grad, backwards run on them]
        self._digest_seconds = 0.0
        self._forward_seconds = 0.0
        self._forwards = 0
        self._timed = 0  # digests timed so far (up to DIGEST_RULE_CALLS)
        self._timing = True  # the last digest was timed: so is the forward after it

    def seed(self, inputs: tuple, outputs: tuple, seconds: float | None = None) -> None:
        """Keep a forward the caller already ran (``outputs`` of ``fn(*inputs)``); where
        the caller timed it (``seconds`` of the calling thread's CPU time), it counts as the
        first timed forward, and the digest rules apply at once."""
        if not self.enabled:
            return
        if seconds is None:
            key = self._key(inputs)
        else:
            key = self._timed_key(inputs)
            self._forward_seconds += seconds
            self._forwards += 1
            if self._digests_do_not_pay(self._timing):
                self.close()
                return
        if key is not None:
            self._entry = [key, inputs, _requiring_grad(outputs), 0]

    def vjp(self, inputs: tuple, backward) -> tuple:
        """``backward(outputs)`` on ``fn(*inputs)``'s outputs that require grad, reusing the
        kept forward where it applies."""
        key = self._timed_key(inputs) if self.enabled else None
        entry = self._entry
        if not self._matches(entry, key, inputs):
            return self._backward(self._forward(inputs, key), backward)
        if entry[3] == 0:  # its first backward: what a fresh evaluation does
            return self._backward(entry, backward)
        try:
            reused = self._backward(entry, backward)
        except Exception as error:
            # run fresh: where that raises too, the call itself is at fault (cotangents of
            # another shape) and its error is raised, the memo going on from the next
            # forward. Where it does not, either the graph does not take another backward
            # (it refuses again: the memo stops, the fresh result stands) or the user's
            # code raised this once (the graph takes another backward: the error is
            # raised, as a fresh evaluation would have raised it)
            self._entry = None
            fresh = backward(_requiring_grad(self.fn(*inputs)))
            if self._takes_another_backward(entry, backward):
                raise error
            self.close()
            return fresh
        self.reused += 1
        if self.validated:
            return reused
        fresh = backward(_requiring_grad(self.fn(*inputs)))
        if self._bitwise_equal(reused, fresh):
            self.validated = True
        else:
            self.close()
        return fresh

    def outputs(self, inputs: tuple) -> list:
        """``fn(*inputs)``'s outputs that require grad, graph retained, for one backward
        pass the caller runs: the kept forward where it applies, else a fresh one (kept in
        turn). A later :meth:`vjp` on the same forward counts as a repeated backward, and
        is checked as one."""
        key = self._timed_key(inputs) if self.enabled else None
        entry = self._entry
        if not self._matches(entry, key, inputs):
            entry = self._forward(inputs, key)
        entry[3] += 1
        return entry[2]

    @staticmethod
    def _matches(entry, key, inputs) -> bool:
        return key is not None and entry is not None and entry[0] == key and len(entry[1]) == len(inputs) and \
            all(a is b for a, b in zip(entry[1], inputs))

    def close(self) -> None:
        """Stop reusing forwards and drop the one kept."""
        self.enabled = False
        self._entry = None

    @staticmethod
    def _takes_another_backward(entry, backward) -> bool:
        """Whether a backward pass on the kept ``entry`` runs without raising."""
        try:
            RetainedForward._backward(entry, backward)
        except Exception:  # noqa: BLE001 - the answer is whether it raises
            return False
        return True

    @staticmethod
    def _backward(entry, backward) -> tuple:
        entry[3] += 1
        return backward(entry[2])

    @staticmethod
    def _seconds(inputs: tuple) -> float:
        """A reading of the clock the digest rule is timed on: the calling thread's CPU
        time (digests, and so the forwards they key, are of CPU tensors)."""
        return time.thread_time()

    def _timed_key(self, inputs: tuple):
        self._timing = self._timed < DIGEST_RULE_CALLS
        if not self._timing:
            return self._key(inputs)
        self._timed += 1
        began = self._seconds(inputs)
        key = self._key(inputs)
        self._digest_seconds += self._seconds(inputs) - began
        return key

    def _forward(self, inputs: tuple, key):
        timed = self.enabled and self._timing
        began = self._seconds(inputs) if timed else 0.0
        outputs = _requiring_grad(self.fn(*inputs))
        if timed:
            self._forward_seconds += self._seconds(inputs) - began
        self._forwards += 1
        entry = [key, inputs, outputs, 0]
        if self._digests_do_not_pay(timed):
            self.close()
        else:
            self._entry = entry if key is not None else None
        return entry

    def _digests_do_not_pay(self, timed: bool) -> bool:
        """Whether digests cost more than the forwards they would save: a good part of
        them over the first forwards, or, on the calls timed so far, more than a forward
        each (no reuse can repay that)."""
        if self._forwards >= self.decide_after and self._digest_seconds > DIGEST_SHARE_LIMIT * self._forward_seconds:
            return True
        return timed and self._timed > 0 and \
            self._digest_seconds / self._timed > DIGEST_NEVER_PAYS * self._forward_seconds / self._forwards

    def _bitwise_equal(self, a: tuple, b: tuple) -> bool:
        """Whether two tuples of gradients (or ``None``) hold the same bits."""
        if len(a) != len(b):
            return False
        for x, y in zip(a, b):
            if x is None or y is None:
                if x is not y:
                    return False
            elif x.shape != y.shape or x.dtype != y.dtype or x.layout != y.layout or \
                    not self.backend.unchanged(x, y.detach()):
                return False
        return True

    def _key(self, inputs: tuple):
        if not all(isinstance(a, (torch.Tensor, *_IMMUTABLE)) for a in inputs):
            return None  # a mutable object: its content could change under the same identity
        key = [torch.is_grad_enabled()]
        for a in inputs:
            if isinstance(a, torch.Tensor):
                digest = self.backend.content_digest(a)
                if digest is None:
                    return None
                key.append(digest)
            else:
                key.append((type(a), a))
        return tuple(key)


def _requiring_grad(outputs) -> list:
    """The tensors among ``outputs`` (one, or a tuple or list) that require grad."""
    if not isinstance(outputs, (tuple, list)):
        outputs = (outputs,)
    return [o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad]
