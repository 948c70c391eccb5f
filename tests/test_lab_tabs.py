"""The dashboard's tabs as a person meets them, in a real JupyterLab in headless Chromium.

The session's JupyterLab and Chromium (tests/conftest.py) run a notebook with two dashboards: a
collapsed DCP consolidation (seed 2289) whose default consolidation destination already holds
someone's files, and a small Qwen3-MoE checkpoint whose layer 3 lost experts 4-7. Then in the
page:

1. Consolidate into the occupied destination: the tab says nothing was written and how to go
   on, and no traceback shows (in a live kernel the progress Output swallowed the error);
2. Files: its figure draws its bars (made when the tab is shown, it holds its data from its
   first state: it never draws empty axes), then a grid with people's column names, sizes
   drawn "12.3 kB" that sort as bytes when the header is clicked (descending first, as
   Perspective does), and the shard the expert-missing finding names counts it;
3. Layers: both figures draw their bars, then the same grid (MTP "yes"/"no", "experts found");
4. Experts: the heatmap draws, and the zoom opens on layer 3, the faulty one;
5. Tensors: `size` sorts as bytes;
6. Repair: the plan, made when the tab is first shown.

Across all of it the page evaluated plotly.js once (`widgets.esm`) and anywidget initialised
every model in time, although the page froze for 3 s as each of the Files tab's widget models
was made (`FREEZE`): in CI a grid made while plotly.js evaluated missed anywidget's 2 s of wall
time, so its rows never came and "[anywidget] Failed to initialize model." was on the page.

Screenshots go to build/test-artifacts/tabs-*.png.
"""

from __future__ import annotations

import http.server
import json
import re
import shutil
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from browser import ARTIFACTS, POLL_MS, Lab, open_notebook, run_all_cells
from inspector.widgets.autosize import Autosize

pytestmark = pytest.mark.browser

DCP_COLLAPSED = "automodel-2289-dcp-mapping-collapsed"
NOTEBOOK = "lab-tabs/tabs.ipynb"
UNITS = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
# Freezes the page for 3 s right after anywidget starts loading a small widget module (a
# model's own `_esm`, not plotly.js or Perspective) while `window.__ckptFreezes` > 0: a busy
# page, on cue. The page's thread waits on a synchronous request that the `slow` server answers
# 3 s later: frozen as by a long script (no timer, event or message of the page runs
# meanwhile), without burning 3 s of CPU in a busy loop. Each freeze's length is kept in
# `window.__ckptFrozen` (ms).
FREEZE = """
const objectUrl = URL.createObjectURL.bind(URL);
URL.createObjectURL = (blob) => {
  const url = objectUrl(blob);
  if (window.__ckptFreezes > 0 && blob.size < 100000) {
    window.__ckptFreezes -= 1;
    queueMicrotask(() => {
      const start = performance.now();
      const request = new XMLHttpRequest();
      request.open('GET', SLOW_URL, false);
      request.send();
      window.__ckptFrozen = [...(window.__ckptFrozen || []), performance.now() - start];
    });
  }
  return url;
};
"""
FREEZE_SECONDS = 3.0


@pytest.fixture
def lab(jupyter_lab: Lab, tmp_path: Path, demo_checkpoints: Path, monkeypatch) -> Iterator[Lab]:
    """The session's JupyterLab, with this test's notebook in a folder of its own."""
    import test_report_html

    monkeypatch.setattr(test_report_html, "LOST_PART", None)  # only layer 3 is damaged
    moe = test_report_html.write_moe_checkpoint(tmp_path / "qwen3-moe-lost-experts")
    dcp = Path(shutil.copytree(demo_checkpoints / DCP_COLLAPSED, tmp_path / DCP_COLLAPSED))
    occupied = tmp_path / f"{DCP_COLLAPSED}-consolidated"  # the default destination
    occupied.mkdir()
    (occupied / "notes.txt").write_text("mine")
    root = jupyter_lab.folder("lab-tabs")
    book = nbformat.v4.new_notebook()
    book.cells = [
        nbformat.v4.new_code_cell(
            textwrap.dedent(
                f"""
                from inspector.widgets import Dashboard
                dcp = Dashboard({str(dcp)!r})
                dcp
                """
            ).strip()
        ),
        nbformat.v4.new_code_cell(f"moe = Dashboard({str(moe)!r})\nmoe"),
    ]
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nbformat.write(book, root / "tabs.ipynb")
    try:
        yield jupyter_lab
    finally:
        jupyter_lab.shut_down_kernels()


