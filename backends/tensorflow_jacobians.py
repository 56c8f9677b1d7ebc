"""The Jacobians ``tf.test.compute_gradient`` returns, computed as fast as the function
allows and equal to TensorFlow's: stacked copies of the arguments where ``f`` takes them,
vectorized forms for larger checks, one move at a time otherwise; entries where the two
Jacobians differ are computed again one at a time (:mod:`agcheck.backends.tensorflow_dropin`
routes ``compute_gradient`` here)."""
from __future__ import annotations

import logging

import numpy as np

from agcheck.backends.tensorflow_backend import tf

__all__ = ["Problem", "NotStacked", "tolerances_of", "WARN_TOLERANCES", "HALF_TOLERANCES", "differing",
           "real_dtype", "numpy_dtype", "numel", "real_entries", "STACKED_EVALUATIONS", "STACKED_ROWS",
           "PROBED_FROM", "BATCHED_EVALUATIONS", "BATCHED_ROWS", "BATCH_BYTES"]

LOG = logging.getLogger("agcheck.tensorflow")

#: ``(atol, rtol)`` by real dtype above which the two Jacobians count as different (for the
#: drop-in's warning and its report's default): torch's gradcheck tolerances in double
#: precision, looser in single. In half precision the step ``1/1024`` is about the spacing
#: of the numbers themselves, and the finite differences say little: no warning there
#: (:func:`agcheck.backends.tensorflow_dropin.report` then checks at ``(0.1, 0.1)``)
WARN_TOLERANCES = {"float64": (1e-5, 1e-3), "float32": (1e-2, 1e-2), "float16": None, "bfloat16": None}
HALF_TOLERANCES = (1e-1, 1e-1)

#: an argument is moved in stacked copies (:meth:`Problem.columns_stacked`) from this many
#: evaluations of ``f`` on (the form's checks cost three plain calls and a stack of two),
#: and the theoretical rows are computed in stacked copies from this many rows on
STACKED_EVALUATIONS = 16
STACKED_ROWS = 8
#: a stack of more items than this is preceded by a stack of two (:meth:`Problem._in_stacks`)
PROBED_FROM = 64
#: an argument is moved in one vectorized evaluation from this many evaluations of ``f``
#: (two per real element) on, and element by element below. Tracing ``f`` for
#: ``tf.vectorized_map`` costs about 30-60 plain calls (quaternion products and
#: normalisations of 4 to 864 elements: 14-40 ms against 0.2-0.6 ms a call, TF 2.21 CPU)
BATCHED_EVALUATIONS = 128
#: the theoretical Jacobian is one vectorized gradient from this many rows on: tracing the
#: gradient costs about 40 plain ``tape.gradient`` calls (34-65 ms against 0.9-1.2 ms)
BATCHED_ROWS = 96
#: bytes one vectorized call may take (the moved copies, their values and intermediates)
BATCH_BYTES = 256 << 20
#: what a vectorized evaluation keeps alive per copy, in copies of its input and output
_INTERMEDIATES = 4


def tolerances_of(*dtypes) -> tuple | None:
    """The comparison's ``(atol, rtol)`` for values of ``dtypes``: the loosest of theirs
    (``None`` where one is of half precision)."""
    found = [WARN_TOLERANCES.get(tf.as_dtype(d).real_dtype.name, WARN_TOLERANCES["float32"]) for d in dtypes]
    if any(t is None for t in found):
        return None
    return max(t[0] for t in found), max(t[1] for t in found)


def real_dtype(dtype) -> np.dtype:
    return np.dtype(tf.as_dtype(dtype).real_dtype.as_numpy_dtype)


def numpy_dtype(dtype) -> np.dtype:
    return np.dtype(tf.as_dtype(dtype).as_numpy_dtype)


def numel(shape) -> int:
    return int(np.prod(tuple(int(s) for s in shape), dtype=np.int64))


