"""The dashboard's error paths in a real kernel (nbclient, ipykernel).

Outside a kernel ipywidgets behaves differently in the two ways that matter here: an
`Output` context (`with out:`) swallows the exception raised in it only when IPython runs,
and a button's handler error reaches the page only if the handler shows it. So these tests
run the dashboard in an ipykernel started by nbclient, click its buttons there (`click()`
dispatches to the same handlers as the frontend's click message) and read what the widgets
then show, printed by the cell.

A notebook executed headless (nbclient, which `jupyter nbconvert --execute` and papermill
run) saves the finished snapshot: tests/test_notebooks.py checks it on every example notebook
it executes, and opens one exported to HTML in Chromium.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError

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


# A cell's longest wait for its reply. The whole notebook runs in about 11 s alone and under a
# minute on a loaded machine; a reply that never comes (a fresh-clone CI run once waited about
# 9 minutes with the kernel idle) fails here, saying which cell and what the kernel was doing.
CELL_SECONDS = 90


def _execute(book: nbformat.NotebookNode, cwd: Path) -> nbformat.NotebookNode:
    """Run every cell in a fresh ipykernel (nbclient). The kernel writes its threads' stacks to
    a file every third of CELL_SECONDS; a cell out of time fails with the last of them."""
    stacks = cwd / "kernel-stacks.txt"
    first = book.cells[0]
    first.source = (
        # The file stays referenced: faulthandler writes to its descriptor, which a closed file
        # would hand to the next socket the kernel opens.
        f"import faulthandler as _fh\n_stacks = open({str(stacks)!r}, 'w')\n"
        f"_fh.dump_traceback_later({CELL_SECONDS / 3}, repeat=True, file=_stacks)\n" + first.source
    )
    client = NotebookClient(
        book,
        kernel_name="python3",
        timeout=CELL_SECONDS,
        startup_timeout=60,
        resources={"metadata": {"path": str(cwd)}},
    )
    try:
        client.execute()
    except CellTimeoutError:
        ran = [i for i, c in enumerate(book.cells) if "shell.execute_reply" in c.metadata.get(
            "execution", {})]  # fmt: skip
        waited = len(ran)
        dump = stacks.read_text(errors="replace")[-4000:] if stacks.exists() else "(none)"
        pytest.fail(
            f"cell {waited} had no reply from the kernel in {CELL_SECONDS} s (cells {ran} "
            f"replied); the kernel's threads, last dump:\n{dump}"
        )
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
        # The load check's work in this kernel (its answer parsed and checked with; the whole
        # check for a remote checkpoint) starts once the Overview's messages are sent, not
        # while the kernel still sends them; its child process is not started before either
        # (started with the scan, its imports slowed the Overview).
        """
        import time
        from IPython.display import display
        import inspector._internal.load.child as load_child
        import inspector.widgets.dashboard as dashboard
        load_child._CHILD.close()
        real, started = dashboard.verdict_apart, []
        def spy(*args, **kwargs):
            started.append(time.monotonic())
            return real(*args, **kwargs)
        dashboard.verdict_apart = spy
        shown = Dashboard(Path(str(folder) + "-moved"), snapshot=False, wait=False)
        time.sleep(0.5)
        before = len(started)
        child_before = load_child._CHILD._process is not None
        display(shown)
        shown.wait()
        print(json.dumps({"before": before, "after": len(started),
                          "pending": shown.current.pending, "child_before": child_before}))
        """,
    )
    _execute(book, tmp_path)
    consolidate, rescan, missing, held = (_printed(c) for c in book.cells[1:])
    assert "PlanRefusedError" in consolidate["status"], consolidate
    assert "Nothing was written" in consolidate["status"], consolidate
    assert "tick <b>overwrite</b>" in consolidate["status"]
    assert consolidate["disabled"] is False
    assert consolidate["dest"] == ["notes.txt"]
    assert "ckpt-error" in rescan["notice"] and DCP_COLLAPSED in rescan["notice"], rescan
    assert rescan["files"] > 0
    assert missing["error"].startswith("CannotInspectError"), missing
    assert DCP_COLLAPSED in missing["error"]
    assert held == {"before": 0, "after": 1, "pending": False, "child_before": False}, held
    errors = [o for c in book.cells for o in c.outputs if o.output_type == "error"]
    assert errors == []
