"""On-disk cache of each stage's outputs, keyed by the stage's code and its inputs.

Diagnosing a pipeline runs every stage once over the outputs of the stage
before it. Decoding a few hundred images is slow enough that re-running the
diagnosis after editing a *later* stage should not redo the earlier ones, so
each stage's outputs are stored in the user's own cache folder
(``$XDG_CACHE_HOME/stagebench``), signed with a per-user key so that nothing is
unpickled unless this user wrote it (:class:`StageCache`).

The key is the stage's fingerprint, computed here
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
import hashlib
import hmac
import inspect
import os
import pickle
import shutil
import sys
import sysconfig
import time
import types
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import joblib

from stagebench._memory import out_of_memory
from stagebench.core._pickling import pickle_problem
from stagebench.pipeline._first_pass import FirstPass

__all__ = [
    "StageCache",
    "CachedOutputs",
    "fingerprint",
    "callable_key",
    "items_key",
    "chain_key",
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
    if callable(value) and not isinstance(value, type):
        return _fingerprint(value, depth + 1, seen)
    if isinstance(value, type):
        return _class_key(value, depth + 1, seen)
    if isinstance(value, types.ModuleType):
        return _module_key(value.__name__)
    try:
        return ("value", type(value).__qualname__, joblib.hash(value))
    except Exception as e:  # unpicklable: a lock, an open file, a C handle
        raise _Unstable(f"cannot hash a {type(value).__name__} it refers to ({type(e).__name__})") from None


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
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
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
            elif isinstance(v, types.ModuleType):  # `helpers.resize(x)`: the user's module, by its source
                globs.append((name, _module_key(v.__name__)))
            elif callable(v) and (
                getattr(v, "__module__", None) == fn.__module__ or _user_source(getattr(v, "__module__", None))
            ):
                globs.append((name, _value_key(v, depth, seen)))
    parts.append(tuple(globs))
    return tuple(parts)


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    """Where the standard library and installed packages live: read once (asked for every module a key reaches)."""
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return tuple(os.path.realpath(d) + os.sep for d in dirs)


def _user_source(module: str | None) -> str | None:
    """The source file of ``module`` when it is the user's own (not the standard library or an
    installed package), else None: its code is part of what a stage does, and editing it must
    change the stage's key."""
    mod = sys.modules.get(module or "")
    path = getattr(mod, "__file__", None)
    if not path or not path.endswith(".py") or module in ("__main__", None):
        return None
    real = os.path.realpath(path)
    return None if real.startswith(_library_dirs()) else real


