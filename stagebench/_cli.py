"""The ``stagebench`` command: thin wrappers over plain functions.

Each subcommand parses its arguments and calls one ``run``-style function that
tests call directly (argv is injected, nothing reads ``sys.argv`` here except
the default). User errors (a missing script, an unwritable directory, a bad
option) print one line and exit 2; no tracebacks for them.

Subcommands:
  demo      the built-in example: diagnose a bundled SPDL pipeline on generated data
  diagnose  run an unmodified script in diagnostic mode
  report    rebuild summary.json and report.html from a run (or sweep) directory
  compare   compare run directories side by side
  sweep     the Hydra sweep app (all Hydra flags pass through)
  data      generate the built-in ImageNet-style dataset
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

from stagebench._errors import StagebenchError
from stagebench._settings import env_help
from stagebench.runs._outcome import INTERNAL, PARTIAL
from stagebench.runs._results import UnwritableOutputError

__all__ = ["main", "console", "StagebenchError"]


def _fail(msg: str, code: int = 2) -> int:
    print(f"stagebench: error: {msg}", file=sys.stderr)
    return code


def _cmd_demo(ns: argparse.Namespace) -> int:
    # each command imports what it runs: `stagebench --help` loads none of them
    from stagebench.pipeline._demo import run_demo

    return run_demo(out=ns.out, quick=ns.quick)


def _cmd_diagnose(ns: argparse.Namespace) -> int:
    # each command imports what it runs: `stagebench --help` loads none of them
    from stagebench.pipeline._script import run_script

    if ns.target_rate is not None:  # one notion with the environment variable, read and checked there
        os.environ["STAGEBENCH_TARGET_RATE"] = str(ns.target_rate)
    if ns.quick:
        os.environ["STAGEBENCH_QUICK"] = "on"
    if ns.trainer:
        os.environ["STAGEBENCH_TRAINER"] = "measure"
    return run_script(ns.script, ns.args, out=ns.out, nproc_per_node=ns.nproc_per_node, own_process=True)


def _cmd_report(ns: argparse.Namespace) -> int:
    # each command imports what it runs: `stagebench --help` loads none of them
    from stagebench.sweep._rebuild import rebuild

    try:
        path = rebuild(Path(ns.run_dir), say=lambda line: print(line, file=sys.stderr))
    except (StagebenchError, FileNotFoundError, KeyboardInterrupt):
        raise
    except OSError as e:  # a full disk, a permission: nothing half-written is left (runs/_results.write_atomically)
        return _fail(f"a file could not be written: {e}; the rows are untouched in {ns.run_dir}", PARTIAL.exit_code)
    except Exception as e:  # stagebench's own bug on rows a run produced: one line, the traceback in a file
        log = _error_log(Path(ns.run_dir), "stagebench report", e)
        return _fail(
            f"internal error: {type(e).__name__}: {e}; the rows are untouched in {ns.run_dir}"
            + (f" (traceback in {log})" if log else ""),
            INTERNAL.exit_code,
        )
    print(f"report: {path}")
    return 0


def _error_log(run_dir: Path, what: str, e: BaseException) -> Path | None:
    """Append ``e``'s traceback to the run directory's error.log; its path, or None where it cannot be written."""
    log = run_dir / "error.log"
    try:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"--- {what} ---\n{''.join(traceback.format_exception(e))}\n")
    except OSError:
        return None
    return log


def _cmd_compare(ns: argparse.Namespace) -> int:
    # each command imports what it runs: `stagebench --help` loads none of them
    from stagebench.report._compare import compare_runs

    path = compare_runs([Path(p) for p in ns.run_dirs], out=Path(ns.out) if ns.out else None)
    print(f"comparison: {path}")
    return 0


def _cmd_data(ns: argparse.Namespace) -> int:
    # each command imports what it runs: `stagebench --help` loads none of them
    from stagebench.sweep._datasets import generate_audio, generate_imagenet

    if ns.dataset == "audio":
        root = generate_audio(Path(ns.root), clips=ns.clips, seconds=ns.seconds, seed=ns.seed)
    else:
        root = generate_imagenet(Path(ns.root), classes=ns.classes, per_class=ns.per_class, seed=ns.seed)
    print(f"dataset: {root}")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="stagebench",
        description="How each stage of your data-loading pipeline scales, what holds it back, "
        "and which num_workers / concurrency to use.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    d = sub.add_parser("demo", help="diagnose the built-in example pipeline on generated data")
    d.add_argument("--out", default=None, help="run directory (default: a new folder under ./reports/)")
    d.add_argument("--quick", action="store_true", help="smaller grid and budgets (about a minute)")
    d.set_defaults(func=_cmd_demo)

    variables = "environment variables:\n" + "\n".join(f"  {k}\n      {v}" for k, v in env_help().items())
    g = sub.add_parser(
        "diagnose",
        help="run SCRIPT in diagnostic mode (no training), write a report, exit",
        epilog=variables,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g.add_argument("--out", default=None, help="run directory (default: STAGEBENCH_OUTPUT_DIR or ./reports/...)")
    g.add_argument(
        "--target-rate",
        type=float,
        default=None,
        metavar="ITEMS_PER_S",
        help="source items/s your training step consumes: say whether the pipeline or loader keeps up "
        "(STAGEBENCH_TARGET_RATE)",
    )
    g.add_argument(
        "--quick",
        action="store_true",
        help="a quick diagnosis for iteration: shorter windows, fewer levels, threads only (STAGEBENCH_QUICK=on)",
    )
    g.add_argument(
        "--trainer",
        action="store_true",
        help="after the report, run your loop: on cached batches (your step's demand), then on the real loader "
        "or pipeline at a few candidate settings in turns until they are told apart; your setting is changed only "
        "where those runs show the change faster beyond noise, or cheaper and within 5%% (STAGEBENCH_TRAINER=measure); "
        "your loop body runs: it may write checkpoints or logs",
    )
    g.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        metavar="N",
        help="run SCRIPT as N ranks of a data-parallel job on this host, through torch's own launcher, and "
        "diagnose them together: what your loader or pipeline does when every rank runs one "
        "(STAGEBENCH_NPROC_PER_NODE)",
    )
    g.add_argument("script", help="the unmodified training script")
    g.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    g.set_defaults(func=_cmd_diagnose)

    r = sub.add_parser("report", help="rebuild summary.json and report.html from saved rows")
    r.add_argument("run_dir", help="a run directory, or a multirun sweep directory")
    r.set_defaults(func=_cmd_report)

    c = sub.add_parser("compare", help="compare two or more run directories")
    c.add_argument("run_dirs", nargs="+", help="run directories")
    c.add_argument("--out", default=None, help="output folder (default: ./reports/compare-...)")
    c.set_defaults(func=_cmd_compare)

    s = sub.add_parser(
        "sweep", help="Hydra app: sweep loader configurations from conf/ (try: sweep --help)", add_help=False
    )
    s.set_defaults(func=None)

    da = sub.add_parser("data", help="generate built-in datasets")
    da_sub = da.add_subparsers(dest="dataset", metavar="DATASET", required=True)
    im = da_sub.add_parser("imagenet", help="JPEGs in ImageNet layout (root/train/<class>/*.JPEG)")
    im.add_argument(
        "--root",
        required=True,
        help="folder to write (kept: a second run with the same settings "
        "does nothing; a folder holding something else is refused)",
    )
    im.add_argument("--classes", type=int, default=10, help="number of classes (default: %(default)s)")
    im.add_argument("--per-class", type=int, default=50, help="images per class (default: %(default)s)")
    im.add_argument("--seed", type=int, default=0, help="same seed, same bytes (default: %(default)s)")
    im.set_defaults(func=_cmd_data)
    au = da_sub.add_parser("audio", help="WAV clips for the audio loader")
    au.add_argument("--root", required=True, help="folder to write (kept between runs, like imagenet's)")
    au.add_argument("--clips", type=int, default=200, help="number of clips (default: %(default)s)")
    au.add_argument(
        "--seconds", type=float, default=4.0, help="length of each clip, 16 kHz mono (default: %(default)s)"
    )
    au.add_argument("--seed", type=int, default=0, help="same seed, same bytes (default: %(default)s)")
    au.set_defaults(func=_cmd_data)
    return p


def console() -> None:
    """The ``stagebench`` command (and ``python -m stagebench``): :func:`main`, then exit.

    A hung stage's thread cannot be killed, and the interpreter would wait for it at exit (or for one
    stuck starting a thread in a process that ran out of memory); the command's work is done and on disk
    by then, so it ends the process at once. Only here: :func:`main` is also called in-process (tests,
    notebooks), where ending the process would end the caller's.
    """
    code = main()
    # CPython marks a KeyboardInterrupt that left code run by exec("...") as unhandled even when a
    # caller caught it (scipy's imports exec strings), and `python -m` then ends the process by SIGINT
    # (-2) instead of with our code. One more exec that finishes clears the mark.
    exec("pass")
    # start-up cost: the executors load asyncio and the pools' modules, which `stagebench --help` needs none of
    from stagebench.core._executors import exit_may_hang

    if exit_may_hang():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    from stagebench.pipeline._state import freeze_for_exit

    freeze_for_exit()  # the command is done: no collection at exit walks what its imports made
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sweep":
        # Hydra owns its own argument parsing (-m, --cfg, overrides, ...).
        from stagebench.sweep._app import main as sweep_main

        return sweep_main(argv[1:])
    parser = _parser()
    ns = parser.parse_args(argv)
    if getattr(ns, "func", None) is None:
        parser.print_help()
        return 0 if not argv else 2
    try:
        return int(ns.func(ns) or 0)
    except KeyboardInterrupt:
        return _fail("interrupted; rows measured so far are on disk", 130)
    except StagebenchError as e:
        return _fail(str(e))
    except FileNotFoundError as e:
        return _fail(f"not found: {e.filename or e}")
    except UnwritableOutputError as e:
        return _fail(str(e))
