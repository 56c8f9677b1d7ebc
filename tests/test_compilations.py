"""The engine's memory of compilations (agcheck.engine.compilations), framework-free."""
from agcheck.engine.compilations import Compilations


def _fn(x):
    return x


def test_a_compilation_seen_first_is_the_price_until_the_engine_has_run():
    seen = Compilations()
    assert seen.price(_fn, "a", 0.0) == 0.0  # never compiled anything that was seen
    assert seen.price(_fn, "a", 0.5) == 0.5  # the first evaluation compiled
    assert seen.price(_fn, "a", 0.001) == 0.5  # warm now: the engine's programs still are not
    assert seen.price(_fn, "b", 0.0) == 0.0  # another signature is another program
    assert not seen.engine_ran(_fn, "a")
    seen.note_engine_run(_fn, "a")
    assert seen.engine_ran(_fn, "a") and not seen.engine_ran(_fn, "b")
    assert seen.price(_fn, "a", 0.3) == 0.0  # its programs are compiled
    assert seen.price(lambda x: x, "a", 0.0) == 0.0  # another function


class _NoWeakReference:
    __slots__ = ()

    def __call__(self, x):
        return x


def test_a_function_that_cannot_be_weakly_referenced_is_priced_by_its_measure_alone():
    seen, fn = Compilations(), _NoWeakReference()
    assert seen.price(fn, "a", 0.5) == 0.5
    assert seen.price(fn, "a", 0.0) == 0.0
    seen.note_engine_run(fn, "a")  # nothing kept, nothing raised
    assert not seen.engine_ran(fn, "a")


def test_a_function_is_not_kept_alive_by_its_prices():
    import gc
    import weakref

    def f(x):
        return x

    seen = Compilations()
    seen.price(f, "a", 0.5)
    alive = weakref.ref(f)
    del f
    gc.collect()
    assert alive() is None
