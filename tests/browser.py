"""What the browser tests (and `benchmarks/bench_dashboard.py`) share: Debian's Chromium through
Playwright (browsers cannot be downloaded here), a real JupyterLab on a temp folder, and the
few page actions every test needs (wait for the kernel, run all cells, open a dashboard tab).

Tests import it as `from browser import ...` (pytest puts tests/ on the path); the benchmark
puts tests/ on `sys.path` itself. Screenshots go to `build/test-artifacts/` (CI keeps them).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ARTIFACTS",
    "CHROMIUM",
    "CHROMIUM_ARGS",
    "POLL_MS",
    "Lab",
    "held_for",
    "launch_chromium",
    "new_lab_context",
    "open_notebook",
    "open_tab",
    "run_all_cells",
    "running_lab",
    "settle_kernel",
    "sync_playwright_or_fail",
    "wait_for_kernel",
]

ARTIFACTS = Path(__file__).resolve().parents[1] / "build" / "test-artifacts"
# Chromium's headless shell where it is installed (Debian's chromium-headless-shell, which
# .ci/run installs; its binary, not /usr/bin's script that does not exec it), else Debian's
# Chromium. The shell is Blink without the browser around it: no new-tab page, no WebUI
# renderers, a lighter browser process. Measured on the lab unit (test_lab_*, alone, 29 Nov
# 17:53-18:00): the pages' Chromium 54.9 -> 46.6 CPU-s, all processes 106 -> 83 CPU-s.
_HEADLESS_SHELL = Path("/usr/lib/chromium/chromium-headless-shell")
CHROMIUM = _HEADLESS_SHELL if _HEADLESS_SHELL.exists() else Path("/usr/bin/chromium")
# Without the background-networking flags Chromium keeps dialling hosts this closed network
# refuses.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    # Headless Chromium still builds every window's address-bar popups as WebUI pages, each in
    # a renderer of its own: about 0.9 CPU-s per window (a context is a window), for popups
    # that no one ever opens here (measured: 4.5 of the 20 CPU-s of Chromium in
    # test_notebooks + test_report_browser).
    "--disable-features=WebUIOmniboxPopup,WebUIOmniboxAimPopup",
    # No page reaches beyond this machine: every host name but 127.0.0.1 (where JupyterLab
    # and the tests' own servers listen) fails to resolve. This stands in for a route that
    # refused the rest on each lab page: Playwright turns the HTTP cache off for a page
    # with any route, and JupyterLab's 17 MB of scripts were fetched again on each load.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]


# How often a `page.wait_for_function` condition is checked, in ms. Playwright's default
# ("raf") checks it on every animation frame, and asking for frames makes the page render
# about 60 a second while it waits: 0.13 CPU-s per second of waiting against 0.01 at 100 ms
# (measured on the dashboard's page), for at most 0.1 s later notice.
POLL_MS = 100


def _unavailable(reason: str) -> None:
    """Missing browser tooling fails in CI (where it must be installed) and skips elsewhere."""
    import pytest

    if os.environ.get("CI"):
        pytest.fail(
            f"{reason}; CI must provide it (apt-get install chromium, pip install playwright)"
        )
    pytest.skip(reason)


def sync_playwright_or_fail():
    """Playwright's `sync_playwright`, after checking Chromium and Playwright are there."""
    if not CHROMIUM.exists():
        _unavailable(f"{CHROMIUM} not found")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed")
    return sync_playwright


def launch_chromium(pw):
    """Debian's Chromium (its headless shell where installed), through Playwright."""
    return pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)


# -- a JupyterLab server -------------------------------------------------------------------------


