"""The report as a reader's browser shows it: headless Chromium, broken images, elements wider than the page.

Chromium is driven over its DevTools protocol on a pipe (`--remote-debugging-pipe`: it reads commands on
file descriptor 3 and writes replies on 4, each a JSON message ended by a NUL byte), so no driver package
is needed, only the browser: `apt-get install chromium` on Debian, or any Chromium or Chrome named by
$GATE_CHROMIUM. `Browser.open(page)` loads a page at a window size; `layout()` says which images
did not load and which elements stick out of the page or out of their box (a table wider than its column
that the reader would scroll sideways; a table marked to scroll by design, `Table.scrolls`, is allowed);
`screenshot()` takes the first screen or the screen that opens at an anchor.
"""
from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WIDTH, HEIGHT = 1280, 900   # a laptop's window: the first screen a reader sees
LOAD_TIMEOUT_S = 60.0
INSTALL_HINT = ("install Chromium (Debian: apt-get install chromium) or name one in $GATE_CHROMIUM")

# Runs in the page: images that did not load, and the outermost elements past the page's right edge or wider
# than their own box (overflow hidden or scrolled), outside the containers that scroll by design; folded
# tables (<details>) are opened to be measured and folded again; the height is the page's as it opens.
LAYOUT_SCRIPT = r"""
(() => {
  const folded = [...document.querySelectorAll('details:not([open])')];
  folded.forEach(d => { d.open = true; });   // a folded table is checked as a reader who opens it sees it
  const width = document.documentElement.clientWidth;
  const describe = (el) => {
    const caption = el.tagName === 'TABLE' ? el.querySelector('caption') :
      el.querySelector && el.querySelector(':scope > table > caption');
    let near = el;
    while (near && !near.id) near = near.previousElementSibling || near.parentElement;
    const tag = el.tagName.toLowerCase() + (el.className && typeof el.className === 'string' ?
      '.' + el.className.trim().split(/\s+/).join('.') : '');
    return tag + (caption ? ' "' + caption.textContent.trim().slice(0, 80) + '"' : '') +
      (near ? ' (near #' + near.id + ')' : '');
  };
  const broken = [...document.images].filter(i => !i.complete || i.naturalWidth === 0)
    .map(i => i.getAttribute('src'));
  const flagged = [], wide = [];
  for (const el of document.body.querySelectorAll('*')) {
    if (el.closest('.scrolls') || flagged.some(f => f.contains(el))) continue;
    const box = el.getBoundingClientRect();
    const overflow = getComputedStyle(el).overflowX;
    const clipped = overflow !== 'visible' && el.scrollWidth > el.clientWidth + 1;
    if (box.right > width + 1 || box.left < -1) {
      flagged.push(el);
      wide.push(describe(el) + ': ' + Math.round(box.right) + ' px to its right edge, the page is ' + width);
    } else if (clipped) {
      flagged.push(el);
      wide.push(describe(el) + ': ' + el.scrollWidth + ' px of content in ' + el.clientWidth + ' px');
    }
  }
  folded.forEach(d => { d.open = false; });
  return {width, height: document.documentElement.scrollHeight, broken, wide};
})()
"""


