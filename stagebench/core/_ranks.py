"""The ranks of one host, joined through torch.distributed's stores: how they meet, talk, and part.

A data-parallel job's ranks share the host's cores, so they are measured together: local rank 0 (the
*leader*) runs the diagnosis and says, command by command, what every other rank (a *follower*) runs
at the same time; the followers answer with what they measured. This module is the channel; what is
said over it belongs to each kind of run (:mod:`stagebench.loader._follow`, :mod:`stagebench.job._lockstep`).

Why torch's stores and not a protocol of our own: they are what a torchrun job already uses to meet,
and they work whether or not the script started a process group, with any backend. The ranks meet in a
``FileStore`` (no port to agree on: the ranks of one host share its file system), whose file lives in a
directory only this user can write, named by what the ranks of one launch share (the launcher that
started them, torchrun's run id and restart count, the host's index), so two launches never meet and no
other user can speak in one. The leader then serves a ``TCPStore`` on the loopback interface, whose port
it leaves in the file: the talk itself goes there (a TCP store keeps keys in memory, where every write to
a file store is appended to its file). Everything said is JSON: nothing a rank reads is unpickled.

Bounded failure: every rank beats every second from a thread of its own; the leader reads its
followers' processes and beats, the followers the leader's, and a rank that ended, stopped beating for
:data:`LOST_AFTER_S`, or never arrived within the wait ends the others with :class:`RankLost` (a
``KeyboardInterrupt``, so whatever keeps the rows on Ctrl-C keeps them here too). The keys:

* ``hello/<r>``: each rank's pid and kind of run, as it arrives (the file store);
* ``port``: the leader's TCP store, and ``ready``: every rank arrived (the file store);
* ``cmd/<n>``: the leader's commands, in order;
* ``st/<r>``: the last step a follower reached, rewritten as it moves on; ``re/<n>/<r>``: its reply to command n;
* ``beat/<r>``: each rank's last beat (wall clock); ``bye/<r>``: a follower read the last command, ``end``
  (the exit code every rank ends with).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil

from stagebench._errors import RankLost, StagebenchError
from stagebench._settings import SettingsError, read_env, setting
from stagebench._signals import ignore_sigterm
from stagebench.model._ranks import Answer, Command, Ranks
from stagebench.runs._outcome import BAD_INPUT, RANK_LOST
from stagebench.runs._ranks import ranks_from_env

__all__ = ["HostGroup", "RankLost", "LOST_AFTER_S", "POLL_S", "leading", "lead", "alone", "store_dir", "meet"]

#: A rank that has not beaten for this long is lost (a hung process, or one stopped by a debugger).
LOST_AFTER_S = 30.0
#: Seconds between two looks at the store while waiting (a look at a TCP store costs ~50 us).
POLL_S = 0.002
_BEAT_S = 1.0
#: The longest a store operation waits for the leader's TCP store before the leader counts as lost.
_STORE_TIMEOUT_S = 60.0


def store_dir() -> Path:
    """The directory the ranks meet in: ``<tmp>/stagebench-<uid>``, made by and only writable by this user.

    Refused (a :class:`StagebenchError`) where it exists and someone else owns it or may write it: another
    user who could write there could speak in a job's store."""
    d = Path(tempfile.gettempdir()) / f"stagebench-{os.getuid()}"
    try:
        d.mkdir(mode=0o700, exist_ok=True)
        st = d.lstat()
    except OSError as e:
        raise StagebenchError(f"the ranks cannot meet: {d}: {e.strerror or e}") from None
    if not d.is_dir() or d.is_symlink() or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise StagebenchError(
            f"the ranks cannot meet: {d} must be a directory of this user's that no one else may write "
            "(remove it, or set TMPDIR)"
        )
    return d