@dataclass
class Lab:
    """A running JupyterLab: its base URL, token and notebook folder (not frozen: Playwright
    marks route handlers, bound methods included, with attributes)."""

    base: str
    token: str
    root: Path

    def url(self, notebook: str) -> str:
        """`notebook` (a path under the root) opened in a workspace of its own: the server
        is shared by the tests of a run, and the default workspace would reopen every
        notebook an earlier test left open, each starting its kernel."""
        workspace = re.sub(r"[^a-z0-9]+", "-", notebook.lower()).strip("-")[:80]
        return f"{self.base}/lab/workspaces/{workspace}/tree/{notebook}?token={self.token}"

    def folder(self, name: str) -> Path:
        """A new, empty folder `name` under the root, for one test's notebooks and data
        (its notebooks open as `self.url(f"{name}/book.ipynb")`)."""
        folder = self.root / name
        folder.mkdir()
        return folder

    def shut_down_kernels(self) -> None:
        """Shut down every kernel the server runs (a test's, once it is done with them)."""
        for kernel in self._api("GET", "kernels") or []:
            self._api("DELETE", f"kernels/{kernel['id']}")

    def _api(self, method: str, path: str):
        request = urllib.request.Request(
            f"{self.base}/api/{path}",
            method=method,
            headers={"Authorization": f"token {self.token}"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read()
        return json.loads(body) if body else None

    def only_local(self, route) -> None:
        """A Playwright route handler: the page may reach this server and nothing else."""
        if route.request.url.startswith(self.base):
            route.continue_()
        else:
            route.abort()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_lab(
    root: Path,
    state: Path,
    *,
    env: Mapping[str, str] | None = None,
    unset: tuple[str, ...] = (),
    timeout: float = 90,
) -> Iterator[Lab]:
    """JupyterLab on `root` (local only, random port and token), its kernels with `env` and
    without the variables named in `unset`; its settings, workspaces and runtime files live
    under `state`, so a second server with another `state` is a different machine as far as
    notebook trust goes. Stopped with its kernels on exit."""
    token, port = secrets.token_hex(16), _free_port()
    full_env = {
        **{k: v for k, v in os.environ.items() if k not in unset},
        **(env or {}),
        "JUPYTER_CONFIG_DIR": str(state / "config"),
        "JUPYTER_DATA_DIR": str(state / "data"),
        "JUPYTER_RUNTIME_DIR": str(state / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(state / "lab-settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(state / "lab-workspaces"),
        # The venv's kernelspec and labextensions stay visible with our own data dir.
        "JUPYTER_PATH": str(Path(sys.prefix) / "share" / "jupyter"),
    }
    # No "get notified about Jupyter news?" toast over the screenshots (and no fetch of news).
    notification = state / "lab-settings" / "@jupyterlab" / "apputils-extension"
    notification.mkdir(parents=True, exist_ok=True)
    (notification / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    # No build check: each page load would have the server run `yarn config` (0.45 CPU-s) to
    # ask whether the extensions need a rebuild, which the installed wheels never do.
    labconfig = state / "config" / "labconfig"
    labconfig.mkdir(parents=True, exist_ok=True)
    (labconfig / "page_config.json").write_text('{"buildCheck": false, "buildAvailable": false}')
    log = state / "jupyterlab.log"
    command = [
        sys.executable, "-m", "jupyter", "lab", "--no-browser",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        # `window.jupyterapp`: a test waits on the kernel's own status changes.
        "--LabApp.expose_app_in_browser=True",
    ]  # fmt: skip
    if os.geteuid() == 0:  # containers run tests as root; JupyterLab refuses that by default
        command.append("--allow-root")
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, env=full_env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for_server(f"{base}/api/status?token={token}", process, log, timeout=timeout)
        yield Lab(base, token, root)
    finally:
        _stop(process)


def _wait_for_server(url: str, process: subprocess.Popen, log: Path, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"JupyterLab exited with {process.returncode}:\n{log.read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(
        f"JupyterLab did not answer {url} within {timeout:.0f} s:\n{log.read_text()[-3000:]}"
    )


def _stop(process: subprocess.Popen) -> None:
    """End the server and the kernels it started: they share the new session's process group."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# -- page actions ---------------------------------------------------------------------------------


# Run first in every document of a lab context's pages: the first document a page loads
# starts from empty local storage (sessionStorage is the page's own, so a reload in the same
# page, as a person's, keeps what the page stored).
_FRESH_STORAGE = """
try {
    if (!sessionStorage.getItem('ckpt-test-page')) {
        localStorage.clear();
        sessionStorage.setItem('ckpt-test-page', '1');
    }
} catch (e) {}  // a document with no storage of its own (the new page's about:blank)
"""


def new_lab_context(browser):
    """The browser context the lab pages of a run share (1400 x 1000): one HTTP cache, so
    that JupyterLab's and Perspective's scripts (served as immutable) are fetched once a run
    and V8's code cache, kept beside them, spares compiling them again. What a test sets
    stays its page's own: routes and init scripts are per page (`open_notebook`), each page
    starts with empty local storage; the one cookie JupyterLab sets (`_xsrf`) is the
    session's server's, which every lab test shares. The pages ask for less motion, as a
    person may: no figure measured here depends on an animation, and each spinning frame
    was drawn while the tests waited (the dashboard's spinners stand still then)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, reduced_motion="reduce")
    context.add_init_script(_FRESH_STORAGE)
    return context


def open_notebook(
    context, lab: Lab, notebook: str, errors: list[str] | None = None, *, init_script: str = ""
):
    """A new page of `context` (`new_lab_context`) on `notebook` of `lab` (JavaScript errors
    appended to `errors`; `init_script` runs before the page's own). It reaches no other
    machine (`CHROMIUM_ARGS`); a route here would turn the shared HTTP cache off for it."""
    page = context.new_page()
    if init_script:
        page.add_init_script(init_script)
    if errors is not None:
        page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(lab.url(notebook), wait_until="domcontentloaded")
    return page


def wait_for_kernel(page, *, timeout: float) -> None:
    """Until the status bar says the notebook's kernel is idle. A fresh JupyterLab may ask
    which kernel to start: the dialog's default (the notebook's python3) is accepted."""
    deadline = time.monotonic() + timeout
    status = page.locator("#jp-main-statusbar")
    while time.monotonic() < deadline:
        accept = page.locator(".jp-Dialog .jp-mod-accept")
        if accept.count() and accept.first.is_visible():
            accept.first.click()
        text = status.inner_text() if status.count() else ""
        if "ipykernel" in text and "Idle" in text:
            return
        time.sleep(0.25)
    raise TimeoutError(f"the notebook kernel did not become idle within {timeout:.0f} s")


def held_for(ready: str) -> str:
    """A page function `async ([quiet, wait, arg]) => bool`: true once `ready(arg)` (the
    source of a JavaScript function) has held for `quiet` ms on end, false after `wait` ms.
    Polled every 50 ms in the page: one round trip for the whole wait."""
    return """async ([quiet, wait, arg]) => {
    const ready = READY;
    const end = performance.now() + wait;
    let since = null;
    while (performance.now() < end) {
        if (ready(arg)) {
            since = since === null ? performance.now() : since;
            if (performance.now() - since >= quiet) return true;
        } else {
            since = null;
        }
        await new Promise(resolve => setTimeout(resolve, 50));
    }
    return false;
}""".replace("READY", ready)


# The status bar says the notebook's kernel is idle.
_KERNEL_IDLE = """() => {
    const status = document.querySelector('#jp-main-statusbar');
    return !!status && status.innerText.includes('Idle');
}"""


def settle_kernel(page, *, quiet: float = 0.5, timeout: float = 30) -> None:
    """Until the kernel has answered the page's last messages: idle for `quiet` seconds on
    end. A person's next click comes after the page has answered the last one; a test that
    clicks a tab and at once a button in it can have the button's message handled before the
    tab's own: ipywidgets' page holds a widget's state change back while an earlier message
    of that widget awaits the kernel's answer (`_msg_buffer`), ignores the kernel's changes
    to what it holds back, and sends a button's click at once. The kernel's answer to the
    button (another tab selected) is then undone by the tab's."""
    if not page.evaluate(held_for(_KERNEL_IDLE), [quiet * 1000, timeout * 1000, None]):
        raise TimeoutError(f"the notebook kernel did not stay idle within {timeout:.0f} s")


def run_all_cells(page, *, timeout: float = 120) -> None:
    """Run > Run All Cells, then wait until every code cell shows an execution count."""
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=60_000)
    wait_for_kernel(page, timeout=60)
    page.locator(".lm-MenuBar-item", has_text="Run").first.click()
    page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()
    page.wait_for_function(
        """() => {
            const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
            return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.textContent));
        }""",
        timeout=timeout * 1000,
        polling=POLL_MS,
    )


def open_tab(page, title: str, *, root: str = ".ckpt-dashboard") -> None:
    """Click the dashboard tab whose title starts with `title`."""
    page.locator(f"{root} .ckpt-tabs .lm-TabBar-tab", has_text=title).first.click()
