"""The stage-output cache: keys follow the stage's code and inputs, and nothing else."""

from __future__ import annotations

import functools
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from stagebench.core._pickling import pickle_problem
from stagebench.core._sizes import approx_nbytes
from stagebench.pipeline._first_pass import FirstPass
from stagebench.pipeline._stage_cache import (
    CacheDirError,
    StageCache,
    callable_key,
    chain_key,
    default_cache_dir,
    items_key,
)

#: a first pass that ran every input: what a cache entry stores beside its items
_DONE = FirstPass(n_inputs=1, n_run=1)


def _define(src: str, name: str = "stage", extra: dict | None = None):
    """A function defined from source, as a user's module would define it."""
    ns: dict = {"__name__": "user_module", **(extra or {})}
    exec(textwrap.dedent(src), ns)
    return ns[name]


def key(fn) -> str:
    k, why = callable_key(fn)
    assert why is None, why
    return k


def test_same_code_same_key_and_edits_change_it():
    a = _define("def stage(x):\n    return x + 1\n")
    b = _define("def stage(x):\n    return x + 1\n")
    c = _define("def stage(x):\n    return x + 2\n")  # a constant changed
    d = _define("def stage(x):\n    return abs(x) + 1\n")  # a name changed
    assert key(a) == key(b)
    assert key(a) != key(c)
    assert key(a) != key(d)


def test_closure_values_defaults_and_partial_args_are_part_of_the_key():
    make = _define("def make(k):\n    def stage(x):\n        return x * k\n    return stage\n", "make")
    assert key(make(2)) == key(make(2))
    assert key(make(2)) != key(make(3))
    f = _define("def stage(x, scale=1.0):\n    return x * scale\n")
    g = _define("def stage(x, scale=2.0):\n    return x * scale\n")
    assert key(f) != key(g)
    assert key(functools.partial(f, scale=2)) != key(functools.partial(f, scale=3))
    assert key(functools.partial(f, scale=2)) == key(functools.partial(f, scale=2))


def test_editing_a_helper_the_stage_calls_changes_the_key():
    src = "def helper(x):\n    return x {op} 1\n\ndef stage(x):\n    return helper(x)\n"
    assert key(_define(src.format(op="+"))) == key(_define(src.format(op="+")))
    assert key(_define(src.format(op="+"))) != key(_define(src.format(op="-")))
    # a module-level constant it reads, too
    const = "SIZE = {n}\n\ndef stage(x):\n    return x[:SIZE]\n"
    assert key(_define(const.format(n=3))) != key(_define(const.format(n=4)))


def test_callable_objects_key_on_class_code_and_state():
    cls_src = "class Resize:\n    def __init__(self, n):\n        self.n = n\n    def __call__(self, x):\n        return x[: self.n]\n"
    Resize = _define(cls_src, "Resize")
    Resize2 = _define(cls_src.replace("x[: self.n]", "x[self.n :]"), "Resize")
    assert key(Resize(3)) == key(Resize(3))
    assert key(Resize(3)) != key(Resize(4))
    assert key(Resize(3)) != key(Resize2(3))


def test_an_unhashable_closure_gives_a_one_off_key_and_says_why():
    lock = threading.Lock()
    make = _define(
        "def make(lock):\n    def stage(x):\n        with lock:\n            return x\n    return stage\n", "make"
    )
    k1, why = callable_key(make(lock))
    k2, _ = callable_key(make(lock))
    assert k1.startswith("unstable-") and k1 != k2
    assert "lock" in why.lower()


def test_keys_are_stable_across_processes_with_different_hash_seeds(tmp_path):
    script = tmp_path / "k.py"
    script.write_text(
        textwrap.dedent("""
        from stagebench.pipeline._stage_cache import callable_key
        def stage(x):
            if x in {"jpeg", "png", "webp", "gif"}:
                return {"kind": x, "n": len(x)}
            return None
        print(callable_key(stage)[0])
    """)
    )
    keys = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        keys.add(
            subprocess.run(
                [sys.executable, str(script)], env=env, capture_output=True, text=True, check=True
            ).stdout.strip()
        )
    assert len(keys) == 1


def test_items_key_follows_content_and_the_files_items_name(tmp_path):
    f = tmp_path / "a.bin"
    f.write_bytes(b"1234")
    k1 = items_key([str(f), 1])[0]
    assert items_key([str(f), 1])[0] == k1
    assert items_key([str(f), 2])[0] != k1
    time.sleep(0.01)
    f.write_bytes(b"123456")  # edited data: what was read from it is stale
    assert items_key([str(f), 1])[0] != k1


