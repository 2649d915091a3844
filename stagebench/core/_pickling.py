"""Whether something can be pickled, and why not: one check for every place that ships or stores items.

The disk cache stores stage outputs with pickle; process pools ship stages and
items with cloudpickle. A diagnosis asks up front (the source items, each
stage's inputs) so that process points of an unpicklable stage are recorded as
skipped with the error, and so that outputs the cache cannot store are not
written.
"""

from __future__ import annotations

import pickle
from typing import Any

import cloudpickle

from stagebench._memory import out_of_memory

__all__ = ["pickle_problem"]


class _Discard:
    def write(self, data: Any) -> int:
        return len(data)


def pickle_problem(obj: Any, *, cloud: bool = False) -> str | None:
    """Why ``obj`` cannot be pickled (``"TypeError: cannot pickle '_thread.lock' object"``), or None.

    ``cloud=True`` checks with cloudpickle, as a process pool ships items;
    otherwise with pickle, as the disk cache stores them. Pickles into nothing
    with array buffers left out of band (protocol 5), so the check walks the
    objects without copying their data.

    Running out of memory while pickling says nothing of whether ``obj`` can be pickled: it is raised,
    for the caller to record as memory (:func:`stagebench._memory.out_of_memory`).
    """
    pickler: Any = cloudpickle.CloudPickler if cloud else pickle.Pickler
    try:
        pickler(_Discard(), protocol=5, buffer_callback=lambda buf: None).dump(obj)
    except Exception as e:
        if out_of_memory(e):
            raise
        msg = str(e).splitlines()[0][:200] if str(e) else ""
        return f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    return None