def _started(pid: int) -> str:
    """When process ``pid`` started, in clock ticks since boot (empty where /proc cannot say): with the
    pid, it names one process for as long as the host is up."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


#: What the ranks of one launch on one host share, besides their launcher's process.
_LAUNCH_VARIABLES = (
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "LOCAL_WORLD_SIZE",
)


def _store_path(environ: Mapping[str, str]) -> Path:
    parent = os.getppid()
    launch = [str(parent), _started(parent), *(f"{k}={environ.get(k, '')}" for k in _LAUNCH_VARIABLES)]
    name = hashlib.sha256("\0".join(launch).encode()).hexdigest()[:24]
    return store_dir() / f"ranks-{name}.store"


def _pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class HostGroup:
    """This host's ranks, met (:meth:`join`); the leader's side and the followers' side of the talk."""

    def __init__(
        self, ranks: Ranks, store: Any, path: Path, pids: dict[int, int], *, files: Any = None, server: Any = None
    ) -> None:
        self.ranks = ranks
        self.rank = ranks.local_rank
        self.size = ranks.local_world_size
        self.leader = ranks.leader
        self.followers = tuple(range(1, self.size))
        self.pids = pids  # local rank -> pid, as each said at its hello
        self._store = store
        self._server = server  # the leader's TCP store: it must live as long as the talk
        self._files = files  # the file store the ranks met in
        self._path = path
        self._lock = threading.Lock()
        self._sent = 0  # the leader: commands sent
        self._read = 0  # a follower: commands read
        self._ended = False
        self._beating = threading.Event()
        self._beater: threading.Thread | None = None

    # ------------------------------------------------------------------ meeting
    @classmethod
    def join(
        cls,
        ranks: Ranks,
        *,
        kind: str,
        wait_s: float,
        environ: Mapping[str, str] | None = None,
        say: Callable[[str], None] | None = None,
    ) -> HostGroup:
        """Meet this host's other ranks (each calls it: the leader serves, the followers connect).

        ``kind``: what this rank caught (``loader``, ``pipeline``); the ranks must agree. Waits at most
        ``wait_s`` for the others (:class:`RankLost` after it); :class:`StagebenchError` where they cannot
        meet at all (no torch.distributed, the store's directory unsafe)."""
        # torch loads only where ranks meet: one process of one rank never pays for it
        import torch.distributed as dist

        if not dist.is_available():
            raise StagebenchError("this torch has no torch.distributed: the ranks of a host cannot meet")
        path = _store_path(os.environ if environ is None else environ)
        timeout = _dt.timedelta(seconds=max(wait_s, _STORE_TIMEOUT_S))
        files = dist.FileStore(str(path), ranks.local_world_size)
        files.set_timeout(timeout)
        files.set(f"hello/{ranks.local_rank}", json.dumps({"pid": os.getpid(), "kind": kind}))
        end = time.monotonic() + wait_s
        if ranks.leader:
            server = dist.TCPStore(
                "127.0.0.1", 0, ranks.local_world_size, True, timeout=timeout, wait_for_workers=False
            )
            files.set("port", str(server.port))
            keys = [f"hello/{r}" for r in range(ranks.local_world_size)]
            said = False
            while not files.check(keys):
                if time.monotonic() > end:
                    missing = [r for r in range(1, ranks.local_world_size) if not files.check([f"hello/{r}"])]
                    raise RankLost(
                        f"local rank(s) {', '.join(map(str, missing))} of {ranks.local_world_size} did not reach "
                        f"their loader or pipeline within {wait_s:g} s (STAGEBENCH_RANK_WAIT_S)"
                    )
                if not said and say is not None and time.monotonic() > end - wait_s + 2:
                    say(f"waiting for the host's other {ranks.local_world_size - 1} rank(s) to reach theirs")
                    said = True
                time.sleep(0.01)
            files.set("ready", "1")
            store: Any = dist.TCPStore("127.0.0.1", server.port, ranks.local_world_size, False, timeout=timeout)
        else:
            server = None
            while not files.check(["ready"]):
                if time.monotonic() > end:
                    raise RankLost(
                        f"the host's ranks did not all reach their loader or pipeline within {wait_s:g} s "
                        "(STAGEBENCH_RANK_WAIT_S)"
                    )
                time.sleep(0.01)
            store = dist.TCPStore("127.0.0.1", int(files.get("port")), ranks.local_world_size, False, timeout=timeout)
        hellos = {r: json.loads(files.get(f"hello/{r}")) for r in range(ranks.local_world_size)}
        kinds = {h.get("kind") for h in hellos.values()}
        group = cls(ranks, store, path, {r: int(h["pid"]) for r, h in hellos.items()}, files=files, server=server)
        if len(kinds) > 1:
            described = ", ".join(f"rank {r}: {h.get('kind')}" for r, h in sorted(hellos.items()))
            raise StagebenchError(f"the host's ranks iterate different things ({described}): none is diagnosed")
        group._start_beating(timeout)
        return group

    def _start_beating(self, timeout: _dt.timedelta) -> None:
        """A thread that beats every second on a store connection of its own (``beat/<rank>``)."""
        # torch loads only where ranks meet: one process of one rank never pays for it
        import torch.distributed as dist

        port = self._server.port if self._server is not None else self._store.port
        own = dist.TCPStore("127.0.0.1", int(port), self.size, False, timeout=timeout)

        def beat() -> None:
            while not self._beating.wait(_BEAT_S):
                try:
                    own.set(f"beat/{self.rank}", repr(time.time()))
                except Exception:  # the leader's store is gone: the main thread finds out and says so
                    return

        own.set(f"beat/{self.rank}", repr(time.time()))
        self._beater = threading.Thread(target=beat, name="stagebench-rank-beat", daemon=True)
        self._beater.start()

    # ------------------------------------------------------------------ both sides
    def _get(self, key: str) -> str | None:
        """The value at ``key``, None where it is not set; :class:`RankLost` where the store is gone."""
        try:
            with self._lock:
                if not self._store.check([key]):
                    return None
                return self._store.get(key).decode()
        except RankLost:
            raise
        except Exception as e:
            raise self._lost_store(e) from None

    def _set(self, key: str, value: str) -> None:
        try:
            with self._lock:
                self._store.set(key, value)
        except Exception as e:
            raise self._lost_store(e) from None

    def _lost_store(self, e: BaseException) -> RankLost:
        if self.leader:
            return RankLost(f"the ranks' store failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        return RankLost(f"local rank 0 (pid {self.pids.get(0)}) ended: its store is gone")

    def lost(self) -> str | None:
        """Why a rank this one waits on is lost (ended, or silent for :data:`LOST_AFTER_S`), else None."""
        others = self.followers if self.leader else (0,)
        now = time.time()
        for r in others:
            pid = self.pids.get(r)
            if pid is not None and not _pid_alive(pid):
                return f"local rank {r} (pid {pid}) ended"
            beat = self._get(f"beat/{r}")
            if beat is not None and now - float(beat) > LOST_AFTER_S:
                return f"local rank {r} (pid {pid}) stopped answering for {now - float(beat):.0f} s"
        return None

    def check(self) -> None:
        """:class:`RankLost` where a rank this one waits on is lost."""
        why = self.lost()
        if why is not None:
            raise RankLost(why)

    def wait_until(self, ready: Callable[[], bool], deadline: float, what: str) -> None:
        """Poll ``ready()`` until it holds; :class:`RankLost` where a rank is lost or ``deadline``
        (``time.perf_counter()``) passes first (``what``: the line then says what was awaited)."""
        last_check = 0.0
        while not ready():
            now = time.perf_counter()
            if now - last_check > 0.25:
                self.check()
                last_check = now
            if now > deadline:
                raise RankLost(f"the host's ranks did not {what} in time")
            time.sleep(POLL_S)

    # ------------------------------------------------------------------ the leader
    def send(self, op: str, **args: Any) -> int:
        """The leader: command ``op`` to every follower (``args``: its fields of :class:`Command`); returns
        its number (its replies' key)."""
        n = self._sent
        self._set(f"cmd/{n}", json.dumps(Command(op=op, n=n, **args).to_json()))
        self._sent += 1
        return n

    def reached(self, rank: int) -> int:
        """The leader: the last step follower ``rank`` reached (-1 before it said any)."""
        raw = self._get(f"st/{rank}")
        return int(json.loads(raw).get("at", -1)) if raw else -1

    def replies(self, n: int, deadline: float) -> dict[int, Answer]:
        """The leader: every follower's reply to command ``n``, by rank (:meth:`wait_until`'s rules)."""
        got: dict[int, Answer] = {}

        def ready() -> bool:
            got.update(self.answers(n, skip=got))
            return len(got) == len(self.followers)

        self.wait_until(ready, deadline, "answer")
        return got

    def answers(self, n: int, skip: Collection[int] = ()) -> dict[int, Answer]:
        """The leader: the followers' replies to command ``n`` so far, by rank (it does not wait); ranks in
        ``skip`` are not read."""
        got: dict[int, Answer] = {}
        for r in self.followers:
            raw = None if r in skip else self._get(f"re/{n}/{r}")
            if raw is not None:
                got[r] = Answer.from_json(json.loads(raw))
        return got

    def end(self, code: int, wait_s: float = 10.0) -> None:
        """The leader: tell every follower the exit code (the last command) and wait, at most ``wait_s``,
        until each read it, then part. Never raises: it runs on the way out, whatever ended the run."""
        if self._ended:
            return
        self._ended = True
        ignore_sigterm()  # leaving with this code, whatever torch's launcher does to the last ranks
        try:
            self.send("end", code=int(code))
            until = time.monotonic() + wait_s
            while time.monotonic() < until:
                if all(self._get(f"bye/{r}") is not None or not _pid_alive(self.pids[r]) for r in self.followers):
                    break
                time.sleep(0.01)
        except BaseException:
            pass
        self.close()

    # ------------------------------------------------------------------ a follower
    def pending(self) -> bool:
        """A follower: whether the leader's next command is waiting (it is not read)."""
        return self._get(f"cmd/{self._read}") is not None

    def wait_command(self) -> Command:
        """A follower: the leader's next command, waited for (the store wakes it as it is set): for the
        job phase, where each step waits for the leader's word. :class:`RankLost` where the leader ended,
        or stopped beating; a leader that is only quiet (a slow start-up) is waited for."""
        key = f"cmd/{self._read}"
        while True:
            try:
                raw = self._store.get(key)  # at most the store's timeout; the leader's store gone: at once
                break
            except Exception as e:
                why = self.lost()
                if why is not None:
                    raise RankLost(why) from None
                if not _pid_alive(self.pids[0]):
                    raise self._lost_store(e) from None
        self._read += 1
        return Command.from_json(json.loads(raw.decode()))

    def reach(self, step: int) -> None:
        """A follower: the step it reached, for the leader to read (:meth:`reached`)."""
        self._set(f"st/{self.rank}", json.dumps({"at": int(step)}))

    def reply(self, n: int, answer: Answer) -> None:
        """A follower: its answer to command ``n``."""
        self._set(f"re/{n}/{self.rank}", json.dumps(answer.to_json()))

    def bye(self) -> None:
        """A follower: it read the end; the leader may close the store."""
        try:
            self._set(f"bye/{self.rank}", "1")
        except BaseException:
            pass
        self.close()

    def close(self) -> None:
        """Stop beating and let go of the stores; the leader removes the meeting's file. Never raises."""
        self._beating.set()
        self._files = None
        if self.leader:
            try:
                self._path.unlink()
            except OSError:
                pass


#: The group the running diagnosis leads, where its host runs more than one rank (:func:`lead`); None on
#: top while the leader measures alone (:class:`alone`).
_LEADING: list[HostGroup | None] = []


def leading() -> HostGroup | None:
    """The host's group where this process leads a ranked diagnosis now, else None."""
    return _LEADING[-1] if _LEADING else None


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """While the block runs, :func:`leading` is None: what the leader measures there, the other ranks do
    not run (they wait for its next command)."""
    _LEADING.append(None)
    try:
        yield
    finally:
        _LEADING.pop()


@contextlib.contextmanager
def lead(group: HostGroup | None) -> Iterator[HostGroup | None]:
    """While the block runs, :func:`leading` is ``group`` (None: nothing changes)."""
    if group is not None:
        _LEADING.append(group)
    try:
        yield group
    finally:
        if group is not None:
            _LEADING.remove(group)


def meet(kind: str, say: Callable[[str], None], environ: Mapping[str, str] | None = None) -> HostGroup | None:
    """This host's ranks met, where the launcher started more than one (None: one rank, nothing to meet).

    Ends the program with one line where they cannot meet: a bad rank variable or setting (exit 2), a
    store that cannot be made (exit 2), a rank that never arrived (:data:`stagebench.runs._outcome.RANK_LOST`'s
    code). Every rank calls it where it catches its loader or pipeline, before anything is measured."""
    env = os.environ if environ is None else environ
    try:
        ranks = ranks_from_env(env)
        wait_s = float(read_env(env).get("rank_wait_s", setting("rank_wait_s").default))
    except SettingsError as e:
        say(f"error: {e}")
        raise SystemExit(BAD_INPUT.exit_code) from None
    if not ranks.ranked:
        return None
    try:
        return HostGroup.join(ranks, kind=kind, wait_s=wait_s, environ=env, say=say)
    except RankLost as e:
        say(f"local rank {ranks.local_rank}: {e}")
        raise SystemExit(RANK_LOST.exit_code) from None
    except StagebenchError as e:
        say(f"error: {e}")
        raise SystemExit(BAD_INPUT.exit_code) from None