def real_entries(array) -> np.ndarray:
    """A 2-D array ``(len(array), entries)``: each of the stacked arrays' elements as real
    entries (a complex one as two, real part first), a view where ``array`` is contiguous."""
    array = np.ascontiguousarray(array)
    return array.reshape(len(array), -1).view(real_dtype(array.dtype))


class NotStacked(Exception):
    """``f`` does not give each of the copies stacked along a new first axis its own value."""


class Problem:
    """One call's ``f``, arguments and value, and the ways to compute its Jacobians' rows
    (theoretical) and columns (numerical): one at a time, as TensorFlow computes them; in
    stacked copies; vectorized. See the module's docstring."""

    def __init__(self, f, xs, y_shape, y_dtype, delta, be):
        self.f, self.xs, self.delta, self.be = f, list(xs), delta, be
        self.y_shape = tuple(int(s) for s in y_shape)
        self.y_dtype = tf.as_dtype(y_dtype)
        self.m = numel(self.y_shape) * (2 if self.y_dtype.is_complex else 1)
        self.sizes = [numel(x.shape) * (2 if x.dtype.is_complex else 1) for x in self.xs]
        self.scale = np.asarray(2 * delta, dtype=real_dtype(self.y_dtype))[()]
        self._trace = None

    # -- TensorFlow's arithmetic, one row or column at a time --------------------------------
    def value(self, position, value):
        """``f`` with ``xs[position]`` replaced by the NumPy ``value``, as a NumPy array."""
        args = list(self.xs)
        args[position] = tf.constant(value)
        return np.asarray(tf.convert_to_tensor(self.f(*args)).numpy())

    def columns_looped(self, position, jacobian, columns) -> None:
        """For each real entry ``c`` in ``columns`` of ``xs[position]``: ``f`` with the entry
        moved by ``+delta`` and by ``-delta`` in the argument's dtype, their difference over
        ``2 delta`` in the value's."""
        x = np.array(self.xs[position].numpy(), copy=True)
        entries = x.reshape(-1).view(real_dtype(x.dtype))
        for col in columns:
            original = entries[col]
            entries[col] += self.delta
            plus = self.value(position, x)
            entries[col] = original
            entries[col] -= self.delta
            minus = self.value(position, x)
            entries[col] = original
            jacobian[:, col] = real_entries(((plus - minus) / self.scale)[None])[0]

    def trace(self):
        """``f`` evaluated once under a persistent tape watching every argument."""
        if self._trace is None:
            self._trace = self.be.trace(self.f, tuple(self.xs), list(range(len(self.xs))))
        return self._trace

    def one_hot(self, row):
        cotangent = np.zeros(self.y_shape, dtype=numpy_dtype(self.y_dtype))
        real_entries(cotangent[None])[0, row] = 1
        return cotangent

    def row(self, row) -> list:
        """Row ``row`` of every argument's Jacobian as real entries: the gradient with the
        cotangent that is 1 at real entry ``row`` of the value (``1j`` at an imaginary part);
        ``None`` for an argument the value does not depend on."""
        grads = self.trace().vjp([0], [self.one_hot(row)])
        return [None if g is None else real_entries(np.asarray(g)[None])[0] for g in grads]

    def rows_looped(self, jacobians, rows) -> None:
        for r in rows:
            for jacobian, grad in zip(jacobians, self.row(r)):
                jacobian[r, :] = 0 if grad is None else grad

    # -- stacked copies: f of a batch of arguments --------------------------------------------
    def _chunk(self, bytes_per_copy) -> int:
        return max(1, BATCH_BYTES // max(_INTERMEDIATES * bytes_per_copy, 1))

    def _stacked_value(self, position, copies):
        out = self.value(position, copies)
        if out.shape != (len(copies), *self.y_shape) or out.dtype != numpy_dtype(self.y_dtype):
            raise NotStacked(f"a stack of {len(copies)} gave a value of shape {out.shape}, {out.dtype}")
        return out

    def moved(self, position, flat, sign):
        """Copies of ``xs[position]``, the ``k``-th with real entry ``flat[k]`` moved by
        ``sign * delta`` (the arithmetic of :meth:`columns_looped`)."""
        x = np.asarray(self.xs[position].numpy())
        copies = np.repeat(x[None], len(flat), axis=0)
        entries = real_entries(copies)
        rows, cols = np.arange(len(flat)), np.asarray(flat, dtype=np.int64)
        entries[rows, cols] = entries[rows, cols] + self.delta if sign > 0 else entries[rows, cols] - self.delta
        return copies

    def _in_stacks(self, count, chunk, stack) -> None:
        """Items ``0:count`` (argument entries or rows) in stacks of ``chunk`` at most:
        ``stack(items, checked, write)`` computes a stack, compares the items at the
        positions ``checked`` with plain computations (raising :class:`NotStacked` where
        one differs) and, where ``write``, stores the stack's results. A first stack larger
        than ``PROBED_FROM`` items is preceded by a stack of two, so that a function that
        cannot take stacks costs little; otherwise the first stack is checked at two items
        and every later one at its last."""
        probed = min(count, chunk) > PROBED_FROM
        if probed:
            stack([count // 2, count - 1], (0, 1), False)
        for i, start in enumerate(range(0, count, chunk)):
            items = list(range(start, min(count, start + chunk)))
            stack(items, (len(items) - 1,) if probed or i else (len(items) // 2, len(items) - 1), True)

    def columns_stacked(self, position, jacobian) -> bool:
        """Every column of :meth:`columns_looped` from calls of ``f`` with the moved copies
        of ``xs[position]`` stacked along a new first axis: TensorFlow's operations broadcast
        over leading axes, so a function written for ``...`` shapes takes such a stack as it
        is, eagerly, with nothing traced. Used only where each copy's value is, bit for bit,
        what a call of its own gives (:meth:`_in_stacks` compares some). ``False`` where
        one differs, the value of a stack has another shape or dtype, or a stacked call
        raised."""
        x = self.xs[position]

        def stack(flat, checked, write):
            b = len(flat)
            copies = np.concatenate([self.moved(position, flat, 1), self.moved(position, flat, -1)])
            out = self._stacked_value(position, copies)
            for k in checked:  # the item's plus move, and for the last item its minus move
                for copy in ((k, k + b) if k == b - 1 else (k,)):
                    if out[copy].tobytes() != self.value(position, copies[copy]).tobytes():
                        raise NotStacked(f"a stack of {len(copies)} differs from a plain call")
            if write:
                jacobian[:, flat[0]:flat[0] + b] = real_entries((out[:b] - out[b:]) / self.scale).T

        try:
            self._in_stacks(self.sizes[position], self._chunk(2 * (
                x.dtype.size * numel(x.shape) + self.y_dtype.size * numel(self.y_shape))), stack)
        except Exception as error:  # noqa: BLE001 - not stackable: computed otherwise
            LOG.debug("compute_gradient: argument %d not moved in stacked copies (%s: %s)", position,
                      type(error).__name__, error)
            return False
        return True

    def rows_stacked(self, jacobians) -> bool:
        """Every row of :meth:`rows_looped` from gradients of ``f`` at copies of all the
        arguments stacked along a new first axis, with the one-hot cotangents stacked the
        same way (the gradient of copy ``k`` is row ``k``). Used only where a stacked row is,
        bit for bit, the gradient of a plain evaluation (:meth:`_in_stacks` compares some).
        ``False`` where not."""
        arrays = [np.asarray(x.numpy()) for x in self.xs]

        def stack(rows, checked, write):
            tiled = [tf.constant(np.repeat(a[None], len(rows), axis=0)) for a in arrays]
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                for t in tiled:
                    tape.watch(t)
                out = tf.convert_to_tensor(self.f(*tiled))
            if tuple(out.shape) != (len(rows), *self.y_shape) or out.dtype != self.y_dtype:
                raise NotStacked(f"a stack of {len(rows)} gave a value of shape {tuple(out.shape)}, {out.dtype}")
            cotangents = np.stack([self.one_hot(r) for r in rows])
            grads = tape.gradient(out, tiled, output_gradients=tf.constant(cotangents),
                                  unconnected_gradients=tf.UnconnectedGradients.NONE)
            grads = [None if g is None else real_entries(np.asarray(tf.convert_to_tensor(g).numpy())) for g in grads]
            for k in checked:
                for g, plain in zip(grads, self.row(rows[k])):
                    if (g is None) != (plain is None) or g is not None and g[k].tobytes() != plain.tobytes():
                        raise NotStacked(f"the rows of a stack of {len(rows)} differ from a plain gradient")
            if write:
                for jacobian, g in zip(jacobians, grads):
                    jacobian[rows[0]:rows[0] + len(rows), :] = 0 if g is None else g

        try:
            self._in_stacks(self.m, self._chunk(2 * (sum(x.dtype.size * numel(x.shape) for x in self.xs)
                                                     + self.y_dtype.size * numel(self.y_shape))), stack)
        except Exception as error:  # noqa: BLE001 - not stackable: computed otherwise
            LOG.debug("compute_gradient: gradient rows not in stacked copies (%s: %s)", type(error).__name__, error)
            return False
        return True

    # -- vectorized: tf.vectorized_map of f of real views --------------------------------------
    def _real_problem(self) -> tuple:
        """``(f of real views, the arguments' real views)``: what the vectorized forms take
        (every Jacobian they compute is then real)."""
        complex_args = [x.dtype.is_complex for x in self.xs]
        complex_value = self.y_dtype.is_complex
        f = self.f

        def of_real_views(*args):
            rebuilt = [tf.complex(a[..., 0], a[..., 1]) if c else a for a, c in zip(args, complex_args)]
            y = tf.convert_to_tensor(f(*rebuilt))
            return tf.stack([tf.math.real(y), tf.math.imag(y)], axis=-1) if complex_value else y

        views = tuple(tf.stack([tf.math.real(x), tf.math.imag(x)], axis=-1) if c else x
                      for x, c in zip(self.xs, complex_args))
        return (of_real_views if any(complex_args) or complex_value else f), views

    def columns_vectorized(self, position, jacobian) -> int:
        """The columns of :meth:`columns_looped` from ``tf.vectorized_map`` evaluations of
        both moves of a chunk of entries at a time; how many were computed (fewer where an
        evaluation failed: the loop computes the rest)."""
        be = self.be
        g, args = self._real_problem()
        x, n = args[position], self.sizes[position]
        chunk = self._chunk(2 * (be.itemsize(x) * n + self.scale.itemsize * self.m))
        done = 0
        try:
            while done < n:
                flat = list(range(done, min(n, done + chunk)))
                stacked = np.concatenate([be.element_moves(x, flat, self.delta, 1),
                                          be.element_moves(x, flat, self.delta, -1)])
                values = np.asarray(be.evaluate_batch(g, args, position, stacked)[0])
                b = len(flat)
                jacobian[:, done:done + b] = ((values[:b] - values[b:]) / self.scale).reshape(b, -1).T
                done += b
        except Exception as error:  # noqa: BLE001 - f cannot run vectorized: the loop computes
            LOG.debug("compute_gradient: argument %d moved element by element (%s: %s)", position,
                      type(error).__name__, error)
        return done

    def rows_vectorized(self, jacobians) -> bool:
        """Every row of :meth:`rows_looped` from ``tf.vectorized_map`` gradients with one-hot
        cotangents, a chunk of rows at a time; ``False`` where one failed."""
        be = self.be
        g, args = self._real_problem()
        trace = be.trace(g, args, list(range(len(args))))
        y = trace.outputs[0]
        chunk = self._chunk(2 * (be.itemsize(y) * self.m + sum(j.itemsize * j.shape[1] for j in jacobians)))
        try:
            for done in range(0, self.m, chunk):
                rows = list(range(done, min(self.m, done + chunk)))
                grads = trace.vjp_batched(0, be.one_hots(y, rows))
                for jacobian, grad in zip(jacobians, grads):
                    jacobian[done:done + len(rows), :] = np.asarray(grad).reshape(len(rows), -1)
        except Exception as error:  # noqa: BLE001 - the gradient cannot run vectorized: the loop computes
            LOG.debug("compute_gradient: gradient rows one at a time (%s: %s)", type(error).__name__, error)
            return False
        return True

    # -- the whole --------------------------------------------------------------------------
    def empty_value_gradients(self) -> None:
        """TensorFlow's check of a value with no elements: its gradient is zero, of the
        argument's shape."""
        trace = self.trace()
        out = trace.outputs[0]
        grads = trace.vjp([0], [self.be.xp(out).zeros_like(out)])
        for x, grad in zip(self.xs, grads):
            if grad is None:
                continue
            if tuple(grad.shape) != tuple(x.shape):
                raise ValueError("Empty gradient has wrong shape: expected %s, got %s" % (x.shape, grad.shape))
            if np.any(grad):
                raise ValueError("Empty tensor with nonzero gradients")

    def jacobians(self) -> tuple:
        xs, m = self.xs, self.m
        theoretical = [np.zeros((m, n), dtype=real_dtype(x.dtype)) for x, n in zip(xs, self.sizes)]
        numerical = [np.zeros((m, n), dtype=real_dtype(x.dtype)) for x, n in zip(xs, self.sizes)]
        if not xs:
            return (), ()
        if m == 0:
            self.empty_value_gradients()
            return tuple(theoretical), tuple(numerical)
        # a tf.function traces itself anew for every new shape of stack: stacks pay there only
        # where vectorizing would
        traces = hasattr(self.f, "get_concrete_function")
        stacked_rows, stacked_evaluations = (BATCHED_ROWS, BATCHED_EVALUATIONS) if traces else \
            (STACKED_ROWS, STACKED_EVALUATIONS)
        stackable = m >= stacked_rows and self.rows_stacked(theoretical)
        rows_exact = not (stackable or m >= BATCHED_ROWS and self.rows_vectorized(theoretical))
        if rows_exact:
            self.rows_looped(theoretical, range(m))
        # a function of one argument that took no stack for the rows is given none for the
        # columns either (the same stack, moved: a failing TensorFlow operation also logs a
        # line on stderr); with more arguments the columns stack one of them only
        stackable = stackable or m < stacked_rows or len(xs) > 1
        tolerances = tolerances_of(self.y_dtype, *(x.dtype for x in xs)) or HALF_TOLERANCES
        for i, n in enumerate(self.sizes):
            done = n if stackable and n and 2 * n >= stacked_evaluations and self.columns_stacked(i, numerical[i]) \
                else 0
            if not done and 2 * n >= BATCHED_EVALUATIONS:
                done = self.columns_vectorized(i, numerical[i])
            self.columns_looped(i, numerical[i], range(done, n))
            # entries computed in stacked copies or vectorized that differ between the two
            # Jacobians are computed again as TensorFlow computes them, one at a time: such a
            # form then never makes the two differ, and a difference has TensorFlow's numbers
            rows, columns = differing(theoretical[i], numerical[i], tolerances)
            if not rows_exact and rows:
                self.rows_looped(theoretical, rows)
                rows, columns = differing(theoretical[i], numerical[i], tolerances)
            self.columns_looped(i, numerical[i], [c for c in columns if c < done])
        return tuple(theoretical), tuple(numerical)


def differing(theoretical, numerical, tolerances) -> tuple:
    """``(rows, columns)`` where the two Jacobians differ beyond ``(atol, rtol)``."""
    if not theoretical.size:
        return [], []
    atol, rtol = tolerances
    t, n = theoretical.astype(np.float64), numerical.astype(np.float64)
    with np.errstate(invalid="ignore"):
        far = ~(np.abs(t - n) <= atol + rtol * np.abs(n))
    return [int(r) for r in np.flatnonzero(far.any(axis=1))], [int(c) for c in np.flatnonzero(far.any(axis=0))]