@pytest.fixture
def slow() -> Iterator[str]:
    """The URL of a server on 127.0.0.1 that answers every request FREEZE_SECONDS late."""

    class Late(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(FREEZE_SECONDS)
            self.send_response(200)
            self.send_header("Access-Control-Allow-Origin", "*")  # asked from the Lab's origin
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Late) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/freeze"
        finally:
            server.shutdown()


def test_tabs_in_jupyterlab(lab: Lab, lab_pages, slow: str):
    errors: list[str] = []
    freeze = FREEZE.replace("SLOW_URL", json.dumps(slow))
    page = open_notebook(lab_pages, lab, NOTEBOOK, errors, init_script=freeze)
    try:
        run_all_cells(page, timeout=240)
        page.wait_for_selector(".ckpt-dashboard >> nth=1", timeout=60_000)
        refused = _consolidate_refused(page)
        page.evaluate("window.__ckptFreezes = 2")  # the Files tab's figure and grid
        files = _files(page)
        frozen = page.evaluate("window.__ckptFrozen || []")
        layers = _layers(page)
        zoom = _experts(page)
        sizes = _tensor_sizes(page)
        plan = _repair_plan(page)
        plotly_modules = page.evaluate(
            "() => Object.keys(window).filter(k => k.startsWith('__ckpt_plotly_')).length"
        )
        motion = _spinner_motion(page)
    except Exception:
        _dash(page, 1).screenshot(path=str(ARTIFACTS / "tabs-failure.png"))
        raise
    finally:
        page.close()

    assert "Nothing was written" in refused["status"] and "overwrite" in refused["status"]
    assert "PlanRefusedError" in refused["status"] and not refused["traceback"]
    assert {"file", "findings", "size", "data size", "outlier"} <= set(files["headers"])
    assert "tensor_bytes" not in files["headers"] and "problems" not in files["headers"]
    assert files["sizes"] == sorted(files["sizes"], reverse=True) and len(set(files["sizes"])) > 1
    assert all(re.fullmatch(r"\d+(\.\d)? (B|kB|MB|GB)", t) for t in files["size_texts"])
    assert files["findings_of_named_shard"] > 0, files
    assert {"layer", "MTP", "experts found", "size", "findings"} <= set(layers["headers"])
    assert "is_mtp" not in layers["headers"]
    assert "Layer 3:" in zoom and "experts" in zoom
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) > 1
    assert 256 in sizes and 2000 in sizes  # 256 B below 2.0 kB: sorted by bytes, not as text
    assert files["figure"]["bars"] > 0 and "Shard sizes" in files["figure"]["title"]
    assert all(f["bars"] > 0 for f in layers["figures"]), layers["figures"]
    assert "Planning" not in plan and "when the tab is shown" not in plan, plan
    assert "This plan" in plan or "Nothing to" in plan or "No findings" in plan, plan
    assert plotly_modules == 1
    # A dashboard's spinner stands still where less motion is asked for, and turns elsewhere.
    assert motion == {"reduce": "none", "no-preference": "fa-spin"}, motion
    assert len(frozen) == 2 and min(frozen) >= FREEZE_SECONDS * 1000 - 50, frozen
    noted = ("ckpt", "plotly", "anywidget")
    assert not [e for e in errors if any(n in e.lower() for n in noted)], errors


