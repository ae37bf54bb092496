"""Load a page in headless Chromium and read back how it laid out: the page's scroll width at a
given window width, and whether every image decoded. Used to check report.html (and to take the
screenshot in docs/bench.md); Chromium is Debian's `chromium` package.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

# No sandbox (root in a container), no GPU, and nothing that phones home during a check.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
_PROBE = """<script>window.addEventListener('load', function () {
  var broken = Array.prototype.filter.call(document.images, function (i) { return !(i.complete && i.naturalWidth > 0); });
  var probe = document.createElement('div'); probe.id = 'layout-probe';
  probe.setAttribute('data-scroll-width', document.documentElement.scrollWidth);
  probe.setAttribute('data-images', document.images.length);
  probe.setAttribute('data-broken-images', broken.length);
  document.body.appendChild(probe);
});</script>"""


@dataclass(frozen=True)
class Layout:
    scroll_width: int
    images: int
    broken_images: int


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="sparkctl-chromium-") as profile:
        return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                              text=True, timeout=timeout)


def measure(html_text: str, width: int = 1280, timeout: float = 120) -> Layout:
    """Lay the page out in a ``width`` px window; what it measured once every image loaded."""
    with tempfile.TemporaryDirectory(prefix="sparkctl-page-") as folder:
        page = os.path.join(folder, "page.html")
        with open(page, "w", encoding="utf-8") as handle:
            handle.write(html_text.replace("</body>", _PROBE + "</body>"))
        proc = _run([f"--window-size={width},900", "--virtual-time-budget=5000", "--dump-dom", f"file://{page}"], timeout)
    match = re.search(r'id="layout-probe" data-scroll-width="(\d+)" data-images="(\d+)" data-broken-images="(\d+)"',
                      proc.stdout)
    if match is None:
        raise RuntimeError(f"chromium did not lay the page out: {proc.stderr.strip()[-400:]}")
    return Layout(int(match[1]), int(match[2]), int(match[3]))


def screenshot(html_path: str, png_path: str, width: int = 1280, height: int = 2200, timeout: float = 120) -> None:
    proc = _run([f"--window-size={width},{height}", "--virtual-time-budget=5000",
                 f"--screenshot={os.path.abspath(png_path)}", f"file://{os.path.abspath(html_path)}"], timeout)
    if not os.path.exists(png_path):
        raise RuntimeError(f"chromium wrote no screenshot: {proc.stderr.strip()[-400:]}")
