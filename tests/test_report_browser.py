"""The reports in a real browser: headless Chromium, driven over the DevTools protocol.

Why the DevTools protocol over ``--remote-debugging-pipe`` rather than scraping
``--enable-logging`` output: it reports console messages, uncaught exceptions
and every network request as structured events, it can ask the page whether
its images decoded (``naturalWidth``), and it needs no port, no extra package
and no driver binary. The pipe is two file descriptors (3: commands in, 4:
replies out) carrying NUL-terminated JSON messages.

Screenshots go to the test's temporary folder, or to ``STAGEBENCH_SCREENSHOT_DIR``
when set, so a person can look at them.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import _fixtures as fx
import pytest

from stagebench.report import _render
from stagebench.report._compare import write_comparison
from stagebench.report._run import FailedJob

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class DevTools:
    """A minimal Chrome DevTools Protocol client over --remote-debugging-pipe."""

    def __init__(self, binary: str, profile: Path, timeout_s: float = 60.0) -> None:
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()
        # Move the child's ends above the low descriptors so dup2 onto 3 and 4 cannot clobber
        # them; close-on-exec, so only the dup2 copies (inheritable) reach Chromium.
        hi_r = fcntl.fcntl(cmd_r, fcntl.F_DUPFD_CLOEXEC, 10)
        hi_w = fcntl.fcntl(out_w, fcntl.F_DUPFD_CLOEXEC, 10)

        def child_fds() -> None:
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        self.proc = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--hide-scrollbars",
                "--disable-extensions",
                "--mute-audio",
                f"--user-data-dir={profile}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # close_fds=False: subprocess would close 3 and 4 after preexec_fn (and pass_fds=(3, 4)
            # fails when the parent has nothing open there). Python's own fds are non-inheritable.
            close_fds=False,
            preexec_fn=child_fds,
        )
        for fd in (cmd_r, out_w, hi_r, hi_w):
            os.close(fd)
        self.timeout_s = timeout_s
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no reply from Chromium")
            ready, _, _ = select.select([self._out_r], [], [], left)
            if ready:
                chunk = os.read(self._out_r, 1 << 16)
                if not chunk:
                    raise RuntimeError("Chromium closed the DevTools pipe")
                self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, session: str, timeout_s: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        for i, ev in enumerate(self.events):
            if ev.get("method") == method and ev.get("sessionId") == session:
                return self.events.pop(i)
        while True:
            ev = self._read_message(deadline)
            if ev.get("method") == method and ev.get("sessionId") == session:
                return ev
            self.events.append(ev)

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        os.close(self._out_r)


# Runs in the page after load: what a person would notice is broken.
_CHECK = """
(() => {
  const imgs = [...document.images].map(i => ({
    data: i.src.startsWith('data:'), ok: i.complete && i.naturalWidth > 0, alt: i.alt}));
  const ids = [...document.querySelectorAll('[id]')].map(e => e.id);
  let rows = null, rowsError = null;
  try {  // the comparison embeds its rows; a run report its summary (its rows are the CSV link)
    const island = JSON.parse((document.getElementById('rows') || document.getElementById('summary-data')).textContent);
    rows = Array.isArray(island) ? island.length : Object.keys(island).length;
  }
  catch (e) { rowsError = String(e); }
  const link = document.getElementById('csv-download');
  // anything sticking out of the one column (scroll boxes may hold wide tables: they scroll)
  const right = document.querySelector('main').getBoundingClientRect().right;
  const overflow = [...document.querySelectorAll('main *')]
    .filter(e => !e.closest('.scroll') && e.getBoundingClientRect().right > right + 1)
    .map(e => e.tagName + (e.id ? '#' + e.id : '') + ' ' + (e.textContent || '').slice(0, 40));
  const scrolling = [...document.querySelectorAll('.scroll')].filter(e => e.scrollWidth > e.clientWidth + 1).length;
  return {imgs, ids, rows, rowsError, overflow, scrolling, csv: link ? link.href.startsWith('data:text/csv') && link.download : null,
          scripts: document.scripts.length, width: document.documentElement.scrollWidth,
          height: document.documentElement.scrollHeight, title: document.title};
})()
"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("chromium not installed (Debian: apt-get install chromium)")
    dt = DevTools(CHROMIUM, tmp_path_factory.mktemp("chromium-profile"))
    try:
        dt.send("Browser.getVersion")
    except Exception as e:
        dt.close()
        pytest.skip(f"chromium did not start: {e}")
    yield dt
    dt.close()