# The autosize helper (widgets/autosize.py) drawn in a bare page inside a dashboard, then the
# dashboard changed as a tab's build changes it: rows added one change at a time, a figure
# deep in what a change adds, an element marked as a plot after it was added (as plotly
# marks its own), and a grid. Each figure's and the grid's width is then changed in turn,
# and the window's `resize` events counted after each: an observed one is followed by one.
# Also counted: how often the helper asked the whole dashboard for its figures.
_AUTOSIZE = """async (source) => {
    const pause = ms => new Promise(resolve => setTimeout(resolve, ms));
    const url = URL.createObjectURL(new Blob([source], {type: 'text/javascript'}));
    const helper = (await import(url)).default;
    const dash = document.createElement('div');
    dash.className = 'ckpt-dashboard';
    document.body.append(dash);
    const el = document.createElement('div');
    dash.append(el);
    const stop = helper.render({el});
    let queries = 0;
    const query = dash.querySelectorAll.bind(dash);
    dash.querySelectorAll = selector => { queries += 1; return query(selector); };
    let resizes = 0;
    window.addEventListener('resize', () => { resizes += 1; });
    const sized = (tag, cls) => {
        const item = document.createElement(tag);
        if (cls) item.className = cls;
        item.style.cssText = 'display:block;width:100px;height:40px';
        return item;
    };
    for (let i = 0; i < 30; i++) {
        const row = document.createElement('div');
        row.innerHTML = '<span>row ' + i + '</span>';
        dash.append(row);
        await pause(0);
    }
    const deep = document.createElement('div');
    deep.innerHTML = '<section><div></div></section>';
    const nested = sized('div', 'js-plotly-plot');
    deep.querySelector('section div').append(nested);
    dash.append(deep);
    const late = sized('div');
    dash.append(late);
    await pause(0);
    late.classList.add('js-plotly-plot');
    late.append(document.createElement('svg'));
    const grid = sized('perspective-viewer');
    let notified = 0;
    grid.notifyResize = () => { notified += 1; };
    const box = document.createElement('div');
    box.append(grid);
    dash.append(box);
    await pause(300);
    const followed = {};
    for (const [name, item] of [['nested', nested], ['late', late], ['grid', grid]]) {
        const before = resizes;
        item.style.width = '160px';
        await pause(300);
        followed[name] = resizes > before;
    }
    stop();
    return {queries, followed, notified: notified > 0};
}"""


def test_autosize_follows_each_figure_and_looks_only_at_what_changed(chromium):
    """Every figure and grid a change adds to the dashboard, or marks as a plot, is resized
    with the dashboard; and a change is looked at alone, not by asking the whole dashboard
    again (on each of the many changes while a tab is built)."""
    page = chromium.new_page()
    try:
        seen = page.evaluate(_AUTOSIZE, Autosize._esm)
    finally:
        page.close()
    assert seen["followed"] == {"nested": True, "late": True, "grid": True}, seen
    assert seen["notified"], seen
    assert seen["queries"] == 0, seen


def _spinner_motion(page) -> dict[str, str]:
    """The animation of a spinner as the dashboard shows one (`fa fa-spinner fa-spin`), with
    less motion asked for (as `lab_pages` asks) and without."""
    motion = {}
    for preference in ("no-preference", "reduce"):
        page.emulate_media(reduced_motion=preference)
        motion[preference] = page.evaluate(
            """() => {
                const spinner = document.createElement('i');
                spinner.className = 'fa fa-spinner fa-spin';
                document.querySelector('.ckpt-dashboard').append(spinner);
                const name = getComputedStyle(spinner).animationName;
                spinner.remove();
                return name;
            }"""
        )
    return motion


def _dash(page, n: int):
    return page.locator(".ckpt-dashboard").nth(n)


def _open(page, n: int, title: str) -> None:
    """Click tab `title` of dashboard `n`."""
    _dash(page, n).locator(".ckpt-tabs .lm-TabBar-tab", has_text=title).first.click()


def _shoot(page, n: int, name: str) -> None:
    dash = _dash(page, n)
    dash.scroll_into_view_if_needed()
    dash.screenshot(path=str(ARTIFACTS / name))