@functools.lru_cache(maxsize=256)
def _source_digest(path: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _module_key(name: str) -> tuple:
    """A module a stage uses: by name, and for the user's own modules also by the content of their source."""
    path = _user_source(name)
    if path is None:
        return ("module", name)
    try:
        st = os.stat(path)
        return ("module", name, _source_digest(path, st.st_mtime_ns, st.st_size))
    except OSError:
        raise _Unstable(f"cannot read the source of its module {name}") from None


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
        return _module_key(obj.__name__)
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
    stamps = []
    for it in items:
        parts = it if isinstance(it, (tuple, list)) else (it,)
        stamps.append(tuple(_file_stamp(p) for p in parts[:8]))
    try:
        return joblib.hash(("items", list(items), stamps)), None
    except Exception as e:
        return f"unstable-{uuid.uuid4().hex}", f"the source items cannot be hashed ({type(e).__name__})"


#: What a stored first pass holds: its fields (a field added since would be missing from an entry stored
#: before), and a tag for changes in what they mean (2: an aggregate's short last group is flushed only
#: where no whole one forms). An entry stored under another format is not looked up.
_FORMAT = ("stagebench-stage-2", tuple(f.name for f in fields(FirstPass)))


def chain_key(*parts: Any) -> str:
    """Key of a stage from its parts; one-off (``unstable-``) when any part is.

    A key chained from a one-off key is never looked up again, so storing
    under it would only fill the cache folder run after run.
    """
    key = joblib.hash((_FORMAT, *parts))
    if any(isinstance(p, str) and p.startswith("unstable-") for p in parts):
        return f"unstable-{key}"
    return key


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
    first: FirstPass
    """What the stage's first pass did (errors, dropped items, where it stopped), stored with the items."""


class CacheDirError(Exception):
    """A cache folder that is not safe to load pickles from (one line, naming it and why)."""


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/stagebench`` (``~/.cache/stagebench``): the user's own, never the run's parent.

    A folder beside the run directory (``/tmp/.stagebench-cache`` for ``--out /tmp/diag``) is one any
    local user can create first, and whatever pickle they leave there would run as the person diagnosing.
    """
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / "stagebench"


def cache_folder(setting: str | None) -> Path | None:
    """The folder STAGEBENCH_CACHE_DIR's ``setting`` names: None where it turns the cache off, else that
    folder, or :func:`default_cache_dir` where unset."""
    if (setting or "").lower() in ("off", "none", "0", "false", "no"):
        return None
    return Path(setting) if setting else default_cache_dir()


def private_dir(path: Path) -> Path:
    """Create ``path`` (mode 0700) or check an existing one: owned by this user, writable by no one else.

    :class:`CacheDirError` otherwise: a folder others can write is one they can plant pickles in.
    """
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
    except OSError as e:
        raise CacheDirError(f"cannot create the cache folder {str(path)!r}: {e.strerror or e}") from None
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise CacheDirError(
            f"the cache folder {str(path)!r} belongs to another user (uid {st.st_uid}): stagebench loads pickles "
            "only from a folder of your own; set STAGEBENCH_CACHE_DIR to one, or off"
        )
    if st.st_mode & 0o022:
        raise CacheDirError(
            f"the cache folder {str(path)!r} is writable by others (mode {st.st_mode & 0o777:o}): anyone could "
            f"plant a pickle there; chmod 700 it, or set STAGEBENCH_CACHE_DIR to a folder of your own, or off"
        )
    return path


_KEY_FILE = ".stagebench-key"


def _user_key(folder: Path) -> bytes:
    """The per-user secret that signs stored outputs, kept 0600 in the cache folder.

    Only a file signed with it is unpickled: a pickle copied in from elsewhere (another user's, an old
    run's from another machine) is recomputed, never loaded.
    """
    path = folder / _KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        st = path.stat()
        if (hasattr(os, "getuid") and st.st_uid != os.getuid()) or st.st_mode & 0o077:
            raise CacheDirError(
                f"{path}: the cache's signing key must belong to you and be readable by no one else (mode 600)"
            ) from None
        key = path.read_bytes()
        if len(key) < 32:  # another diagnosis may be writing it this instant: give it a moment
            time.sleep(0.2)
            key = path.read_bytes()
        if len(key) < 32:
            raise CacheDirError(f"{path}: damaged signing key; delete it (the cache is then rebuilt)") from None
        return key
    key = os.urandom(32)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


class StageCache:
    """Stage outputs under ``folder`` (``None``: no disk cache, compute every time).

    One entry per key: ``folder/<key>/output.pkl`` and its HMAC-SHA256 under the
    user's key (``output.mac``). A load reads the bytes, checks the MAC, and only
    then unpickles those same bytes; an entry whose MAC does not match is
    recomputed and replaced. ``max_disk_mb`` bounds the folder: least recently
    used entries are removed after each store. Not joblib.Memory: it unpickles
    whatever file it finds, with no way to check who wrote it.
    """

    def __init__(self, folder: str | os.PathLike | None, *, max_disk_mb: float | None = None) -> None:
        self.folder = private_dir(Path(folder)) if folder is not None else None
        self.max_disk_mb = max_disk_mb
        self._key = _user_key(self.folder) if self.folder is not None else b""

    def _paths(self, key: str) -> tuple[Path, Path, Path]:
        assert self.folder is not None
        entry = self.folder / hashlib.sha256(key.encode()).hexdigest()[:40]
        return entry, entry / "output.pkl", entry / "output.mac"

    def _mac(self, data: bytes) -> bytes:
        return hmac.new(self._key, data, hashlib.sha256).digest()

    def _load(self, key: str) -> tuple[list, FirstPass] | None:
        """The stored outputs, or None: missing, or not signed by this user (then removed)."""
        entry, pkl, mac = self._paths(key)
        try:
            data, sig = pkl.read_bytes(), mac.read_bytes()
        except OSError:
            return None
        if not hmac.compare_digest(sig, self._mac(data)):
            shutil.rmtree(entry, ignore_errors=True)
            raise _Unsigned(f"cache entry not signed by you ({pkl}); removed and recomputed")
        os.utime(entry)  # recently used: kept longest by the size bound
        return pickle.loads(data)

    def _store(self, key: str, outputs: tuple[list, FirstPass]) -> None:
        entry, pkl, mac = self._paths(key)
        data = pickle.dumps(outputs, protocol=pickle.HIGHEST_PROTOCOL)
        entry.mkdir(mode=0o700, exist_ok=True)
        for path, blob in ((pkl, data), (mac, self._mac(data))):
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(blob)
            os.replace(tmp, path)  # a reader sees the whole file or none
        if self.max_disk_mb is not None:
            self._reduce(int(self.max_disk_mb * 2**20))

    def _reduce(self, limit: int) -> None:
        assert self.folder is not None
        entries = []
        for d in self.folder.iterdir():
            if d.is_dir():
                size = sum(f.stat().st_size for f in d.iterdir() if f.is_file())
                entries.append((d.stat().st_mtime, size, d))
        total = sum(e[1] for e in entries)
        for _, size, d in sorted(entries, key=lambda e: e[0]):  # least recently used first
            if total <= limit:
                break
            shutil.rmtree(d, ignore_errors=True)
            total -= size

    def get_or_compute(
        self,
        key: str,
        compute: Callable[[], tuple[list, FirstPass]],
        *,
        not_kept: Callable[[FirstPass], str | None] = lambda first: None,
    ) -> CachedOutputs:
        """Outputs for ``key``: from the cache when present, else ``compute()``, then stored unless
        ``not_kept(first)`` says why not (a computation that failed or timed out: the next run computes
        them again)."""
        if self.folder is None or key.startswith("unstable-"):
            items, first = compute()
            return CachedOutputs(items=items, key=key, hit=False, first=first)
        note = None
        try:
            found = self._load(key)
        except _Unsigned as e:
            found, note = None, str(e)
        except Exception as e:  # a corrupt entry: recompute it
            found, note = None, f"cache entry unreadable ({type(e).__name__}); recomputed"
        if found is not None:
            return CachedOutputs(items=found[0], key=key, hit=True, first=found[1])
        out = compute()
        failed = not_kept(out[1])
        if failed:
            note = f"outputs not stored on disk: {failed}; the next run runs it again"
            return CachedOutputs(items=out[0], key=key, hit=False, first=out[1], note=note)
        try:
            why = pickle_problem(out)
            if why:
                note = f"outputs not stored on disk: they cannot be pickled ({why}); recomputed every run"
            else:
                self._store(key, out)
        except Exception as e:  # a full disk, or no memory left to pickle them: they are used, not kept
            what = out_of_memory(e)
            if what:
                note = f"outputs not stored on disk: out of memory ({what})"
            elif isinstance(e, OSError):
                note = f"outputs not stored on disk: {e.strerror or e}"
            else:
                raise
        return CachedOutputs(items=out[0], key=key, hit=False, note=note, first=out[1])


class _Unsigned(Exception):
    """A stored entry whose MAC does not match: not written by this user with this key."""
