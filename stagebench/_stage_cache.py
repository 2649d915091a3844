"""On-disk cache of each stage's outputs, keyed by the stage's code and its inputs.

Diagnosing a pipeline runs every stage once over the outputs of the stage
before it. Decoding a few hundred images is slow enough that re-running the
diagnosis after editing a *later* stage should not redo the earlier ones, so
each stage's outputs are stored with :class:`joblib.Memory` under a folder the
user chose.

Why the key is built here and not by joblib: ``joblib.Memory`` keys a cached
call by the code of the *decorated* function and the hash of its arguments,
but it does not look into the code of a function passed *as an argument*. The
stage function is such an argument, so its fingerprint is computed here
(bytecode, constants, names, closure values, defaults, partial arguments, the
class of a callable object, helper functions of the same module it calls) and
chained with the key of the inputs: ``key(stage k) = hash(fingerprint(stage k),
key(stage k-1))``. Editing stage 3 changes keys 3, 4, ... and leaves 1 and 2.

A stage whose fingerprint cannot be computed reliably (a closure holding an
unpicklable object) gets a one-off key: it is recomputed every run, and we say
so, rather than risk serving stale outputs.

The cache assumes a stage is a function of its inputs. Source items that name
files get the files' size and modification time mixed into their key, so an
edited data file invalidates what was read from it; other outside state (a
database, the network) is not tracked.
"""

from __future__ import annotations

import dis
import functools
import inspect
import os
import pickle
import sys
import types
import uuid
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._pickling import pickle_problem

__all__ = [
    "StageCache",
    "CachedOutputs",
    "fingerprint",
    "callable_key",
    "items_key",
    "chain_key",
    "approx_nbytes",
]

_MAX_DEPTH = 4  # how far helper functions called by a stage are followed
_SIMPLE = (int, float, complex, str, bytes, bool, type(None))


# ---------------------------------------------------------------------------- keys
class _Unstable(Exception):
    """A part of the callable could not be fingerprinted reliably."""


def _value_key(value: Any, depth: int, seen: set[int]) -> Any:
    """A stable description of a value a stage closes over or is bound to."""
    if isinstance(value, _SIMPLE):
        return value
    if callable(value) and not isinstance(value, type) and _looks_like_code(value):
        return _fingerprint(value, depth + 1, seen)
    if isinstance(value, type):
        return _class_key(value, depth + 1, seen)
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    import joblib

    try:
        return ("value", type(value).__qualname__, joblib.hash(value))
    except Exception as e:  # unpicklable: a lock, an open file, a C handle
        raise _Unstable(f"cannot hash a {type(value).__name__} it refers to ({type(e).__name__})") from None


def _looks_like_code(obj: Any) -> bool:
    return isinstance(
        obj, (types.FunctionType, types.MethodType, functools.partial, types.BuiltinFunctionType)
    ) or (callable(obj) and hasattr(type(obj), "__call__") and not isinstance(obj, _SIMPLE))


def _const_key(c: Any) -> Any:
    if isinstance(c, types.CodeType):
        return _code_key(c)
    if isinstance(c, frozenset):  # `x in {"a", "b"}`: repr order follows string hashing, which varies per process
        return ("frozenset", tuple(sorted(repr(x) for x in c)))
    if isinstance(c, tuple):
        return tuple(_const_key(x) for x in c)
    return repr(c)


def _code_key(code: types.CodeType) -> tuple:
    consts = tuple(_const_key(c) for c in code.co_consts)
    return ("code", code.co_code, consts, code.co_names, code.co_varnames, code.co_freevars)


def _global_names(code: types.CodeType) -> set[str]:
    """Names a function (and the functions nested in it) loads as globals."""
    names: set[str] = set()
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            names.add(ins.argval)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _global_names(c)
    return names


def _function_key(fn: types.FunctionType, depth: int, seen: set[int]) -> tuple:
    parts: list[Any] = ["function", fn.__module__, fn.__qualname__, _code_key(fn.__code__)]
    parts.append(tuple(_value_key(v, depth, seen) for v in (fn.__defaults__ or ())))
    parts.append(tuple(sorted((k, _value_key(v, depth, seen)) for k, v in (fn.__kwdefaults__ or {}).items())))
    cells = []
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            contents = cell.cell_contents
        except ValueError:  # empty cell (defined later)
            contents = None
        cells.append((name, _value_key(contents, depth, seen)))
    parts.append(tuple(cells))
    # Helpers the stage calls (same module), and constants it reads: editing a
    # helper must invalidate the stage too. Library modules are not followed.
    globs = []
    if depth < _MAX_DEPTH:
        g = fn.__globals__
        for name in sorted(_global_names(fn.__code__)):
            if name not in g:
                continue
            v = g[name]
            if isinstance(v, _SIMPLE) or (isinstance(v, tuple) and all(isinstance(x, _SIMPLE) for x in v)):
                globs.append((name, v))
            elif getattr(v, "__module__", None) == fn.__module__ and (
                isinstance(v, (types.FunctionType, type)) or _looks_like_code(v)
            ):
                globs.append((name, _value_key(v, depth, seen)))
    parts.append(tuple(globs))
    return tuple(parts)


