"""JupyterLab in headless Chromium: run the repair notebook, see the dashboard, repair by clicking.

Starts a real JupyterLab (local only, random port and token) on a temp copy of notebooks/, opens
02-repair-an-index-that-forgot-mtp.ipynb, runs all cells from the Run menu, checks that the
dashboard draws the expert heatmap and the findings table, clicks Repair then Confirm in the
page, and checks ON DISK that the index now lists the MTP tensors. Screenshots go to
test-artifacts/dashboard-*.png. In CI (env CI set) missing browser tooling fails, never skips.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    run_all_cells,
    running_lab,
    sync_playwright_or_fail,
)

from inspector.checks import check
from inspector.scan import scan

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "02-repair-an-index-that-forgot-mtp.ipynb"
# The notebook's dashboard works on this copy of the demo (see its first cells).
DASHBOARD_COPY = "02-dashboard"


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """A running JupyterLab on a temp copy of notebooks/: (base URL, token, work dir)."""
    from inspector.demo import write_demos

    demo, work, root = tmp_path / "demo", tmp_path / "work", tmp_path / "notebooks"
    write_demos(demo, log=lambda _line: None)
    shutil.copytree(ROOT / "notebooks", root)
    env = {"CKPT_DEMO_DIR": str(demo), "CKPT_WORK_DIR": str(work)}
    with running_lab(root, tmp_path / "lab", env=env) as server:
        yield server.base, server.token, work


def test_repair_by_clicking_in_jupyterlab(lab: tuple[str, str, Path]):
    sync_playwright = sync_playwright_or_fail()
    base, token, work = lab
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
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
    """Run every cell; no cell may print a traceback."""
    run_all_cells(page, timeout=90)
    page.wait_for_selector(".ckpt-dashboard", timeout=30_000)
    outputs = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    tracebacks = [t for t in outputs.all_inner_texts() if "Traceback" in t or "Error" in t]
    assert not tracebacks, tracebacks
    page.screenshot(path=str(ARTIFACTS / "dashboard-notebook.png"))


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
