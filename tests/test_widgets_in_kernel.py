"""The dashboard's error paths and its saved snapshot in a real kernel (nbclient, ipykernel).

Outside a kernel ipywidgets behaves differently in the two ways that matter here: an
`Output` context (`with out:`) swallows the exception raised in it only when IPython runs,
and a button's handler error reaches the page only if the handler shows it. So these tests
run the dashboard in an ipykernel started by nbclient, click its buttons there (`click()`
dispatches to the same handlers as the frontend's click message) and read what the widgets
then show, printed by the cell.

The second half executes a notebook headless (nbclient, and `jupyter nbconvert --execute`
as a person would) and checks the snapshot it saved: the finished one, not "checking...".
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytest.importorskip("ipywidgets")

DRIFT = "modelopt-1422-sidecar-drift"
DCP_COLLAPSED = "automodel-2289-dcp-mapping-collapsed"


@pytest.fixture
def demos(demo_checkpoints: Path) -> Path:
    return demo_checkpoints


def _notebook(*cells: str) -> nbformat.NotebookNode:
    book = nbformat.v4.new_notebook()
    book.cells = [nbformat.v4.new_code_cell(textwrap.dedent(c).strip()) for c in cells]
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    return book


def _execute(book: nbformat.NotebookNode, cwd: Path) -> nbformat.NotebookNode:
    NotebookClient(
        book, kernel_name="python3", timeout=240, resources={"metadata": {"path": str(cwd)}}
    ).execute()
    return book


def _printed(cell: nbformat.NotebookNode) -> dict:
    """The JSON object the cell printed last."""
    text = "".join(o.text for o in cell.outputs if o.output_type == "stream")
    return json.loads(text.strip().splitlines()[-1])


def test_errors_inside_output_contexts_reach_the_panel_in_a_live_kernel(
    demos: Path, tmp_path: Path
):
    """A refused consolidation, a re-scan of a folder that is gone and a dashboard on a
    missing path: each says what went wrong where the person looks, in the core's words,
    and the dashboard stays usable. (Whether a traceback shows in the progress area only
    a page can tell: tests/test_lab_browser.py looks.)"""
    folder = shutil.copytree(demos / DCP_COLLAPSED, tmp_path / DCP_COLLAPSED)
    book = _notebook(
        f"""
        import json, shutil
        from pathlib import Path
        from inspector.widgets import Dashboard
        folder = Path({str(folder)!r})
        dash = Dashboard(folder, snapshot=False)
        dash.wait()

        def by_class(widget, css):  # the widgets under `widget` with CSS class `css`
            found = [widget] if css in getattr(widget, "_dom_classes", ()) else []
            for child in getattr(widget, "children", ()):
                found += by_class(child, css)
            return found
        """,
        # The default destination holds someone else's files: the plan is refused.
        """
        form = dash.select("Consolidate")
        dest = Path(form.dest.value)
        dest.mkdir()
        (dest / "notes.txt").write_text("mine")
        form.run.click()
        print(json.dumps({"status": form.status.value, "disabled": form.run.disabled,
                          "dest": sorted(p.name for p in dest.iterdir())}))
        """,
        # The folder vanished: the re-scan fails, the dashboard keeps what it showed.
        """
        shutil.move(str(folder), str(folder) + "-moved")
        by_class(dash.widget, "ckpt-rescan-button")[0].click()
        notice = "".join(w.value for w in by_class(dash.widget, "ckpt-notice"))
        print(json.dumps({"notice": notice, "files": len(dash.current.scanned.files)}))
        """,
        # A dashboard on a path that does not exist raises the core's error, not a crash
        # about a missing state.
        """
        try:
            Dashboard(folder, snapshot=False)
        except Exception as exc:
            error = type(exc).__name__ + ": " + str(exc)
        print(json.dumps({"error": error}))
        """,
    )
    _execute(book, tmp_path)
    consolidate, rescan, missing = (_printed(c) for c in book.cells[1:])
    assert "PlanRefusedError" in consolidate["status"], consolidate
    assert "Nothing was written" in consolidate["status"], consolidate
    assert "tick <b>overwrite</b>" in consolidate["status"]
    assert consolidate["disabled"] is False
    assert consolidate["dest"] == ["notes.txt"]
    assert "ckpt-error" in rescan["notice"] and DCP_COLLAPSED in rescan["notice"], rescan
    assert rescan["files"] > 0
    assert missing["error"].startswith("CannotInspectError"), missing
    assert DCP_COLLAPSED in missing["error"]
    errors = [o for c in book.cells for o in c.outputs if o.output_type == "error"]
    assert errors == []


# -- a notebook executed headless saves the finished snapshot ---------------------------------


def _snapshot_outputs(book: nbformat.NotebookNode) -> tuple[str, int]:
    """The saved snapshot's HTML and how many PNG figures were saved with it."""
    outputs = [o for c in book.cells if c.cell_type == "code" for o in c.outputs]
    html = [
        "".join(o["data"]["text/html"])
        for o in outputs
        if "text/html" in o.get("data", {}) and "ckpt-snapshot" in "".join(o["data"]["text/html"])
    ]
    assert len(html) == 1, f"{len(html)} snapshots saved"
    return html[0], sum("image/png" in o.get("data", {}) for o in outputs)