def _consolidate_refused(page) -> dict:
    """Consolidate the DCP checkpoint into its occupied default destination."""
    dash = _dash(page, 0)
    _open(page, 0, "Consolidate")
    dash.locator("button.ckpt-consolidate-button").click()
    status = dash.locator(".ckpt-consolidate-status", has_text="Nothing was written")
    status.wait_for(timeout=120_000)
    progress = dash.locator(".ckpt-consolidate-progress").inner_text()
    _shoot(page, 0, "tabs-consolidate-refused.png")
    return {"status": status.inner_text(), "traceback": "Traceback" in progress}


def _figure(page, css: str) -> dict:
    """What the plotly figure with CSS class `css` in the second dashboard drew, once it drew
    data: its title, its bars and its heatmap images."""
    script = """(css) => {
        const dash = document.querySelectorAll('.ckpt-dashboard')[1];
        const el = dash && dash.querySelector('.' + css);
        if (!el) return null;
        const title = el.querySelector('.gtitle');
        return {
            title: title ? title.textContent : '',
            bars: el.querySelectorAll('.barlayer .point path, .barlayer path').length,
            images: el.querySelectorAll('.heatmaplayer image').length,
        };
    }"""
    page.wait_for_function(
        f"(css) => {{ const f = ({script})(css); return f && (f.bars > 0 || f.images > 0); }}",
        arg=css,
        timeout=90_000,
        polling=POLL_MS,
    )
    return page.evaluate(script, css)


def _grid_cells(page, grid: str) -> dict:
    """Column headers and rows (cell texts) the Perspective grid with CSS class `grid` in the
    second dashboard has drawn."""
    return page.evaluate(
        """(css) => {
            const dash = document.querySelectorAll('.ckpt-dashboard')[1];
            const viewer = dash && dash.querySelector('.' + css + ' perspective-viewer');
            const dg = viewer && viewer.querySelector('perspective-viewer-datagrid');
            const table = dg && (dg.shadowRoot || dg).querySelector('regular-table');
            if (!table) return {headers: [], rows: []};
            const row = table.querySelector('thead tr:last-child');
            const headers = row ? [...row.querySelectorAll('th')].map(
                th => th.textContent.trim()) : [];
            const rows = [...table.querySelectorAll('tbody tr')].map(
                tr => [...tr.querySelectorAll('th, td')].map(td => td.textContent.trim()));
            return {headers, rows};
        }""",
        grid,
    )


def _wait_rows(page, grid: str, accept=lambda cells: True) -> dict:
    # The grid draws rows only where it is on screen (JupyterLab skips cells out of view).
    box = _dash(page, 1).locator(f".{grid}").first
    box.wait_for(state="attached", timeout=120_000)
    box.scroll_into_view_if_needed()
    page.wait_for_function(
        """(css) => {
            const dash = document.querySelectorAll('.ckpt-dashboard')[1];
            const viewer = dash && dash.querySelector('.' + css + ' perspective-viewer');
            const dg = viewer && viewer.querySelector('perspective-viewer-datagrid');
            const table = dg && (dg.shadowRoot || dg).querySelector('regular-table');
            return table && table.querySelectorAll('tbody td').length > 0;
        }""",
        arg=grid,
        timeout=90_000,
        polling=POLL_MS,
    )
    for _ in range(120):
        cells = _grid_cells(page, grid)
        if accept(cells):
            return cells
        page.wait_for_timeout(250)
    raise AssertionError(f"{grid} did not draw what was expected: {cells}")


def _column(cells: dict, name: str) -> list[str]:
    """The texts of column `name` (headers and rows may carry a row-header cell first)."""
    i = cells["headers"].index(name)
    offset = len(cells["rows"][0]) - len(cells["headers"]) if cells["rows"] else 0
    return [r[i + offset] for r in cells["rows"] if len(r) > i + offset]


def _bytes(text: str) -> float:
    number, unit = text.split()
    return float(number) * UNITS[unit]


