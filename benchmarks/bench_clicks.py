"""The dashboard clicked through in-process, no kernel and no browser: how many widget models
it opens and closes, how many updates it sends, and the CPU it spends, for the click-through
of tests/test_lab_clicks.py (every tab once, then every enabled button of every tab, then the
header's Re-scan) on the demo `modelopt-1422-sidecar-drift`.

Each widget model is a `comm_open` the page turns into a model and a view (and a `comm_close`
when it is closed), each update a message the page applies: the page's main thread paid
2.8 s for about 4,000 of them per click-through (issue 35). Where each model was made is
counted by the function of `widgets/` that made it.

The clicks follow the lab test's order: in each tab the buttons a click revealed first, else
the last one, the Values tab's "Sample values" first; a button that leads to another tab is
followed back. Toggle buttons (a filter, an option of a row of them) are clicked as buttons.

    .venv/bin/python benchmarks/bench_clicks.py [--top 25] [--no-model]

Run it on two trees (each with its own venv) to compare them; a counter, not a timer: the
CPU seconds are printed with the load average.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import resource
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import ipywidgets as w

_HERE = Path(__file__).resolve()
# The lab clicks test's demo and click order (tests/click_order.py).
sys.path.insert(0, str(_HERE.parent.parent / "tests"))
from click_order import DEMO, next_click  # noqa: E402


class Counts:
    """Widget models opened and closed, and updates sent, by phase and by origin."""

    def __init__(self) -> None:
        self.phase = "start"
        self.opened: collections.Counter[str] = collections.Counter()
        self.closed: collections.Counter[str] = collections.Counter()
        self.updates: collections.Counter[str] = collections.Counter()
        self.origins: collections.Counter[str] = collections.Counter()
        self.kinds: collections.Counter[str] = collections.Counter()
        self.alive: set[int] = set()
        self._lock = threading.Lock()

    def install(self) -> None:
        open_, close, send = w.Widget.open, w.Widget.close, w.Widget.send_state
        counts = self

        def opening(self: w.Widget) -> None:
            fresh = self.comm is None
            open_(self)
            if fresh:
                with counts._lock:
                    counts.opened[counts.phase] += 1
                    counts.alive.add(id(self))
                    counts.origins[_origin()] += 1
                    counts.kinds[type(self).__name__] += 1

        def closing(self: w.Widget) -> None:
            if self.comm is not None:
                with counts._lock:
                    if id(self) in counts.alive:
                        counts.closed[counts.phase] += 1
                        counts.alive.discard(id(self))
            close(self)

        def sending(self: w.Widget, key: Any = None) -> None:
            if key is not None and self.comm is not None:
                with counts._lock:
                    counts.updates[counts.phase] += 1
            send(self, key)

        w.Widget.open = opening  # type: ignore[method-assign]
        w.Widget.close = closing  # type: ignore[method-assign]
        w.Widget.send_state = sending  # type: ignore[method-assign]


def _origin() -> str:
    """The innermost function of the project's widgets (not its shared controls) on the stack."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        path = Path(frame.filename)
        if (
            "widgets" in path.parts
            and path.name not in ("controls.py",)
            and "ipywidgets" not in (path.parts)
        ):
            parent = path.parent.name
            where = f"{parent}/{path.stem}" if parent == "tabs" else path.stem
            return f"{where}:{frame.name}"
    return "(other)"


def _visible_buttons(root: w.Widget) -> list[tuple[str, w.Widget, Any]]:
    """(label, widget, option) of every button a person sees in `root`, in page order."""
    found: list[tuple[str, w.Widget, Any]] = []

    def walk(node: w.Widget) -> None:
        layout = getattr(node, "layout", None)
        if layout is not None and getattr(layout, "display", None) == "none":
            return
        if isinstance(node, w.Button):
            found.append((node.description or node.tooltip or "", node, None))
        elif isinstance(node, w.ToggleButton):
            found.append((node.description, node, None))
        elif isinstance(node, w.ToggleButtons):
            for label, value in zip(node._options_labels, node._options_values, strict=True):
                found.append((label, node, value))
        for child in getattr(node, "children", ()):
            walk(child)

    walk(root)
    return found


def _disabled(widget: w.Widget) -> bool:
    return bool(getattr(widget, "disabled", False))


def _click(widget: w.Widget, option: Any) -> None:
    if isinstance(widget, w.Button):
        widget.click()
    elif isinstance(widget, w.ToggleButton):
        widget.value = not widget.value
    else:
        widget.value = option


