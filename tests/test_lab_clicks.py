"""Every tab and every button of the dashboard, clicked as a newcomer clicks them (issue 34).

The session's JupyterLab and Chromium (tests/conftest.py) run a one-cell notebook: the
dashboard on a copy of the demo `modelopt-1422-sidecar-drift` (387 tensors, MoE layers, MTP
tensors the index forgot). Then, with one kernel for the whole test:

1. every tab is clicked once, left to right: within a few seconds it shows its frame (its
   panel, or the spinner that stands for it while it is built), and no error box, traceback
   or "widget model not found" appears. Each first click's time to frame and to content (the
   panel with its figures drawn and the rows of each grid in sight painted: a body cell
   holding text, which the screenshots show painted as soon as it exists; the grid's
   preview of its first rows or its viewer's), and to every grid's viewer drawn, is
   measured in the page, from the tab's pointerdown: printed and written to
   build/test-artifacts/first-clicks.txt, never asserted (a shared machine's load decides
   them); one screenshot per tab, clicks-<tab>.png, taken when the viewers have drawn;
2. then in each tab every enabled button is clicked once (buttons a click reveals, such as
   Confirm, too), the same checks after each click. The Tensors grid is drawn before the
   Values tab's "Sample values" is clicked, as in issue 34's crash report ("Cannot delete
   table with views"): any error there fails the test. (With the fix of widgets/grid.py and
   widgets/browser.py taken out, this flow passed on 29 Nov: closing the grid widget let go
   of the page's view in time. The held view itself is reproduced in-process by
   test_values.py::test_sample_values_after_the_tensors_grid_was_drawn.)
3. last, the header's Re-scan.

The Serve tab's "vLLM's own verdict" asks a stand-in child (tests/engine_stand_in.py), not
vLLM: the test checks that the button starts the check in its thread and that its answer
reaches the tab; vLLM's own answers, through that button too, are tested against the real
engine in tests/test_engines.py.

A click whose answer is a refusal the tab explains (an error box a person is meant to read)
is listed in REFUSALS with the words it must show; any other error box fails the test.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest
from browser import (
    ARTIFACTS,
    POLL_MS,
    Lab,
    held_for,
    open_notebook,
    open_tab,
    run_all_cells,
)
from click_order import DEMO, next_click
from engine_stand_in import SKIPPED
from inspector.widgets import Dashboard

pytestmark = pytest.mark.browser

NOTEBOOK = "lab-clicks/clicks.ipynb"
TABS = Dashboard.TABS
# How long a tab may take to show its frame (a spinner at least) before the test fails: far
# above issue 34's 0.3 s aim, so that only a tab that shows nothing fails on a loaded machine.
FRAME_LIMIT = 15.0
# How long a tab's content, or a click's work, is waited for before the next click.
CONTENT_WAIT = 90.0
# Where a click's error box is a refusal the tab explains, and the words it must hold: on a
# checkpoint with no candidate reference the restore field is empty, and planning a restore
# (Plan restore) asks for one; Plan again then plans the repair. Consolidate offers
# no button its plan refuses (the test below).
REFUSALS = {
    "Repair -> ": "name the checkpoint to restore from",
}
# The button a tab's clicks begin with: "Sample values" while the Tensors grid drawn by the
# first clicks is still on the page (a check of the values rebuilds every tab, so after
# "Read all values" the grid would be a new one, not yet drawn).
# The child the Serve tab's "vLLM's own verdict" starts, in place of vLLM's (whose import is
# about 20 s of CPU); the words of its answer, shown in the tab when the check has run.
STAND_IN = Path(__file__).with_name("engine_stand_in.py")
ENGINE_BUTTON = "vLLM's own verdict"

# The dashboard's tab pane now shown, and what it holds: a spinner, a bug's or a refusal's
# error box, and whether its grids and figures are drawn.
_PANE = """() => {
    const dash = document.querySelector('.ckpt-dashboard');
    const tabs = dash && dash.querySelector('.ckpt-tabs');
    if (!tabs) return null;
    const contents = tabs.querySelector(':scope > .widget-tab-contents') || tabs;
    const pane = [...contents.children].find(
        c => c.offsetParent !== null && !c.classList.contains('lm-TabBar'));
    const selected = tabs.querySelector('.lm-TabBar-tab.lm-mod-current');
    if (!pane) return {selected: selected && selected.textContent.trim(), shown: false};
    const visible = el => el.offsetParent !== null;
    // What a person sees without scrolling: the notebook's scrolled area within the window.
    const view = (document.querySelector('.jp-WindowedPanel-outer') || document.documentElement)
        .getBoundingClientRect();
    const seen = el => {
        const r = el.getBoundingClientRect();
        return r.height > 0 && r.bottom > Math.max(view.top, 0)
            && r.top < Math.min(view.bottom, window.innerHeight);
    };
    // Every grid of the pane in sight (`.ckpt-grid-box`: its controls and its grid's slot)
    // has its rows painted: its viewer's table has a body cell holding text (the table makes
    // its cells before it fills them). A slot with no viewer yet (the grid widget's view
    // waits for its module and the table) is not drawn: counting the viewers alone took the
    // empty slot for a drawn grid, 1.5 s where the rows came 5-7 s after the click.
    const boxes = [...pane.querySelectorAll('.ckpt-grid-box')].filter(seen);
    const drawn = boxes.every(box => {
        const viewers = [...box.querySelectorAll('perspective-viewer')];
        return viewers.length > 0 && viewers.every(v => {
            const dg = v.querySelector('perspective-viewer-datagrid');
            const table = dg && (dg.shadowRoot || dg).querySelector('regular-table');
            const cells = table ? [...table.querySelectorAll('tbody td')] : [];
            return cells.some(td => td.textContent.trim());
        });
    });
    // Or its first rows, which the grid's widget shows while its viewer starts (the
    // kernel's preview: widgets/grid.py, `preview_html`).
    const rows = drawn || boxes.every(box => [...box.querySelectorAll('.ckpt-grid-preview td')]
        .filter(visible).some(td => td.textContent.trim()));
    // Every figure drawn: none still waiting for plotly.js's module (a figure's own
    // "loading" line; a grid's stands beside its preview rows, which count as content), and
    // every plot with its SVG. (The figures' place holder is `.ckpt-not-drawn`, below.)
    const plots = [...pane.querySelectorAll('.js-plotly-plot')].filter(visible);
    const loadingFigures = [...pane.querySelectorAll('.ckpt-module-loading')].filter(visible)
        .filter(el => !el.closest('.ckpt-grid-box'));
    const plotted = loadingFigures.length === 0 && plots.every(p => p.querySelector('.main-svg'));
    const spinner = [...pane.querySelectorAll('.ckpt-tab-loading')].some(visible);
    // A grid's or the figures' place holder ("drawn when the tab is shown") is not content.
    const waiting = [...pane.querySelectorAll('.ckpt-not-drawn')].some(visible);
    return {
        selected: selected && selected.textContent.trim(),
        shown: pane.getBoundingClientRect().height > 0 && pane.innerText.trim().length > 0,
        spinner,
        content: !spinner && !waiting && rows && plotted && pane.innerText.trim().length > 0,
        live: !spinner && !waiting && drawn && plotted && pane.innerText.trim().length > 0,
    };
}"""

# Set before a tab's first click: from the tab's pointerdown, the times (ms) at which its
# pane first shows something (its frame), its content (a grid's first rows, its preview or
# its viewer's) and its content with every grid's viewer drawn, polled every 10 ms.
_WATCH = (
    """([title, limit]) => {
    const pane = PANE;
    window.__ckptWatch = new Promise(resolve => {
        let start = null, frame = null, content = null;
        const down = event => {
            const tab = event.target.closest && event.target.closest('.lm-TabBar-tab');
            if (tab && tab.textContent.trim().startsWith(title)) start = performance.now();
        };
        document.addEventListener('pointerdown', down, true);
        const poll = setInterval(() => {
            if (start === null) return;
            const now = performance.now(), seen = pane();
            const current = seen && seen.selected && seen.selected.startsWith(title);
            if (current && seen.shown && frame === null) frame = now - start;
            if (current && seen.content && content === null) content = now - start;
            if ((current && seen.live) || now - start > limit) {
                clearInterval(poll);
                document.removeEventListener('pointerdown', down, true);
                resolve({frame, content, grid: current && seen.live ? now - start : null,
                         spinner: seen && seen.spinner});
            }
        }, 10);
    });
}"""
).replace("PANE", _PANE)

# The shown pane (as _PANE) and whether the status bar says the kernel is idle: one round
# trip per poll.
_IDLE = """() => {
    const pane = (PANE)();
    const status = document.querySelector('#jp-main-statusbar');
    return pane && {...pane, idle: !!status && status.innerText.includes('Idle')};
}""".replace("PANE", _PANE)

# The Overview shows the load check's verdict (no longer "checking").
_VERDICT_SHOWN = """() => {
    const dash = document.querySelector('.ckpt-dashboard');
    return !!dash && !!dash.querySelector('[data-loads]')
        && !dash.querySelector("[data-loads='pending']");
}"""

# How many times the notebook's kernel went idle since the count began (`_handled`).
_HANDLED = """() => {
    const context = window.jupyterapp.shell.currentWidget.sessionContext;
    if (window.__ckptHandled === undefined) {
        window.__ckptHandled = 0;
        context.statusChanged.connect((_, status) => {
            if (status === 'idle') window.__ckptHandled += 1;
        });
    }
    return window.__ckptHandled;
}"""

# Resolves once a click has settled: the kernel handled a message since `mark` (any, when
# null), then for `quiet` ms it stayed idle and the shown pane held no spinner; or after `wait`
# ms. Polled every 50 ms in the page (one round trip per click).
_SETTLE = held_for(
    """(mark) => {
    const handled = HANDLED_JS, pane = (PANE_IDLE_JS)();
    return (mark === null || handled() > mark) && !!pane && pane.idle && !pane.spinner;
}""".replace("HANDLED_JS", _HANDLED).replace("PANE_IDLE_JS", _IDLE)
)

# Text on the page that means a widget or the kernel failed.
_BROKEN = """() => {
    const dash = document.querySelector('.ckpt-dashboard');
    const visible = el => el.offsetParent !== null;
    const boxes = [...dash.querySelectorAll('.ckpt-error')].filter(visible)
        .map(el => el.innerText.trim());
    const stderr = [...document.querySelectorAll(
        ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")]
        .map(el => el.innerText).filter(t => /Traceback|Error/.test(t));
    const text = document.body.innerText;
    return {
        boxes,
        tracebacks: stderr.concat(/Traceback \\(most recent call last\\)/.test(text) ?
            ['Traceback on the page'] : []),
        lost: /model not found/i.test(text) ? ['widget model not found'] : [],
    };
}"""


@dataclass
class ClickedThrough:
    """What clicking every tab and button showed (see the module docstring)."""

    times: dict[str, dict] = field(default_factory=dict)
    # (where, what): error boxes, tracebacks, lost widget models, after each click.
    broken: list[tuple[str, str]] = field(default_factory=list)
    clicked: dict[str, list[str]] = field(default_factory=dict)
    # Each tab's visible buttons left disabled after its buttons were clicked.
    disabled: dict[str, list[str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    # What the Serve tab shows once the check its engine button started has answered.
    engine: str = ""


@pytest.fixture(scope="module")
def clicked_through(jupyter_lab: Lab, lab_pages, demo_checkpoints: Path) -> ClickedThrough:
    """Every tab, then every button, clicked once in one page on one kernel."""
    seen = ClickedThrough()
    _write_notebook(jupyter_lab, demo_checkpoints)
    page = open_notebook(lab_pages, jupyter_lab, NOTEBOOK, seen.errors)
    page.on(
        "console",
        lambda msg: seen.errors.append(msg.text) if "model not found" in msg.text.lower() else None,
    )
    trace: list[str] = []
    try:
        run_all_cells(page, timeout=180)
        page.wait_for_selector(".ckpt-dashboard .ckpt-tabs", timeout=60_000)
        for title in TABS:
            seen.times[title] = _first_click(page, title)
            seen.broken += _broken(page, f"tab {title}")
        # The buttons once the load check has answered: no tab waits for it any more, and
        # the Overview it redraws (from its thread: the kernel shows idle meanwhile) took the
        # tab back from a click on its buttons.
        page.wait_for_function(_VERDICT_SHOWN, timeout=CONTENT_WAIT * 1000, polling=POLL_MS)
        _settle(page)
        for title in TABS:
            seen.clicked[title] = _click_buttons(page, title, seen.broken, trace)
            seen.disabled[title] = [b["label"] for b in _buttons(page) if b["disabled"]]
            if title == "Serve":  # before a repair's re-scan builds the tab again
                seen.engine = _engine_answer(page)
        _settle(page)
        mark = _handled(page)
        page.locator(".ckpt-dashboard .ckpt-rescan-button").first.click()
        _settle(page, mark)
        seen.broken += _broken(page, "Re-scan")
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "clicks-failure.png"), full_page=True)
        raise
    finally:
        _write_times(seen, trace)
        page.close()
        jupyter_lab.shut_down_kernels()
    return seen


def test_every_tab_and_button_shows_no_error(clicked_through: ClickedThrough):
    seen = clicked_through
    slow = {t: v for t, v in seen.times.items() if v["frame"] is None or v["frame"] > FRAME_LIMIT}
    assert slow == {}, f"tabs that showed neither their frame nor a spinner: {slow}"
    unexplained = [
        f"{where}: {what}"
        for where, what in seen.broken
        if not any(where.startswith(w) and words in what for w, words in REFUSALS.items())
    ]
    assert unexplained == [], "\n".join(unexplained)
    # After a refused restore, Plan again plans the repair (it repeated the refusal).
    assert [w for w, _ in seen.broken if w == "Repair -> 'Plan again'"] == [], seen.broken
    assert [e for e in seen.errors if "model not found" in e.lower()] == [], seen.errors
    # The Tensors grid was drawn before "Sample values" was clicked (its table once crashed).
    assert seen.times["Tensors"]["grid"] is not None, seen.times
    assert seen.clicked["Values"][0] == "Sample values", seen.clicked["Values"]
    assert {"Repair", "Confirm"} <= set(seen.clicked["Repair"]), seen.clicked["Repair"]
    assert all(seen.clicked[t] for t in ("Tensors", "Findings", "Report")), seen.clicked
    # The engine button started the check in its thread, and its answer reached the tab.
    assert ENGINE_BUTTON in seen.clicked["Serve"], seen.clicked["Serve"]
    assert SKIPPED in seen.engine, seen.engine


def test_consolidate_offers_no_button_its_plan_refuses(clicked_through: ClickedThrough):
    refused = [(w, t) for w, t in clicked_through.broken if w.startswith("Consolidate ->")]
    assert refused == [], refused


def _write_notebook(lab: Lab, demo_checkpoints: Path) -> None:
    """This test's notebook: the dashboard on a copy of DEMO (the buttons repair it and write
    reports beside it)."""
    root = lab.folder("lab-clicks")
    copy = Path(shutil.copytree(demo_checkpoints / DEMO, root / DEMO))
    book = nbformat.v4.new_notebook()
    book.cells = [
        # The Serve tab's "vLLM's own verdict" asks the stand-in (the button's work is under
        # test here, not vLLM's answer: tests/test_engines.py).
        nbformat.v4.new_code_cell(
            "import sys\n"
            "from inspector._internal.load.engine import ENGINE_PROCESS\n"
            f"ENGINE_PROCESS.command = [sys.executable, {str(STAND_IN)!r}]"
        ),
        nbformat.v4.new_code_cell(
            "from inspector.widgets import Dashboard\n"
            f"dash = Dashboard({str(copy)!r}, report_dir={str(root / 'reports')!r})\n"
            "dash"
        ),
    ]
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nbformat.write(book, root / "clicks.ipynb")


def _first_click(page, title: str) -> dict:
    """Click tab `title` for the first time; its times to frame and content in seconds."""
    page.evaluate(_WATCH, [title, CONTENT_WAIT * 1000])
    open_tab(page, title)
    seen = page.evaluate("window.__ckptWatch")
    result = {
        "frame": None if seen["frame"] is None else seen["frame"] / 1000,
        "content": None if seen["content"] is None else seen["content"] / 1000,
        "grid": None if seen["grid"] is None else seen["grid"] / 1000,
        "spinner": seen["spinner"],
    }
    _shoot(page, f"clicks-{title.lower()}.png")
    return result


def _buttons(page) -> list[dict]:
    """The visible buttons of the tab pane now shown: {"label", "disabled"} each."""
    return page.evaluate(
        """() => {
            const tabs = document.querySelector('.ckpt-dashboard .ckpt-tabs');
            const contents = tabs.querySelector(':scope > .widget-tab-contents') || tabs;
            const pane = [...contents.children].find(
                c => c.offsetParent !== null && !c.classList.contains('lm-TabBar'));
            if (!pane) return [];
            return [...pane.querySelectorAll('button.jupyter-button')]
                .filter(b => b.offsetParent !== null)
                .map(b => ({label: b.innerText.trim() || b.title, disabled: b.disabled}));
        }"""
    )


def _click_buttons(page, title: str, broken: list[tuple[str, str]], trace: list[str]) -> list[str]:
    """Click each enabled button of tab `title` once, and those a click reveals or enables
    (Confirm, right after Repair); return the labels clicked. A button that leads to
    another tab is followed back."""
    done: list[str] = []
    before: set[str] = set()
    for _ in range(40):
        mark = _handled(page)
        if _reopen(page, title):
            _settle(page, mark)
        buttons = _buttons(page)
        trace.append(
            f"{title}: "
            + ", ".join(b["label"] + (" (disabled)" if b["disabled"] else "") for b in buttons)
        )
        enabled = [b["label"] for b in buttons if not b["disabled"]]
        label = next_click(title, enabled, done, before)
        if label is None:
            break
        before = set(enabled)
        done.append(label)
        mark = _handled(page)
        _click_in(page, title, label)
        _settle(page, mark)
        broken += _broken(page, f"{title} -> {label!r}")
    return done


def _click_in(page, title: str, label: str) -> None:
    """Click button `label` of tab `title`. A click's work runs in a thread the kernel does
    not show as busy, so a button that leads to another tab (show tensor) may switch tabs
    after the settle ended and the tab was opened again: then the tab is opened once more and
    the click tried again (each try waits at most 10 s for the button)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    exact = re.compile(rf"^\s*{re.escape(label)}\s*$")
    for attempt in range(3):
        # The shown pane: the tab contents' children, then the visible one. (A `:visible` in
        # the CSS made Playwright test the visibility of every element of the page, shadow
        # roots included, before the combinators: about 10 CPU-s of the page over the
        # clicks, against a native query and one visibility check per pane.)
        children = page.locator(".ckpt-dashboard .ckpt-tabs > .widget-tab-contents > *")
        pane = children.filter(visible=True)
        try:
            pane.locator("button.jupyter-button", has_text=exact).first.click(timeout=10_000)
            return
        except PlaywrightTimeout:
            if attempt == 2:
                raise
            _reopen(page, title)
            _settle(page)


def _reopen(page, title: str) -> bool:
    """Tab `title`, selected again if a button led elsewhere (then True)."""
    current = page.locator(".ckpt-dashboard .ckpt-tabs .lm-TabBar-tab.lm-mod-current").first
    if (current.text_content() or "").strip().startswith(title):
        return False
    open_tab(page, title)
    return True


def _handled(page) -> int:
    """How many messages the notebook's kernel has handled since the count began: its
    status's changes to idle (ipykernel says busy, then idle, around each message it handles,
    a widget's click included), counted in the page (`Lab` exposes JupyterLab's app)."""
    return page.evaluate(_HANDLED)


def _settle(page, mark: int | None = None) -> None:
    """Until the kernel has handled a message since `_handled` gave `mark` (the click's), then
    stayed idle for 0.3 s while the shown tab held no spinner (a click's work is done, or
    shown as under way; a message it leads to has come in), at most CONTENT_WAIT."""
    page.evaluate(_SETTLE, [300, CONTENT_WAIT * 1000, mark])


def _engine_answer(page) -> str:
    """The Serve tab's engine output once the stand-in's answer is in it (the button's
    thread may still wait for it when the last click settles), at most CONTENT_WAIT."""
    script = "() => (document.querySelector('.ckpt-serve-engine-out') || {}).textContent || ''"
    page.wait_for_function(
        f"(words) => ({script})().includes(words)",
        arg=SKIPPED,
        timeout=CONTENT_WAIT * 1000,
        polling=POLL_MS,
    )
    return page.evaluate(script)


def _broken(page, where: str) -> list[tuple[str, str]]:
    """What on the page says a widget or the kernel failed, as (where, what)."""
    found = page.evaluate(_BROKEN)
    return [(where, what) for what in found["boxes"] + found["tracebacks"] + found["lost"]]


def _shoot(page, name: str) -> None:
    dashboard = page.locator(".ckpt-dashboard").first
    dashboard.scroll_into_view_if_needed()
    dashboard.screenshot(path=str(ARTIFACTS / name))


def _write_times(seen: ClickedThrough, trace: list[str]) -> None:
    """Print the first clicks' times and write them, with the buttons each tab showed after
    each click, to build/test-artifacts/first-clicks.txt."""

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} s"

    lines = [
        "first click: time to frame (panel or spinner), to content (drawn: a grid's first"
        " rows) and to every grid's viewer drawn",
        "",
    ]
    lines.append("tab             frame   content      grid   buttons clicked")
    for title, times in seen.times.items():
        buttons = ", ".join(seen.clicked.get(title, []))
        frame, content, grid = (seconds(times[k]) for k in ("frame", "content", "grid"))
        lines.append(f"{title:<12} {frame:>8}  {content:>8}  {grid:>8}   {buttons}")
    lines += ["", "buttons shown before each click:", *trace]
    lines += ["", "error boxes:", *(f"{where}: {what}" for where, what in seen.broken)]
    text = "\n".join(lines) + "\n"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "first-clicks.txt").write_text(text)
    print(text)