def _click_header(page, grid: str, name: str) -> None:
    """A real mouse click on the header that sorts column `name` (Playwright's locators see
    into the datagrid's shadow root)."""
    header = _dash(page, 1).locator(f".{grid} th.psp-sort-enabled")
    header.filter(has_text=re.compile(rf"^\s*{re.escape(name)}\s*$")).first.click()


def _files(page) -> dict:
    _open(page, 1, "Files")
    figure = _figure(page, "ckpt-shard-sizes")
    grid = "ckpt-files-table"
    cells = _wait_rows(page, grid, lambda c: "size" in c["headers"] and _drawn_as_bytes(c))
    # The shard the expert-missing finding names counts it.
    named = max(int(n.replace(",", "")) for n in _column(cells, "findings"))
    _click_header(page, grid, "size")  # a first click sorts descending, by bytes
    cells = _wait_rows(page, grid, _sorted_by_size)
    texts = _column(cells, "size")
    page.screenshot(path=str(ARTIFACTS / "tabs-files.png"))
    return {
        "headers": cells["headers"],
        "size_texts": texts,
        "sizes": [_bytes(t) for t in texts],
        "findings_of_named_shard": named,
        "figure": figure,
    }


def _drawn_as_bytes(cells: dict) -> bool:
    """True once `GridCells` has drawn the size column as "10.8 kB"."""
    texts = _column(cells, "size")
    return bool(texts) and all(re.fullmatch(r"\d+(\.\d)? (B|kB|MB|GB)", t) for t in texts)


def _sorted_by_size(cells: dict) -> bool:
    """True when the rows go from the largest size to the smallest, and differ."""
    try:
        sizes = [_bytes(t) for t in _column(cells, "size")]
    except (ValueError, KeyError, IndexError):
        return False
    return sizes == sorted(sizes, reverse=True) and len(set(sizes)) > 1


def _layers(page) -> dict:
    _open(page, 1, "Layers")
    figures = [_figure(page, "ckpt-bytes-per-layer"), _figure(page, "ckpt-params-per-layer")]
    grid = "ckpt-layers-table"
    cells = _wait_rows(page, grid, lambda c: "MTP" in c["headers"])
    page.screenshot(path=str(ARTIFACTS / "tabs-layers.png"))
    return {**cells, "figures": figures}


def _experts(page) -> str:
    _open(page, 1, "Experts")
    _figure(page, "ckpt-expert-heatmap")  # its heatmap image drawn
    _figure(page, "ckpt-expert-layer")
    zoom = _dash(page, 1).locator(".ckpt-expert-layer .gtitle").first
    zoom.wait_for(timeout=60_000)
    _shoot(page, 1, "tabs-experts.png")
    return zoom.text_content() or ""


def _repair_plan(page) -> str:
    """The Repair tab's verdict once its plan is made (on the tab's first show)."""
    _open(page, 1, "Repair")
    # Done: the verdict holds text, and neither the note it was built with nor the spinner
    # of the planning. (Any div inside it matched "div:not(.ckpt-repair-planning)": the HTML
    # widget's own content div, while the spinner still showed.)
    verdict = _dash(page, 1).locator(
        ".ckpt-repair-verdict",
        has_text=re.compile(r"\S"),
        has_not=page.locator(".ckpt-repair-planning"),
        has_not_text="when the tab is shown",
    )
    verdict.wait_for(timeout=120_000)
    _shoot(page, 1, "tabs-repair.png")
    return verdict.inner_text()


def _tensor_sizes(page) -> list[float]:
    _open(page, 1, "Tensors")
    grid = "ckpt-tensor-grid"
    _wait_rows(page, grid, lambda c: "size" in c["headers"])
    _click_header(page, grid, "size")  # descending, by bytes
    cells = _wait_rows(page, grid, _sorted_by_size)
    page.screenshot(path=str(ARTIFACTS / "tabs-tensors-sorted.png"))
    return [_bytes(t) for t in _column(cells, "size")]