def _settle(dash: Any) -> None:
    """Until no thread the dashboard started for a click or a tab is running."""
    time.sleep(0.02)
    for _ in range(3000):
        busy = [
            t
            for t in threading.enumerate()
            if t.name.startswith(("ckpt-build", "ckpt-prebuild", "ckpt-load-verdict"))
            and t.is_alive()
        ]
        engine = getattr(dash.panels.get("Serve"), "engine_thread", None)
        if engine is not None and engine.is_alive():
            busy.append(engine)
        if not busy:
            return
        for t in busy:
            t.join(0.05)


def _pane(dash: Any, title: str) -> w.Widget:
    return dash.tab.children[dash.TABS.index(title)]


def _select(dash: Any, title: str) -> None:
    """A click on the tab (what the page sends: the selected index)."""
    dash.tab.selected_index = dash.TABS.index(title)
    _settle(dash)


def _click_buttons(dash: Any, title: str) -> list[str]:
    """The lab test's `_click_buttons`, in-process."""
    done: list[str] = []
    before: set[str] = set()
    for _ in range(40):
        if dash.TABS[dash.tab.selected_index or 0] != title:
            _select(dash, title)
        buttons = _visible_buttons(_pane(dash, title))
        enabled = [label for label, widget, _ in buttons if not _disabled(widget)]
        label = next_click(title, enabled, done, before)
        if label is None:
            break
        before = set(enabled)
        done.append(label)
        widget, option = next((wi, o) for lab, wi, o in buttons if lab == label)
        try:
            _click(widget, option)
        except Exception as exc:  # shown in the page as an error box; counted here
            print(f"  {title} -> {label!r}: {type(exc).__name__}: {exc}", file=sys.stderr)
        _settle(dash)
    return done


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=25, help="origins listed")
    parser.add_argument("--no-model", action="store_true", help="without the load check")
    args = parser.parse_args()

    from inspector.widgets import Dashboard

    from inspector._internal.demo.safetensors_layouts import SAFETENSORS_DEMOS
    from inspector._internal.load.engine import ENGINE_PROCESS

    stand_in = _HERE.parent.parent / "tests" / "engine_stand_in.py"
    ENGINE_PROCESS.command = [sys.executable, str(stand_in)]
    counts = Counts()
    counts.install()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / DEMO
        folder.mkdir()
        next(d for d in SAFETENSORS_DEMOS if d.name == DEMO).write(folder)
        started, wall = _cpu(), time.monotonic()
        phases: list[tuple[str, float]] = [("start", started)]

        def phase(name: str) -> None:
            phases.append((name, _cpu()))
            counts.phase = name

        dash = Dashboard(
            folder,
            report_dir=Path(tmp) / "reports",
            progress=False,
            snapshot=False,
            model=not args.no_model,
        )
        dash.worker_delay = 0
        dash._start_worker()  # what displaying it starts (the tabs built ahead of a click)
        _settle(dash)
        phase("first clicks")
        for title in dash.TABS:
            _select(dash, title)
        dash.wait(120)
        clicked: dict[str, list[str]] = {}
        for title in dash.TABS:
            phase(f"buttons {title}")
            clicked[title] = _click_buttons(dash, title)
        phase("re-scan")
        dash.rescan.click()
        _settle(dash)
        dash.wait(120)
        phase("close")
        if hasattr(dash, "close"):
            dash.close()
        else:  # a tree from before `Dashboard.close`: its panels, as a re-scan closed them
            from inspector.widgets.dashboard import _close

            for panel in list(dash.panels.values()):
                _close(panel)
        phases.append(("", _cpu()))
        cpu, seconds = _cpu() - started, time.monotonic() - wall

    print(f"{'phase':<22}{'opened':>8}{'closed':>8}{'updates':>9}{'CPU-s':>8}")
    for (name, cpu0), (_, cpu1) in itertools.pairwise(phases):
        print(
            f"{name:<22}{counts.opened[name]:>8}{counts.closed[name]:>8}"
            f"{counts.updates[name]:>9}{cpu1 - cpu0:>8.2f}"
        )
    opened, closed = sum(counts.opened.values()), sum(counts.closed.values())
    print(
        f"{'total':<22}{opened:>8}{closed:>8}{sum(counts.updates.values()):>9}{cpu:>8.2f}"
        f"   (wall {seconds:.1f} s; open at the end {len(counts.alive)})"
    )
    print(f"\nwhere the models were made (top {args.top}):")
    for origin, n in counts.origins.most_common(args.top):
        print(f"{n:>6}  {origin}")
    print("\nby kind:", ", ".join(f"{k} {n}" for k, n in counts.kinds.most_common(12)))
    print("\nclicked:")
    for title, labels in clicked.items():
        print(f"  {title}: {', '.join(labels)}")
    print(f"\nload average {' '.join(os.getloadavg().__repr__().strip('()').split(', '))}")


if __name__ == "__main__":
    main()