def _class_key(cls: type, depth: int, seen: set[int]) -> tuple:
    if cls.__module__ == "builtins" or depth > _MAX_DEPTH:
        return ("class", cls.__module__, cls.__qualname__)
    members = []
    for name, attr in sorted(vars(cls).items()):
        if isinstance(attr, (staticmethod, classmethod)):
            attr = attr.__func__
        if isinstance(attr, property):
            attr = attr.fget
        if isinstance(attr, types.FunctionType):
            if id(attr) in seen:
                continue
            seen.add(id(attr))
            members.append((name, _function_key(attr, depth + 1, seen)))
    bases = tuple(_class_key(b, depth + 1, seen) for b in cls.__bases__ if b is not object)
    return ("class", cls.__module__, cls.__qualname__, tuple(members), bases)


def _fingerprint(obj: Any, depth: int, seen: set[int]) -> Any:
    if depth > _MAX_DEPTH:
        return ("deep", getattr(obj, "__module__", None), getattr(obj, "__qualname__", type(obj).__qualname__))
    if id(obj) in seen and isinstance(obj, types.FunctionType):
        return ("recursive", obj.__qualname__)
    seen.add(id(obj))
    if isinstance(obj, functools.partial):
        return (
            "partial",
            _fingerprint(obj.func, depth + 1, seen),
            tuple(_value_key(a, depth, seen) for a in obj.args),
            tuple(sorted((k, _value_key(v, depth, seen)) for k, v in obj.keywords.items())),
        )
    if isinstance(obj, types.MethodType):
        return ("method", _fingerprint(obj.__func__, depth + 1, seen), _instance_key(obj.__self__, depth, seen))
    if isinstance(obj, types.FunctionType):
        return _function_key(obj, depth, seen)
    if isinstance(obj, (types.BuiltinFunctionType, types.BuiltinMethodType)) or inspect.ismethoddescriptor(obj):
        owner = getattr(obj, "__self__", None)
        owner_key = None if owner is None or isinstance(owner, types.ModuleType) else _instance_key(owner, depth, seen)
        return ("builtin", getattr(obj, "__module__", None), getattr(obj, "__qualname__", repr(obj)), owner_key)
    if isinstance(obj, type):
        return _class_key(obj, depth, seen)
    # a callable object (or an Aggregator): its class's code and its state
    return ("object", _class_key(type(obj), depth + 1, seen), _instance_key(obj, depth, seen))


def _instance_key(obj: Any, depth: int, seen: set[int]) -> Any:
    if isinstance(obj, type):
        return _class_key(obj, depth + 1, seen)
    if isinstance(obj, types.ModuleType):
        return ("module", obj.__name__)
    state = getattr(obj, "__dict__", None)
    if state is None:
        return _value_key(obj, depth, seen)
    return (
        type(obj).__qualname__,
        tuple(sorted((str(k), _value_key(v, depth + 1, seen)) for k, v in state.items())),
    )


def fingerprint(fn: Any) -> tuple[Any, str | None]:
    """A description of ``fn``'s code and bound state, and why it is unstable (or None)."""
    try:
        return _fingerprint(fn, 0, set()), None
    except _Unstable as e:
        return None, str(e)
    except RecursionError:
        return None, "its code refers to itself too deeply to fingerprint"


def callable_key(fn: Any) -> tuple[str, str | None]:
    """Hex key of ``fn``'s code; a one-off key and the reason when it cannot be stable."""
    import joblib

    fp, why = fingerprint(fn)
    if fp is None:
        return f"unstable-{uuid.uuid4().hex}", why
    return joblib.hash(fp), None


def _file_stamp(x: Any) -> Any:
    """(size, mtime) of a file an item names, so edited data invalidates the cache."""
    if isinstance(x, (str, os.PathLike)) and not isinstance(x, bytes):
        s = os.fspath(x)
        if 0 < len(s) < 4096 and "\n" not in s:
            try:
                st = os.stat(s)
            except (OSError, ValueError):
                return None
            return (st.st_size, st.st_mtime_ns)
    return None


