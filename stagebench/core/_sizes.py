"""How many bytes an item holds, without copying it: what a cache of stage outputs stores, and what a
batch in flight between a loader's worker and the main process takes in shared memory."""

from __future__ import annotations

import pickle
import sys
from typing import Any

__all__ = ["approx_nbytes"]


def approx_nbytes(obj: Any, _depth: int = 0) -> int:
    """Bytes an item holds: exact for arrays, tensors, bytes and images; pickled size otherwise.

    Arrays and tensors are measured without copying (pickling a decoded image
    only to learn its size would double the caching cost).
    """
    if isinstance(obj, (bytes, bytearray, memoryview, str)):
        return len(obj)
    if isinstance(obj, (int, float, bool, type(None))):
        return 8
    nbytes = getattr(obj, "nbytes", None)  # numpy arrays
    if isinstance(nbytes, int):
        return nbytes
    mod = type(obj).__module__
    if mod.startswith("torch") and hasattr(obj, "element_size") and hasattr(obj, "nelement"):
        try:
            return int(obj.element_size() * obj.nelement())
        except Exception:
            pass
    if mod.startswith("PIL.") and hasattr(obj, "size") and hasattr(obj, "getbands"):
        w, h = obj.size
        return int(w * h * len(obj.getbands()))
    if _depth < 3:
        if isinstance(obj, (list, tuple, set, frozenset)):
            return 64 + sum(approx_nbytes(x, _depth + 1) for x in obj)
        if isinstance(obj, dict):
            return 64 + sum(approx_nbytes(k, _depth + 1) + approx_nbytes(v, _depth + 1) for k, v in obj.items())
    try:
        return len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:
        return sys.getsizeof(obj)
