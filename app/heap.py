"""A serving process's garbage collector: start-up's objects frozen, young collections rare.

A started worker holds about 100,000 objects that CPython's cyclic collector
tracks (FastAPI's routes and models, pydantic's validators, NumPy, SciPy, the
service's own), and none of them ever becomes garbage. Every full collection
traversed all of them: under load, a few dozen a minute, each tens of
milliseconds of a request's time, which was most of the p99 latency
(BENCHMARKS.md §21). And a young collection ran every 700 tracked objects
allocated and not yet freed, every request or two, walking the objects of
the requests in flight.

:func:`settle` is called once a worker has started (``app.main``): it
collects what start-up left, freezes the rest (``gc.freeze``: a permanent
generation that collections skip; objects in it are still freed when their
last reference goes, only a cycle among them would stay) and raises the
young generation's threshold, so that a collection runs after
:data:`YOUNG_THRESHOLD` net allocations (cyclic garbage, and objects that
live on: a few megabytes at most) rather than 700.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "settle"]

YOUNG_THRESHOLD = 10_000


def settle() -> None:
    """Collect, freeze what is left, and make young collections rare (module notes)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