def items_key(items: Sequence[Any]) -> tuple[str, str | None]:
    """Hex key of a list of (source) items; a one-off key and the reason if unhashable."""
    import joblib

    stamps = []
    for it in items:
        parts = it if isinstance(it, (tuple, list)) else (it,)
        stamps.append(tuple(_file_stamp(p) for p in parts[:8]))
    try:
        return joblib.hash(("items", list(items), stamps)), None
    except Exception as e:
        return f"unstable-{uuid.uuid4().hex}", f"the source items cannot be hashed ({type(e).__name__})"


def chain_key(*parts: Any) -> str:
    """Key of a stage from its parts; one-off (``unstable-``) when any part is.

    A key chained from a one-off key is never looked up again, so storing
    under it would only fill the cache folder run after run.
    """
    import joblib

    key = joblib.hash(("stagebench-stage", *parts))
    if any(isinstance(p, str) and p.startswith("unstable-") for p in parts):
        return f"unstable-{key}"
    return key


# ---------------------------------------------------------------------------- sizes
def approx_nbytes(obj: Any, _depth: int = 0) -> int:
    """Bytes an item holds: exact for arrays, tensors, bytes and images; pickled size otherwise.

    Arrays and tensors are measured without copying (pickling a decoded image
    only to learn its size would double the caching cost).
    """
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return len(obj)
    if isinstance(obj, str):
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


# ---------------------------------------------------------------------------- the cache
@dataclass(frozen=True, slots=True, kw_only=True)
class CachedOutputs:
    """Outputs of one stage and how they were obtained."""

    items: list
    key: str
    hit: bool
    """Loaded from the cache (the stage did not run)."""
    note: str | None = None
    """Why the outputs were not stored or not looked up, when that happened."""
    meta: dict | None = None
    """What the computation recorded (errors, dropped items), stored with the items."""


def _stored_call(key: str, compute: Callable[[], tuple[list, dict]]) -> tuple[list, dict]:
    """The function joblib.Memory caches: its result depends only on ``key``."""
    return compute()


class _NotStorable(Exception):
    """Outputs that pickle cannot write: raised through joblib so that it stores nothing."""

    def __init__(self, outputs: tuple[list, dict], why: str) -> None:
        super().__init__(why)
        self.outputs, self.why = outputs, why


class StageCache:
    """Stage outputs under ``folder`` (``None``: no disk cache, compute every time).

    ``max_disk_mb`` bounds the folder: least recently used entries are removed
    after each store (joblib's ``reduce_size``).
    """

    def __init__(self, folder: str | os.PathLike | None, *, max_disk_mb: float | None = None) -> None:
        self.folder = Path(folder) if folder is not None else None
        self.max_disk_mb = max_disk_mb
        self._cached = None
        if self.folder is not None:
            import joblib

            self._memory = joblib.Memory(str(self.folder), verbose=0)
            self._cached = self._memory.cache(_stored_call, ignore=["compute"])

    def get_or_compute(self, key: str, compute: Callable[[], tuple[list, dict]]) -> CachedOutputs:
        """Outputs for ``key``: from the cache when present, else ``compute()`` (then stored)."""
        if self._cached is None or key.startswith("unstable-"):
            items, meta = compute()
            return CachedOutputs(items=items, key=key, hit=False, meta=meta)
        try:
            hit = self._cached.check_call_in_cache(key, None)
        except Exception:
            hit = False
        if hit:
            try:
                items, meta = self._cached(key, None)
                return CachedOutputs(items=items, key=key, hit=True, meta=meta)
            except Exception as e:  # a corrupt entry: recompute it
                note = f"cache entry unreadable ({type(e).__name__}); recomputed"
                items, meta = compute()
                return CachedOutputs(items=items, key=key, hit=False, note=note, meta=meta)

        def storable() -> tuple[list, dict]:
            out = compute()
            # joblib would write a truncated output.pkl (then fail to load it on
            # the next run) or leave a temporary file behind
            why = pickle_problem(out)
            if why:
                raise _NotStorable(out, why)
            return out

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                items, meta = self._cached(key, storable)
            except _NotStorable as e:
                items, meta = e.outputs
                note = f"outputs not stored on disk: they cannot be pickled ({e.why}); recomputed every run"
                return CachedOutputs(items=items, key=key, hit=False, note=note, meta=meta)
        note = None
        for w in caught:
            if "cache" in str(w.message).lower():
                note = f"outputs not stored on disk: {str(w.message).splitlines()[0][:160]}"
        if self.max_disk_mb is not None:
            try:
                self._memory.reduce_size(bytes_limit=int(self.max_disk_mb * 2**20))
            except Exception:
                pass
        return CachedOutputs(items=items, key=key, hit=False, note=note, meta=meta)
