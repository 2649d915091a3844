"""The command line: argv injected, user errors as one line without a traceback."""

import signal
import subprocess
import sys

from stagebench._cli import main


def test_help_lists_the_commands(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for cmd in ("demo", "diagnose", "report", "compare", "sweep", "data"):
        assert cmd in out


def test_every_commands_help_renders():
    """argparse formats help strings with %: a lone one (\"within 5%\") made `diagnose --help` a traceback."""
    import argparse

    from stagebench._cli import _parser

    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        assert name in parser.format_help()
        for inner in parser._actions:
            if isinstance(inner, argparse._SubParsersAction):
                for child in inner.choices.values():
                    child.format_help()


def test_python_dash_m_is_the_same_command():
    r = subprocess.run([sys.executable, "-m", "stagebench", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "diagnose" in r.stdout


def test_an_interrupt_caught_after_an_exec_still_ends_with_our_code(tmp_path):
    """A Ctrl-C that passed through exec'd code (scipy's imports exec strings) and was caught: `python -m`
    must end with the command's code (130), not be killed by SIGINT (-2) as CPython does by default."""
    (tmp_path / "entry.py").write_text(
        # imported first: importing a module that builds a dataclass execs a string too, which would hide the mark
        "import stagebench._cli as cli, stagebench.core._executors\n"
        "def main():\n"
        "    try:\n"
        "        exec('raise KeyboardInterrupt')\n"
        "    except KeyboardInterrupt:\n"
        "        return 130\n"
        "cli.main = main\n"
        "cli.console()\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "entry"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        # as from a terminal: a runner started under nohup or in the background passes SIGINT ignored,
        # and CPython then never marks the interrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert r.returncode == 130, r.stderr


def test_missing_script_is_one_line_without_traceback(tmp_path, capsys):
    rc = main(["diagnose", "--out", str(tmp_path / "run"), str(tmp_path / "nope.py")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "Traceback" not in err
    assert err.strip().startswith("stagebench: error:") and len(err.strip().splitlines()) == 1


def test_main_returns_in_process_even_when_a_hung_stage_left_a_thread(tmp_path, capsys):
    """A test before this one that left a hung stage's thread made main() end the whole test
    session (os._exit) mid-run; only the console command may end the process."""
    import threading

    from stagebench.core._executors import _LEAKED

    release = threading.Event()
    hung = threading.Thread(target=release.wait, daemon=True)
    hung.start()
    _LEAKED.append(hung)
    try:
        assert main(["diagnose", "--out", str(tmp_path / "run"), str(tmp_path / "nope.py")]) == 2
    finally:
        release.set()
        hung.join()
        _LEAKED.remove(hung)


def test_importing_stagebench_is_light():
    code = "import sys, stagebench; print(sorted(m for m in ('pandas', 'numpy', 'torch', 'spdl', 'scipy') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"
