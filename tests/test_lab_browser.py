"""JupyterLab in headless Chromium: run the repair notebook, see the dashboard, repair by clicking.

Starts a real JupyterLab (local only, random port and token) on a temp copy of notebooks/, opens
02-repair-an-index-that-forgot-mtp.ipynb, runs all cells from the Run menu, checks that the
dashboard draws the expert heatmap and the findings table, clicks Repair then Confirm in the
page, and checks ON DISK that the index now lists the MTP tensors. Screenshots go to
test-artifacts/dashboard-*.png. In CI (env CI set) missing browser tooling fails, never skips.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, sync_playwright_or_fail

from inspector.checks import check
from inspector.scan import scan

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "02-repair-an-index-that-forgot-mtp.ipynb"
# The notebook's dashboard works on this copy of the demo (see its first cells).
DASHBOARD_COPY = "02-dashboard"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_server(url: str, process: subprocess.Popen, log: Path, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"JupyterLab exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    pytest.fail(
        f"JupyterLab did not answer {url} within {timeout:.0f} s:\n{log.read_text()[-3000:]}"
    )


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """A running JupyterLab on a temp copy of notebooks/: (base URL, token, work dir)."""
    from inspector.demo import write_demos

    demo, work, root = tmp_path / "demo", tmp_path / "work", tmp_path / "notebooks"
    write_demos(demo, log=lambda _line: None)
    shutil.copytree(ROOT / "notebooks", root)
    token, port = secrets.token_hex(16), _free_port()
    env = {
        **os.environ,
        "CKPT_DEMO_DIR": str(demo),
        "CKPT_WORK_DIR": str(work),
        # Settings, workspaces and runtime files of this server stay in the temp folder.
        "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "lab-settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "lab-workspaces"),
    }
    # No "get notified about Jupyter news?" toast over the screenshots (and no fetch of news).
    notification = tmp_path / "lab-settings" / "@jupyterlab" / "apputils-extension"
    notification.mkdir(parents=True)
    (notification / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    log = tmp_path / "jupyterlab.log"
    command = [
        sys.executable, "-m", "jupyter", "lab", "--no-browser",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]  # fmt: skip
    if os.geteuid() == 0:  # containers run tests as root; JupyterLab refuses that by default
        command.append("--allow-root")
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for_server(f"{base}/api/status?token={token}", process, log, timeout=60)
        yield base, token, work
    finally:
        _stop(process)


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


def test_repair_by_clicking_in_jupyterlab(lab: tuple[str, str, Path]):
    sync_playwright = sync_playwright_or_fail()
    base, token, work = lab
    ARTIFACTS.mkdir(exist_ok=True)
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            # Only the local server: nothing may be fetched from elsewhere.
            page.route(
                "**/*",
                lambda route: (
                    route.continue_() if route.request.url.startswith(base) else route.abort()
                ),
            )
            page.goto(f"{base}/lab/tree/{NOTEBOOK}?token={token}", wait_until="domcontentloaded")
            try:
                _run_all_cells(page)
                heatmap_cells = _open_experts(page)
                findings = _open_drift(page)
                result_text = _repair_by_clicking(page)
            except Exception:
                page.screenshot(path=str(ARTIFACTS / "dashboard-failure.png"))
                raise
        finally:
            browser.close()

    assert heatmap_cells > 0
    assert findings >= 1
    assert "Repaired." in result_text and "model.safetensors.index.json" in result_text
    # On disk: the index and the last sidecar list the MTP tensors, a backup is kept.
    copy = work / DASHBOARD_COPY
    index = json.loads((copy / "model.safetensors.index.json").read_text())
    assert any(name.startswith("mtp.") for name in index["weight_map"])
    backups = list((copy / ".ckpt-inspect-backup").iterdir())
    assert len(backups) == 1 and (backups[0] / "model.safetensors.index.json").is_file()
    old = json.loads((backups[0] / "model.safetensors.index.json").read_text())
    assert not any(name.startswith("mtp.") for name in old["weight_map"])
    assert check(scan(copy)) == []
    assert not [e for e in errors if "ckpt" in e or "plotly" in e.lower()], errors


def _run_all_cells(page) -> None:
    """Run > Run All Cells, then wait until the kernel is idle and every cell has run."""
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=60_000)
    _wait_for_kernel(page, timeout=60)
    page.locator(".lm-MenuBar-item", has_text="Run").first.click()
    page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()
    page.wait_for_function(
        """() => {
            const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
            return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.textContent));
        }""",
        timeout=90_000,
    )
    page.wait_for_selector(".ckpt-dashboard", timeout=30_000)
    outputs = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    tracebacks = [t for t in outputs.all_inner_texts() if "Traceback" in t or "Error" in t]
    assert not tracebacks, tracebacks
    page.screenshot(path=str(ARTIFACTS / "dashboard-notebook.png"))


def _wait_for_kernel(page, *, timeout: float) -> None:
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
    pytest.fail(f"the notebook kernel did not become idle within {timeout:.0f} s")


def _shoot(page, name: str) -> None:
    """A screenshot of the whole dashboard widget (scrolled into view)."""
    dashboard = page.locator(".ckpt-dashboard")
    dashboard.scroll_into_view_if_needed()
    dashboard.screenshot(path=str(ARTIFACTS / name))


def _tab(page, title: str) -> None:
    page.locator(".ckpt-tabs .lm-TabBar-tab", has_text=title).first.click()


def _open_experts(page) -> int:
    """Open the Experts tab; return the number of cells the drawn heatmap holds."""
    _tab(page, "Overview")
    page.locator(".ckpt-overview", has_text="unindexed-tensor").wait_for(timeout=30_000)
    _shoot(page, "dashboard-overview.png")
    _tab(page, "Experts")
    heatmap = page.locator(".ckpt-expert-heatmap")
    heatmap.locator(".heatmaplayer image").first.wait_for(state="attached", timeout=60_000)
    # A click on a cell reaches the kernel (FigureWidget.on_click) and lists that expert.
    heatmap.locator(".nsewdrag").first.click()
    details = page.locator(".ckpt-expert-details", has_text="tensors (")
    details.wait_for(timeout=30_000)
    assert "mlp.experts." in details.inner_text()
    _shoot(page, "dashboard-experts.png")
    # The z matrix plotly.js drew (the plot div keeps its full data).
    return page.evaluate(
        """() => {
            const root = document.querySelector('.ckpt-expert-heatmap');
            const plot = [root, ...root.querySelectorAll('div')].find(e => e._fullData);
            const z = plot._fullData[0].z;
            return Array.from(z).reduce((n, row) => n + Array.from(row).length, 0);
        }"""
    )


def _open_drift(page) -> int:
    """Open the Drift tab; return the number of finding rows in the table."""
    _tab(page, "Drift")
    rows = page.locator(".ckpt-findings-table tr.finding")
    rows.first.wait_for(timeout=30_000)
    codes = {rows.nth(i).get_attribute("data-code") for i in range(min(rows.count(), 50))}
    assert "unindexed-tensor" in codes, codes
    _shoot(page, "dashboard-drift.png")
    return rows.count()


def _repair_by_clicking(page) -> str:
    """Repair tab: click Repair, then Confirm; return the result text shown after refresh."""
    _tab(page, "Repair")
    page.locator("button.ckpt-repair-button").click()
    confirm = page.locator("button.ckpt-confirm-button")
    confirm.wait_for(state="visible", timeout=15_000)
    _shoot(page, "dashboard-confirm.png")
    confirm.click()
    result = page.locator(".ckpt-repair-result", has_text="Repaired.")
    result.wait_for(timeout=60_000)
    _shoot(page, "dashboard-repaired.png")
    return result.inner_text()