def test_cache_computes_once_then_hits(tmp_path):
    cache = StageCache(tmp_path / "c")
    calls = []

    def compute():
        calls.append(1)
        return [1, 2, 3], FirstPass(n_inputs=3, n_run=3)

    first = cache.get_or_compute("k1", compute)
    second = cache.get_or_compute("k1", compute)
    assert (first.hit, second.hit) == (False, True)
    assert second.items == [1, 2, 3] and second.first == FirstPass(n_inputs=3, n_run=3)
    assert len(calls) == 1
    # a fresh cache object on the same folder (the next run) hits too
    assert StageCache(tmp_path / "c").get_or_compute("k1", compute).hit
    assert len(calls) == 1


def test_outputs_of_a_computation_that_failed_or_timed_out_are_used_but_never_stored(tmp_path):
    """Issue 59: a stage that timed out had its 0 outputs cached, and the next run reused them instead of running
    it again. What ``not_kept`` refuses is handed over, said, and computed again by the next run."""
    calls = []

    def compute():
        calls.append(1)
        return [], FirstPass(n_inputs=3, n_run=0, stalled=True)

    def timed_out(first):
        return "it timed out" if first.stalled else None

    for run in range(2):  # the next run (a fresh cache object on the same folder) runs it again
        out = StageCache(tmp_path / "c").get_or_compute("k", compute, not_kept=timed_out)
        assert not out.hit and out.items == [] and out.first == FirstPass(n_inputs=3, n_run=0, stalled=True)
        assert out.note == "outputs not stored on disk: it timed out; the next run runs it again"
    assert len(calls) == 2 and not list((tmp_path / "c").rglob("output.pkl*"))
    # once it finishes, it is stored and served
    fine = StageCache(tmp_path / "c").get_or_compute("k", lambda: ([1], _DONE), not_kept=timed_out)
    assert not fine.hit and fine.note is None
    assert StageCache(tmp_path / "c").get_or_compute("k", compute, not_kept=timed_out).hit


def test_outputs_that_there_is_no_memory_to_pickle_are_used_and_said_not_stored(tmp_path, monkeypatch):
    """Running out of memory while storing is not "cannot be pickled": the outputs are fine, the process is short."""
    from stagebench.pipeline import _stage_cache

    def no_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(_stage_cache.pickle, "dumps", no_memory)
    out = StageCache(tmp_path / "c").get_or_compute("k", lambda: ([1, 2], _DONE))
    assert out.items == [1, 2] and not out.hit
    assert out.note == "outputs not stored on disk: out of memory (MemoryError)"


def test_editing_a_later_stage_keeps_earlier_entries(tmp_path):
    """Chained keys: stage 2's edit changes key 2 only; stage 1 is served from the cache."""
    cache = StageCache(tmp_path / "c")
    s1 = _define("def stage(x):\n    return x * 2\n")
    s2_old = _define("def stage(x):\n    return x + 1\n")
    s2_new = _define("def stage(x):\n    return x + 100\n")
    src_key = items_key([1, 2, 3])[0]
    ran = []

    def run(s2):
        k1 = chain_key(key(s1), src_key)
        out1 = cache.get_or_compute(k1, lambda: (ran.append("s1") or [s1(x) for x in [1, 2, 3]], _DONE))
        k2 = chain_key(key(s2), k1)
        out2 = cache.get_or_compute(k2, lambda: (ran.append("s2") or [s2(x) for x in out1.items], _DONE))
        return out2.items

    assert run(s2_old) == [3, 5, 7]
    assert run(s2_new) == [102, 104, 106]
    assert ran == ["s1", "s2", "s2"]


def test_no_folder_means_no_disk_cache():
    cache = StageCache(None)
    calls = []
    for _ in range(2):
        out = cache.get_or_compute("k", lambda: (calls.append(1) or [1], _DONE))
        assert not out.hit
    assert len(calls) == 2


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (threading.Lock, "TypeError: cannot pickle '_thread.lock' object"),
        (lambda: lambda: 1, "Can't pickle"),  # pickle raises here, mid-file: joblib used to keep the truncated file
    ],
)
def test_outputs_that_cannot_be_pickled_are_used_but_not_stored(tmp_path, make, says):
    cache = StageCache(tmp_path / "c")
    for _ in range(2):  # the second run recomputes with the same message: no broken entry to load
        out = cache.get_or_compute("k", lambda: ([1, make()], FirstPass(n_inputs=3, n_run=3)))
        assert len(out.items) == 2 and not out.hit and out.first == FirstPass(n_inputs=3, n_run=3)
        assert out.note.startswith("outputs not stored on disk: they cannot be pickled (") and says in out.note
    assert not [f for f in (tmp_path / "c").rglob("output.pkl*")]