def _write_png(path: Path, png: bytes) -> Path:
    """`png` at `path`, written aside and renamed; in 256 colours where Pillow is (matplotlib's, the report
    extra): a third of the size, no difference to see on a page of text and flat colours."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.partial")
    try:
        from PIL import Image
    except ImportError:
        scratch.write_bytes(png)
    else:
        Image.open(io.BytesIO(png)).convert("RGB").quantize(256).save(scratch, format="PNG", optimize=True)
    os.replace(scratch, path)
    return path


class BrowserError(RuntimeError):
    """Chromium is missing, would not start, or the page would not load; the message says which."""


def find_chromium() -> str | None:
    """$GATE_CHROMIUM, else the first Chromium or Chrome on PATH; None if there is none."""
    named = os.environ.get("GATE_CHROMIUM")
    if named:
        return shutil.which(named) or (named if Path(named).is_file() else None)
    return next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)


@dataclass(frozen=True)
class Layout:
    width: int          # the page's width in CSS pixels (the window's, less no scroll bar)
    height: int         # the whole page's height
    broken: list[str]   # the src of each image that did not load
    wide: list[str]     # each element that sticks out, described, with its widths

    def problems(self) -> list[str]:
        return ([f"broken image: {src}" for src in self.broken]
                + [f"wider than the page: {what}" for what in self.wide])


class Browser:
    """One headless Chromium showing one page; use as a context manager (`with Browser.open(page) as b:`)."""

    def __init__(self, process: subprocess.Popen, to_browser: int, from_browser: int, profile: str):
        self._process, self._out, self._in, self._profile = process, to_browser, from_browser, profile
        self._buffer, self._next_id, self._session = b"", 0, None

    @classmethod
    def open(cls, page: Path, width: int = WIDTH, height: int = HEIGHT, chromium: str | None = None) -> Browser:
        chromium = chromium or find_chromium()
        if chromium is None:
            raise BrowserError(f"no Chromium found: {INSTALL_HINT}")
        browser_reads, to_browser = os.pipe()
        from_browser, browser_writes = os.pipe()

        def pipes_as_3_and_4():   # in the child: the protocol's descriptors, whatever numbers the pipes got
            read = fcntl.fcntl(browser_reads, fcntl.F_DUPFD, 10)   # above 4: dup2 onto itself would keep CLOEXEC
            write = fcntl.fcntl(browser_writes, fcntl.F_DUPFD, 10)
            os.dup2(read, 3)
            os.dup2(write, 4)

        profile = tempfile.mkdtemp(prefix="gpuengine-chromium-")
        try:
            # Chromium's own chatter (D-Bus, GPU) goes to a file in its profile: a full pipe would stall it.
            with open(Path(profile) / "stderr.txt", "wb") as log:
                process = subprocess.Popen(
                    [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--hide-scrollbars", "--no-first-run", "--remote-debugging-pipe", f"--user-data-dir={profile}",
                     "about:blank"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                    preexec_fn=pipes_as_3_and_4, close_fds=False)
        except OSError as exc:
            shutil.rmtree(profile, ignore_errors=True)
            for fd in (to_browser, from_browser):
                os.close(fd)
            raise BrowserError(f"{chromium} would not start ({exc}): {INSTALL_HINT}") from exc
        finally:
            os.close(browser_reads)
            os.close(browser_writes)
        browser = cls(process, to_browser, from_browser, profile)
        try:
            browser._load(page, width, height)
        except BaseException:
            browser.close()
            raise
        return browser

    def _send(self, method: str, params: dict | None = None, session: bool = True) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self._session:
            message["sessionId"] = self._session
        try:
            os.write(self._out, json.dumps(message).encode() + b"\0")
            while True:
                while b"\0" not in self._buffer:
                    chunk = os.read(self._in, 1 << 20)
                    if not chunk:
                        raise BrokenPipeError("Chromium closed its pipe")
                    self._buffer += chunk
                raw, self._buffer = self._buffer.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._next_id:   # events and other replies are not asked for here
                    break
        except OSError as exc:
            raise BrowserError(f"Chromium stopped answering ({exc}): {self._stderr()}") from exc
        if "error" in reply:
            raise BrowserError(f"Chromium refused {method}: {reply['error'].get('message')}")
        return reply["result"]

    def _stderr(self) -> str:
        if self._process.poll() is None:
            return "it is still running"
        log = Path(self._profile) / "stderr.txt"
        lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
        return "; ".join(lines[-3:]) or f"it exited with status {self._process.returncode}"

    def _load(self, page: Path, width: int, height: int) -> None:
        target = self._send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self._send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self._send("Emulation.setDeviceMetricsOverride",
                   {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        self._send("Page.navigate", {"url": Path(page).resolve().as_uri()})
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while self._evaluate("document.readyState") != "complete":   # 'complete': every image loaded or failed
            if time.monotonic() > deadline:
                raise BrowserError(f"{page}: not loaded after {LOAD_TIMEOUT_S:g} s")
            time.sleep(0.05)

    def _evaluate(self, expression: str):
        result = self._send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"the page's script failed: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def layout(self) -> Layout:
        found = self._evaluate(LAYOUT_SCRIPT)
        return Layout(found["width"], found["height"], found["broken"], found["wide"])

    def box(self, anchor: str) -> tuple[float, float]:
        """(top, bottom) of the element with id `anchor`, in page pixels; BrowserError if there is none."""
        found = self._evaluate(f"(() => {{ const el = document.getElementById({json.dumps(anchor)}); if (!el) "
                               "return null; const box = el.getBoundingClientRect(); "
                               "return [box.top + window.scrollY, box.bottom + window.scrollY]; })()")
        if found is None:
            raise BrowserError(f"the page has no element with id {anchor!r}")
        return found[0], found[1]

    def screenshot(self, path: Path, anchor: str | None = None, height: int | None = None) -> Path:
        """The first screen, or from the element with id `anchor` down to its end (at most `height` pixels,
        a screen by default; the whole element with height 0), as a PNG at `path`."""
        screen = self._evaluate("window.innerHeight")
        top, bottom = (0, screen) if anchor is None else self.box(anchor)
        top = max(0, top - 8)   # a little air above a heading
        height = (bottom + 8 - top) if height == 0 else (height or screen)
        width = self._evaluate("document.documentElement.clientWidth")
        shot = self._send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                      "clip": {"x": 0, "y": top, "width": width, "height": height,
                                                               "scale": 1}})
        return _write_png(Path(path), base64.b64decode(shot["data"]))

    def close(self) -> None:
        try:
            if self._process.poll() is None:
                try:
                    self._send("Browser.close", session=False)
                except BrowserError:
                    pass
                try:
                    self._process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait()
        finally:
            for fd in (self._out, self._in):
                try:
                    os.close(fd)
                except OSError:
                    pass
            shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_page(page: Path, screens: dict[str, tuple[str | None, int | None]] | None = None,
               out: Path | None = None) -> tuple[Layout, list[Path]]:
    """The layout of `page` as a WIDTH x HEIGHT window shows it, and the screenshots `screens` names
    (file stem -> (anchor or None for the first screen, height as `Browser.screenshot` takes it)) in `out`."""
    shots = []
    with Browser.open(page) as browser:
        layout = browser.layout()
        for name, (anchor, height) in (screens or {}).items():
            shots.append(browser.screenshot(Path(out) / f"{name}.png", anchor, height))
    return layout, shots