def open_page(dt: DevTools, html: Path, shot: Path) -> dict[str, Any]:
    """Load a file, collect console errors / exceptions / network requests, check it, screenshot it."""
    target = dt.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    sid = dt.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        dt.send(f"{domain}.enable", session=sid)
    dt.send(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
        session=sid,
    )
    dt.send("Page.navigate", {"url": html.resolve().as_uri()}, session=sid)
    dt.wait_event("Page.loadEventFired", sid)
    check = dt.send("Runtime.evaluate", {"expression": _CHECK, "returnByValue": True}, session=sid)
    result = check["result"]["value"]
    dt.send(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1280, "height": min(int(result["height"]), 16000), "deviceScaleFactor": 1, "mobile": False},
        session=sid,
    )
    png = dt.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=sid)["data"]
    shot.write_bytes(base64.b64decode(png))
    # Events that arrived while we were busy, for this page only.
    mine = [e for e in dt.events if e.get("sessionId") == sid]
    dt.events = [e for e in dt.events if e.get("sessionId") != sid]
    result["console_errors"] = [
        e["params"]
        for e in mine
        if (e["method"] == "Runtime.consoleAPICalled" and e["params"].get("type") in ("error", "assert"))
        or e["method"] == "Runtime.exceptionThrown"
        or (e["method"] == "Log.entryAdded" and e["params"]["entry"].get("level") == "error")
    ]
    result["requests"] = [e["params"]["request"]["url"] for e in mine if e["method"] == "Network.requestWillBeSent"]
    dt.send("Target.closeTarget", {"targetId": target})
    return result


def _shot_dir(tmp_path: Path) -> Path:
    d = os.environ.get("STAGEBENCH_SCREENSHOT_DIR")
    if d:
        Path(d).mkdir(parents=True, exist_ok=True)
        return Path(d)
    return tmp_path


def _assert_clean(res: dict[str, Any], shot: Path, expected_ids: set[str], n_images: int) -> None:
    assert res["console_errors"] == [], res["console_errors"]
    # only the page itself is requested: images are data: URIs, nothing goes to the network
    assert all(u.startswith(("file:", "data:")) for u in res["requests"]), res["requests"]
    assert len(res["imgs"]) == n_images
    assert all(i["data"] and i["ok"] for i in res["imgs"]), res["imgs"]
    assert expected_ids <= set(res["ids"]), expected_ids - set(res["ids"])
    assert res["rowsError"] is None and res["rows"] > 0
    assert res["csv"] in ("results.csv", "comparison.csv")  # a data: link that downloads
    assert res["scripts"] == sum(1 for i in res["ids"] if i in ("rows", "summary-data"))  # only JSON islands
    assert res["width"] <= 1280, "the page scrolls sideways"
    assert res["overflow"] == [], res["overflow"]
    assert res["scrolling"] == 0, "a table needs sideways scrolling at 1280 px"
    assert shot.stat().st_size > 20_000  # a real picture, not a blank page


def test_pipeline_report_in_chromium(browser: DevTools, tmp_path: Path) -> None:
    run = fx.synthetic_run(tmp_path / "run")
    html = _render.write_report(run)
    shot = _shot_dir(tmp_path) / "pipeline_report.png"
    res = open_page(browser, html, shot)
    _assert_clean(
        res,
        shot,
        {
            "summary",
            "verdict",
            "recommended",
            "overview",
            "findings",
            "stages",
            "stage-1",
            "stage-2",
            "not-isolated",
            "provenance",
            "data",
            "summary-data",
            "csv-download",
        },
        5,
    )
    assert fx.HOSTILE in res["title"]  # escaped into the title, shown as text


def test_loader_report_in_chromium(browser: DevTools, tmp_path: Path) -> None:
    run = fx.synthetic_loader_run(tmp_path / "run")
    html = _render.write_report(run)
    shot = _shot_dir(tmp_path) / "loader_report.png"
    res = open_page(browser, html, shot)
    _assert_clean(res, shot, {"summary", "verdict", "recommended", "loader", "findings", "provenance", "data"}, 3)


def test_comparison_in_chromium(browser: DevTools, tmp_path: Path) -> None:
    a = fx.synthetic_loader_run(tmp_path / "a", label="loader.backend=torch")
    b = fx.synthetic_loader_run(tmp_path / "b", label=fx.HOSTILE, backend="spdl_pytorch", scale=1.3)
    html = write_comparison(
        [a, b],
        tmp_path / "cmp",
        title="loaders",
        failed=[FailedJob("loader.backend=spdl_pipeline", "ImportError")],
    )
    shot = _shot_dir(tmp_path) / "comparison.png"
    res = open_page(browser, html, shot)
    _assert_clean(res, shot, {"summary", "best", "curves", "failed", "runs", "data"}, 2)