def test_a_key_chained_from_a_one_off_key_is_one_off(tmp_path):
    stable = chain_key("pipe", items_key([1, 2])[0])
    assert not stable.startswith("unstable-") and stable == chain_key("pipe", items_key([1, 2])[0])
    one_off, why = items_key([threading.Lock()])
    assert one_off.startswith("unstable-") and "cannot be hashed" in why
    assert chain_key("pipe", one_off).startswith("unstable-")
    cache = StageCache(tmp_path / "c")
    cache.get_or_compute(chain_key("pipe", one_off), lambda: ([1], _DONE))
    assert not [f for f in (tmp_path / "c").rglob("output.pkl*")]  # never looked up again: not stored


def test_pickle_problem_names_the_error_and_the_pickler_matters():
    assert pickle_problem([1, np.zeros(10)]) is None
    assert pickle_problem([1, threading.Lock()]) == "TypeError: cannot pickle '_thread.lock' object"
    gen = (i for i in range(3))
    assert pickle_problem([gen], cloud=True) == "TypeError: cannot pickle 'generator' object"
    assert pickle_problem([lambda: 1]) is not None and pickle_problem([lambda: 1], cloud=True) is None


def test_approx_nbytes_is_exact_for_arrays_and_bytes():
    assert approx_nbytes(np.zeros((10, 20, 3), dtype=np.uint8)) == 600
    assert approx_nbytes(b"x" * 1000) == 1000
    assert approx_nbytes([np.zeros(100, dtype=np.float32)] * 4) == 64 + 4 * 400
    assert approx_nbytes({"a": b"xy"}) == 64 + 1 + 2
    pytest.importorskip("PIL")
    from PIL import Image

    assert approx_nbytes(Image.new("RGB", (10, 10))) == 300


# ------------------------------------------------------------------------- safety of the cache
class _Planted:
    """What an attacker's pickle does when it is loaded: run code (here: leave a mark)."""

    def __init__(self, mark: str) -> None:
        self.mark = mark

    def __reduce__(self):
        return (open, (self.mark, "w"))


def test_a_pickle_planted_in_the_cache_is_never_loaded(tmp_path):
    cache = StageCache(tmp_path / "c")
    cache.get_or_compute("k", lambda: ([1, 2], _DONE))
    (pkl,) = (tmp_path / "c").rglob("output.pkl")
    mark = tmp_path / "pwned"
    pkl.write_bytes(pickle.dumps(([_Planted(str(mark))], _DONE)))  # another user's file, without the key
    out = StageCache(tmp_path / "c").get_or_compute("k", lambda: ([1, 2], _DONE))
    assert not mark.exists(), "a pickle this user did not sign was loaded"
    assert not out.hit and out.items == [1, 2] and "not signed" in out.note


def test_a_cache_folder_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(CacheDirError, match="writable by others"):
        StageCache(shared)


def test_a_cache_folder_of_another_user_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: folder.stat().st_uid + 1)  # we are someone else
    with pytest.raises(CacheDirError, match="belongs to another user"):
        StageCache(folder)


def test_the_default_cache_is_the_users_own_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "stagebench"
    StageCache(default_cache_dir())
    assert (tmp_path / "xdg" / "stagebench").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "xdg" / "stagebench" / ".stagebench-key").stat().st_mode & 0o777 == 0o600


def test_editing_a_helper_in_another_user_module_changes_the_key(tmp_path):
    """A stage that calls `helpers.resize` or a function imported from the user's own module:
    editing that module (the next run sees the new code) must not serve the old outputs."""
    (tmp_path / "helpers.py").write_text("def resize(x):\n    return x * 2\n\ndef scale(x):\n    return x + 1\n")
    (tmp_path / "stages.py").write_text(
        "import helpers\nfrom helpers import scale\n\n"
        "def by_module(x):\n    return helpers.resize(x)\n\n"
        "def by_name(x):\n    return scale(x)\n"
    )
    code = (
        "import stages\nfrom stagebench.pipeline._stage_cache import callable_key\n"
        "print(callable_key(stages.by_module)[0], callable_key(stages.by_name)[0])\n"
    )

    def keys() -> list[str]:
        r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
        return r.stdout.split()

    before = keys()
    assert keys() == before  # stable while nothing changes
    (tmp_path / "helpers.py").write_text("def resize(x):\n    return x * 3\n\ndef scale(x):\n    return x + 2\n")
    after = keys()
    assert after[0] != before[0] and after[1] != before[1]
