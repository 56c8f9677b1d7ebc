"""``tf.test.compute_gradient`` against agcheck's drop-in (``agcheck.patch_tensorflow()``), side
by side in one process, on quaternion functions written in TensorFlow (a product, a
normalisation, a rotation of points) with float32 inputs of a small (1x8x4) and a large
(216x4) shape.

For each case: the median wall-clock milliseconds of TensorFlow's function and of the
patched one, run in turn after a warm-up call each (wall clock, not CPU time: TensorFlow
runs graphs on its own threads), the median of the per-run ratios (TensorFlow's time over
agcheck's: above 1, agcheck is faster), and the largest difference between the two sides'
Jacobians (the numerical ones differ by float32 rounding where agcheck evaluates ``f``
vectorized). With ``--gradcheck``, also ``agcheck.gradcheck`` at the same step (a verdict,
with its reentrancy and undefined-gradient checks, not the two Jacobians).

    python bench/tf_small.py [--repeat 7] [--large-repeat 1] [--gradcheck]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from agcheck.backends.tensorflow_loading import import_tensorflow  # noqa: E402

tf = import_tensorflow()

import agcheck  # noqa: E402
from agcheck.backends import tensorflow_dropin  # noqa: E402

# TensorFlow's own function, kept in a dict: the patch rebinds every module-level name bound to it
TENSORFLOW = {"compute_gradient": tensorflow_dropin.targets()[0][0]}


def quaternion_product(a, b):
    w1, x1, y1, z1 = tf.unstack(a, axis=-1)
    w2, x2, y2, z2 = tf.unstack(b, axis=-1)
    return tf.stack([w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2,
                     w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
                     w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2,
                     w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2], axis=-1)


def normalize(q):
    return q / tf.norm(q, axis=-1, keepdims=True)


def rotate(q, p):
    """The points ``p`` (``..., 3``) rotated by the unit quaternions of ``q``."""
    q = normalize(q)
    point = tf.concat([tf.zeros_like(p[..., :1]), p], axis=-1)
    conjugate = q * tf.constant([1.0, -1.0, -1.0, -1.0], q.dtype)
    return quaternion_product(quaternion_product(q, point), conjugate)[..., 1:]


def cases():
    rng = np.random.default_rng(0)
    for shape in ((1, 8, 4), (216, 4)):
        def rand(*s):
            return tf.constant(rng.standard_normal(s).astype(np.float32))

        yield shape, "quaternion product", quaternion_product, [rand(*shape), rand(*shape)]
        yield shape, "normalize", normalize, [rand(*shape)]
        yield shape, "rotate points", rotate, [rand(*shape), rand(*shape[:-1], 3)]


def wall_ms(call) -> float:
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1e3


def largest_difference(a, b) -> float:
    return max((float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)), initial=0.0))
                for pa, pb in zip(a, b) for x, y in zip(pa, pb)), default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="timed runs per side, small shapes")
    parser.add_argument("--large-repeat", type=int, default=1, help="timed runs per side, large shapes")
    parser.add_argument("--gradcheck", action="store_true", help="also time agcheck.gradcheck at the same step")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=r"Input #\d+ requires gradient and is not a double precision")
    header = f"{'shape':<10} {'function':<20} {'compute_gradient ms':>20} {'agcheck ms':>11} {'ratio':>6} " \
             f"{'max |diff|':>11}" + (f" {'gradcheck ms':>13}" if args.gradcheck else "")
    print(f"TensorFlow {tf.__version__}, float32 inputs, delta = 1/1024; ratio = compute_gradient / agcheck "
          "(median of the runs' ratios)")
    print(header)
    with agcheck.patch_tensorflow():
        for shape, name, f, xs in cases():
            repeat = args.repeat if int(np.prod(shape)) < 100 else args.large_repeat
            theirs = TENSORFLOW["compute_gradient"](f, xs)  # warm-up calls: first uses of ops, lazy imports
            ours = tf.test.compute_gradient(f, xs)
            times = {"tf": [], "agcheck": [], "gradcheck": []}
            for _ in range(repeat):
                times["tf"].append(wall_ms(lambda: TENSORFLOW["compute_gradient"](f, xs)))
                times["agcheck"].append(wall_ms(lambda: tf.test.compute_gradient(f, xs)))
                if args.gradcheck:
                    times["gradcheck"].append(wall_ms(lambda: agcheck.gradcheck(
                        f, tuple(xs), eps=1 / 1024, atol=1e-2, rtol=1e-2, raise_exception=False)))
            ratio = statistics.median(t / a for t, a in zip(times["tf"], times["agcheck"]))
            line = (f"{'x'.join(map(str, shape)):<10} {name:<20} {statistics.median(times['tf']):>20.0f} "
                    f"{statistics.median(times['agcheck']):>11.0f} {ratio:>5.2f}x "
                    f"{largest_difference(theirs, ours):>11.2g}")
            if args.gradcheck:
                line += f" {statistics.median(times['gradcheck']):>13.0f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