def _dashboard_notebook(folder: Path) -> nbformat.NotebookNode:
    return _notebook(
        f"from inspector.widgets import Dashboard\nDashboard({str(folder)!r})",
        "print('the cell after the dashboard')",
    )


def _assert_finished(snapshot: str, pngs: int) -> None:
    assert "checking..." not in snapshot and "rendering..." not in snapshot
    assert "data-loads='yes'" in snapshot  # the model code's verdict, not "pending"
    assert "42 MTP tensors" in snapshot and "figures not saved" not in snapshot
    assert pngs == 3  # expert coverage, shard sizes, bytes per layer


def test_nbclient_run_saves_the_finished_snapshot(demos: Path, tmp_path: Path):
    book = _execute(_dashboard_notebook(demos / DRIFT), tmp_path)
    _assert_finished(*_snapshot_outputs(book))


@pytest.mark.browser
def test_nbconvert_execute_saves_the_finished_snapshot_and_its_html_shows_it(
    demos: Path, tmp_path: Path
):
    """What a person runs in CI or a batch job: `jupyter nbconvert --execute`, then the HTML
    export opened in Chromium (no network: the widget manager cannot load, the snapshot is
    what shows)."""
    from browser import ARTIFACTS, launch_chromium, sync_playwright_or_fail

    sync_playwright = sync_playwright_or_fail()
    source = tmp_path / "dashboard.ipynb"
    nbformat.write(_dashboard_notebook(demos / DRIFT), source)
    jupyter = [sys.executable, "-m", "jupyter", "nbconvert"]
    subprocess.run(
        [*jupyter, "--to", "notebook", "--execute", "--output", "executed.ipynb", str(source)],
        check=True,
        cwd=tmp_path,
        capture_output=True,
        timeout=300,
    )
    executed = nbformat.read(tmp_path / "executed.ipynb", as_version=4)
    _assert_finished(*_snapshot_outputs(executed))
    subprocess.run(
        [*jupyter, "--to", "html", str(tmp_path / "executed.ipynb")],
        check=True,
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
    )
    page_file = tmp_path / "executed.html"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = launch_chromium(pw)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
            page.route(
                "**/*",
                lambda route: (
                    route.continue_() if route.request.url.startswith("file://") else route.abort()
                ),
            )
            page.goto(page_file.as_uri(), wait_until="load")
            snapshot = page.locator(".ckpt-snapshot").first
            snapshot.wait_for(state="visible", timeout=30_000)
            text = " ".join(snapshot.inner_text().split())
            shown = page.evaluate(
                "() => [...document.querySelectorAll('.jp-RenderedImage img, .output_png img')]"
                ".filter(img => img.complete && img.naturalWidth > 0 && img.offsetParent)"
                ".length"
            )
            page.screenshot(path=str(ARTIFACTS / "headless-snapshot-nbconvert.png"), full_page=True)
        finally:
            browser.close()
    assert "Will it load? yes" in text and "checking" not in text, text
    assert "rendering" not in text and shown == 3
