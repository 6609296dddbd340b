"""Open a report in headless Chromium: JavaScript errors, network requests, figure data,
open time and screenshots (used by the tests, the benchmark and for the README picture).

Chromium is driven over the Chrome DevTools Protocol on a loopback websocket
(``websocket-client``, in the ``test`` extra). It runs with a fresh, empty profile that is
deleted afterwards, no sandbox (it runs as root in CI containers), no GPU and no background
networking.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio", "--remote-debugging-port=0")


class BrowserError(RuntimeError):
    """Chromium could not be started or did not answer."""


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome executable (``STREAMTREE_CHROMIUM`` first), or None."""
    explicit = os.environ.get("STREAMTREE_CHROMIUM")
    if explicit:
        return explicit if shutil.which(explicit) else None
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageLoad:
    """What happened while a page loaded.

    Attributes
    ----------
    seconds : float
        Wall time from the navigation request until the page said it was drawn.
    ready_ms : float
        The page's own ``performance.now()`` when it finished drawing (navigation start to
        every figure drawn).
    errors : list of str
        Uncaught exceptions and console/log errors.
    requests : list of str
        URLs requested other than the page itself and ``data:`` URLs (must be empty for an
        offline report).
    """

    seconds: float
    ready_ms: float
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


class HeadlessChromium:
    """A headless Chromium with one page, as a context manager.

    Parameters
    ----------
    executable : str, optional
        Chromium binary (default: :func:`find_chromium`).
    width, height : int
        Viewport in CSS pixels.
    timeout : float
        Seconds to wait for start-up and for each page load.
    """

    def __init__(self, executable: str | None = None, *, width: int = 1400, height: int = 900,
                 timeout: float = 60.0) -> None:
        self.executable = executable or find_chromium()
        if self.executable is None:
            raise BrowserError("no Chromium found (install Debian's 'chromium' package, or set STREAMTREE_CHROMIUM)")
        self.width, self.height, self.timeout = width, height, timeout
        self._proc: subprocess.Popen | None = None
        self._profile: str | None = None
        self._ws = None
        self._next_id = 0
        self._events: list[dict] = []

    # ---- life cycle -------------------------------------------------------------------
    def __enter__(self) -> HeadlessChromium:
        import websocket  # websocket-client

        self._profile = tempfile.mkdtemp(prefix="streamtree-chromium-")
        self._proc = subprocess.Popen([self.executable, *FLAGS, f"--user-data-dir={self._profile}",
                                       f"--window-size={self.width},{self.height}", "about:blank"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port = self._wait_for_port()
            page_ws = None
            deadline = time.monotonic() + self.timeout
            while page_ws is None and time.monotonic() < deadline:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                    targets = json.loads(r.read())
                page_ws = next((t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page"), None)
                if page_ws is None:
                    time.sleep(0.1)
            if page_ws is None:
                raise BrowserError("Chromium opened no page")
            self._ws = websocket.create_connection(page_ws, timeout=self.timeout, suppress_origin=True)
            for domain in ("Page", "Runtime", "Log", "Network"):
                self.send(f"{domain}.enable")
            self.send("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                      deviceScaleFactor=1, mobile=False)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self._ws is not None:
            try:
                self._ws.close()
            except Exception:  # noqa: BLE001 - closing a dead socket
                pass
            self._ws = None
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._profile is not None:
            shutil.rmtree(self._profile, ignore_errors=True)
            self._profile = None

    def _wait_for_port(self) -> int:
        marker = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise BrowserError(f"Chromium exited at start-up with status {self._proc.returncode}")
            if marker.exists():
                text = marker.read_text().split()
                if text:
                    return int(text[0])
            time.sleep(0.05)
        raise BrowserError(f"Chromium did not open its DevTools port within {self.timeout:g} s")

    # ---- protocol ---------------------------------------------------------------------
    def send(self, method: str, **params) -> dict:
        """Call a DevTools method and return its result (events met meanwhile are kept)."""
        self._next_id += 1
        call_id = self._next_id
        self._ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self._ws.recv())
            if msg.get("id") == call_id:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error'].get('message')}")
                return msg.get("result", {})
            if "method" in msg:
                self._events.append(msg)

    def evaluate(self, expression: str):
        """Value of a JavaScript expression in the page (JSON-serialisable values)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:60]}...: {_exception_text(result['exceptionDetails'])}")
        return result["result"].get("value")

    def cpu_seconds(self) -> float:
        """CPU time used so far by all of this Chromium's processes (browser, renderers, GPU,
        services): a load's CPU cost is the difference across it, which unlike wall time does
        not grow when other programs share the machine."""
        import websocket

        port = (Path(self._profile) / "DevToolsActivePort").read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/version", timeout=5) as r:
            url = json.loads(r.read())["webSocketDebuggerUrl"]
        ws = websocket.create_connection(url, timeout=self.timeout, suppress_origin=True)
        try:
            ws.send(json.dumps({"id": 1, "method": "SystemInfo.getProcessInfo"}))
            while True:
                msg = json.loads(ws.recv())
                if msg.get("id") == 1:
                    break
        finally:
            ws.close()
        if "error" in msg:
            raise BrowserError(f"SystemInfo.getProcessInfo: {msg['error'].get('message')}")
        return float(sum(p.get("cpuTime", 0.0) for p in msg["result"]["processInfo"]))

    # ---- pages ------------------------------------------------------------------------
    def load(self, path: str | os.PathLike, ready: str = "document.body && document.body.dataset.ready") -> PageLoad:
        """Open a local file and wait until ``ready`` (a JS expression) is truthy."""
        url = Path(path).resolve().as_uri()
        self._events.clear()
        start = time.monotonic()
        self.send("Page.navigate", url=url)
        deadline = start + self.timeout
        value = None
        while time.monotonic() < deadline:
            value = self.evaluate(f"({ready}) || null")
            if value:
                break
            if any(e["method"] == "Runtime.exceptionThrown" for e in self._events):
                break  # the page failed: report its errors rather than wait for the time-out
            time.sleep(0.05)
        seconds = time.monotonic() - start
        errors, requests = self._errors(), []
        for e in self._events:
            if e["method"] == "Network.requestWillBeSent":
                req = e.get("params", {}).get("request", {}).get("url", "")
                if req != url and not req.startswith("data:"):
                    requests.append(req)
        if not value and not errors:
            errors.append(f"the page was not ready within {self.timeout:g} s ({ready})")
        try:
            ready_ms = float(value)
        except (TypeError, ValueError):
            ready_ms = float("nan")
        return PageLoad(seconds=seconds, ready_ms=ready_ms, errors=errors, requests=requests)

    def errors(self) -> list[str]:
        """JavaScript errors since the last :meth:`load` (e.g. after clicking around)."""
        self.evaluate("1")  # let pending protocol events arrive
        return self._errors()

    def _errors(self) -> list[str]:
        out = []
        for e in self._events:
            method, params = e["method"], e.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(_exception_text(params.get("exceptionDetails", {})))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description", "")))
                                                   for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                out.append("log: " + params["entry"].get("text", ""))
        return out

    def screenshot(self, *, full_page: bool = False, clip: tuple[int, int, int, int] | None = None) -> bytes:
        """A PNG of the viewport, the whole page, or ``clip`` = (x, y, width, height)."""
        params: dict = {"format": "png"}
        if full_page or clip is not None:
            if clip is None:
                size = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
                clip = (0, 0, size[0], size[1])
            params["clip"] = {"x": clip[0], "y": clip[1], "width": clip[2], "height": clip[3], "scale": 1}
            params["captureBeyondViewport"] = True
        return base64.b64decode(self.send("Page.captureScreenshot", **params)["data"])


def _exception_text(details: dict) -> str:
    exc = details.get("exception") or {}
    return str(exc.get("description") or details.get("text") or details)
