"""The dashboard's static snapshot: what a saved notebook shows without a kernel.

A live dashboard is an ipywidgets view; saved and opened elsewhere (another JupyterLab,
nbviewer, GitHub) it is nothing but "model not found". So the dashboard also writes outputs
that need no kernel and survive any notebook viewer: one HTML table output with inline
styles only, one PNG per figure. How they are hidden, updated, and finished when executed
headless: docs/architecture.md, "widgets/".
"""

from __future__ import annotations

import atexit
import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from inspector.ui import facts_html, has_expert_grid, html_text, load_verdict_html, problems_html

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from .state import CheckpointState

__all__ = [
    "Snapshot",
    "figure_names",
    "headless",
    "render_pngs",
    "snapshot_figures",
    "snapshot_html",
]

# Widths of the PNG figures: wide enough for a 512-expert heatmap row to show single experts.
_WIDTH = 1200
_HIDE_WHEN_LIVE = (
    "<style>"
    ".jp-OutputArea:has(.ckpt-dashboard) .jp-OutputArea-child:has(.ckpt-snapshot),"
    ".jp-OutputArea:has(.ckpt-dashboard) .jp-OutputArea-child:has(.ckpt-snapshot)"
    " ~ .jp-OutputArea-child:has(.jp-RenderedImage),"
    ".jp-OutputArea:has(.ckpt-dashboard) .jp-OutputArea-child:has(.ckpt-snapshot)"
    " ~ .jp-OutputArea-child:has(.jp-RenderedText[data-mime-type='text/plain']){display:none}"
    ".jp-OutputArea:has(.ckpt-snapshot):not(:has(.ckpt-dashboard))"
    " .jp-OutputArea-output.jupyter-widgets{display:none}"
    "</style>"
)
_lock = threading.Lock()
_server_started = False
# Chromium's headless shell: Blink without the browser around it. Where one is installed,
# kaleido draws with it: the same PNGs byte for byte, for less than half the CPU of a full
# Chrome or Chromium, which in headless mode still opens its new-tab page and keeps the
# omnibox popup's WebUI in a renderer of its own (measured with the three figures of a demo:
# 1.1 CPU-s against 2.4, one renderer against four). Chrome for Testing's name, Debian's.
_HEADLESS_SHELLS = ("chrome-headless-shell", "chromium-headless-shell")
# What a full Chrome or Chromium need not start for kaleido, even headless: the address bar's
# popups, built as WebUI pages in a renderer of their own for a window no one sees (0.55 of
# the 2.4 CPU-s above). A headless shell has no address bar; unknown names are ignored.
_QUIET_FLAGS = ("--disable-features=WebUIOmniboxPopup,WebUIOmniboxAimPopup",)


def snapshot_html(state: CheckpointState, *, figures_note: str = "") -> str:
    """The Overview as static HTML: will it load, problems with impact and fix, facts,
    findings count."""
    s = state.scanned
    when = time.strftime("%Y-%m-%d %H:%M")
    return (
        f"{_HIDE_WHEN_LIVE}<div class='ckpt-snapshot' style='border-left:4px solid #1f77b4;"
        "padding:4px 12px;margin:4px 0'>"
        f"<div style='color:#666;font-size:12px'>Static snapshot of the checkpoint dashboard, "
        f"{html_text(when)} (saved with the notebook; run the cell for the interactive "
        "view)</div>"
        f"<h3 style='margin:6px 0'>{html_text(s.path.name)}: layout "
        f"{html_text(s.layout)}</h3>"
        + _load_html(state)
        + problems_html(s, state.findings, verdict=state.verdict)
        + facts_html(s, state.findings)
        + (f"<div style='color:#666'>{html_text(figures_note)}</div>" if figures_note else "")
        + "</div>"
    )


def _load_html(state: CheckpointState) -> str:
    if state.pending:
        return (
            "<div style='border-left:4px solid #7f7f7f;padding:4px 10px;margin:6px 0'>"
            "<b>Will it load?</b> <i>checking...</i></div>"
        )
    return load_verdict_html(state.verdict)


def snapshot_figures(state: CheckpointState) -> list[tuple[str, go.Figure]]:
    """(name, figure) of the figures the snapshot keeps: the same pure figures the dashboard
    and the HTML report draw."""
    from .figures import (
        bytes_per_layer,
        expert_coverage_heatmap,
        shard_size_distribution,
    )

    s = state.scanned
    figures = []
    if len(s.experts):  # keep in step with figure_names
        figures.append(("expert coverage", expert_coverage_heatmap(s.experts, tensors=s.tensors)))
    figures.append(("shard sizes", shard_size_distribution(s.files)))
    figures.append(("bytes per layer", bytes_per_layer(s.tensors)))
    return figures


def _browser_path() -> str | None:
    """The browser kaleido is given: a headless shell (`_HEADLESS_SHELLS`) in a folder PATH
    names by its full path, else what kaleido's own search finds (choreographer's: its
    downloaded Chrome, then a Chrome or Chromium on PATH, then their usual places), given
    as found so that kaleido does not search again; None, kaleido's own search, when there
    is none or when BROWSER_PATH names the browser to use (kaleido honours it).

    An empty or relative PATH entry (a trailing ":", ".") stands for the current folder,
    which may be a checkpoint folder someone else filled: no browser is taken from one.
    Before, a `chrome-headless-shell` planted there ran ahead of /usr/bin's shell with PATH
    ending in ":"; kaleido's own search would take a planted `chrome` the same way, so that
    answer is refused (the snapshot then says why it has no figures)."""
    if os.environ.get("BROWSER_PATH"):
        return None
    entries = os.environ.get("PATH", os.defpath).split(os.pathsep)
    search = os.pathsep.join(entry for entry in entries if os.path.isabs(entry))
    for name in _HEADLESS_SHELLS:
        if search and (path := shutil.which(name, path=search)):
            return path
    from choreographer.browsers import Chromium

    found = Chromium.find_browser(skip_local=False)
    if found and not os.path.isabs(found):
        raise RuntimeError(
            f"the browser kaleido would start, {found!r}, is found through an empty or "
            "relative PATH entry (the current folder); set BROWSER_PATH to the browser, or "
            "take that entry out of PATH"
        )
    return found


def _quiet_chromium() -> type:
    """choreographer's Chromium (what kaleido drives) started with `_QUIET_FLAGS` too."""
    from choreographer.browsers import Chromium

    class QuietChromium(Chromium):
        def get_cli(self) -> list[str]:
            return [*super().get_cli(), *_QUIET_FLAGS]

    return QuietChromium


def render_pngs(figures: list[tuple[str, go.Figure]]) -> list[bytes]:
    """The figures as PNG images, rendered by kaleido in one long-lived browser (a headless
    shell where one is installed: `_browser_path`; a full one without its address bar's
    popups: `_QUIET_FLAGS`).

    Its page evaluates the plotly.js the dashboard draws with (the cartesian bundle: 1.5 MB,
    against the 4.8 MB of all of plotly.js that kaleido takes by default, each time a kernel
    starts kaleido) and no MathJax: kaleido's default fetches it from a CDN on every start,
    and the figures hold no formula (a name written `$...$` is drawn as it is written)."""
    import kaleido

    from .plotlyjs import cartesian_bundle_file

    global _server_started
    with _lock:
        if not _server_started:
            path = _browser_path()
            kaleido.start_sync_server(
                silence_warnings=True,
                plotlyjs=cartesian_bundle_file(),
                mathjax=False,
                browser_cls=_quiet_chromium(),
                **({"path": path} if path else {}),
            )
            atexit.register(kaleido.stop_sync_server, silence_warnings=True)
            _server_started = True
        out = []
        for _, fig in figures:
            height = int(fig.layout.height or 450)
            out.append(
                kaleido.calc_fig_sync(
                    fig, opts={"format": "png", "width": _WIDTH, "height": height}
                )
            )
        return out


class Snapshot:
    """The snapshot outputs of one dashboard: shown once, updated in place on refresh. The
    PNG figures are rendered by `render_figures`, which the dashboard calls from its
    background worker once the tabs are ready (kaleido drives a browser: it should not compete
    with the first clicks)."""

    def __init__(self, *, render: Callable[[list[tuple[str, Any]]], list[bytes]] = render_pngs):
        self.render = render
        self.handles: list[Any] = []
        # What each figure's output (`handles[1:]`) shows now.
        self._figures: list[dict[str, Any]] = []
        # The last figures rendered (as plotly JSON) and their PNGs: a check of the values or
        # a re-scan of an unchanged folder makes the same figures, which kaleido's browser
        # drew again each time (two of the five renders of the lab clicks test, issue 35).
        self._rendered: tuple[list[str], list[bytes]] | None = None

    def show(
        self, state: CheckpointState, *, rendered: tuple[list[bytes], str] | None = None
    ) -> None:
        """Display the snapshot HTML and one output per figure below the widget: placeholders
        that `render_figures` fills in later, or, `rendered` (a headless run, where nothing
        would be listening later), the figures `render_now` made."""
        from IPython.display import display

        finished = rendered is not None
        pngs, note = rendered if rendered is not None else ([], "figures: rendering...")
        self.handles = [
            display(
                {"text/html": snapshot_html(state, figures_note=note)},
                raw=True,
                display_id=True,
            )
        ]
        self._figures = []
        for i, name in enumerate(figure_names(state)):
            if i < len(pngs):
                data = {"image/png": pngs[i], "text/plain": f"({name})"}
            else:
                data = {"text/plain": f"({name}: {'not rendered' if finished else 'rendering...'})"}
            self.handles.append(display(data, raw=True, display_id=True))
            self._figures.append(data)

    def update(self, state: CheckpointState) -> None:
        """Redraw the snapshot HTML for a new state (after a re-scan); figures follow."""
        if self.handles:
            self.handles[0].update(
                {"text/html": snapshot_html(state, figures_note="figures: rendering...")},
                raw=True,
            )

    def render_figures(self, state: CheckpointState, *, current: Callable[[], bool]) -> None:
        """Render the figures of `state` and put them in place (unless `current()` says a
        newer state has replaced it meanwhile)."""
        if not self.handles:
            return
        figures = snapshot_figures(state)
        pngs, note = self._render(figures)
        if not current():
            return
        self.handles[0].update({"text/html": snapshot_html(state, figures_note=note)}, raw=True)
        for i, handle in enumerate(self.handles[1:]):
            if i >= len(figures):
                break
            name = figures[i][0]
            data = (
                {"image/png": pngs[i], "text/plain": f"({name})"}
                if i < len(pngs)
                else {"text/plain": f"({name}: not rendered)"}
            )
            # An output that shows these bytes already is not sent them again.
            if data != self._figures[i]:
                handle.update(data, raw=True)
                self._figures[i] = data

    def render_now(self, state: CheckpointState) -> tuple[list[bytes], str]:
        """The figures of `state` as PNGs, and the note about them (see `_render`). They come
        from the scan alone, so a headless run renders them while the load check runs."""
        return self._render(snapshot_figures(state))

    def _render(self, figures: list[tuple[str, Any]]) -> tuple[list[bytes], str]:
        """The figures as PNGs and the note the snapshot shows about them ("" when all are
        there; why not, when kaleido or its browser failed); the last PNGs again when the
        figures are the same."""
        drawn = [figure.to_json() for _, figure in figures]
        if self._rendered is not None and self._rendered[0] == drawn:
            return list(self._rendered[1]), ""
        try:
            pngs = self.render(figures)
        except Exception as exc:  # kaleido, the browser it drives, or no browser at all
            return [], (
                f"figures not saved: {type(exc).__name__}: {exc}. They need kaleido and a "
                "Chrome or Chromium browser (pip install kaleido)."
            )
        self._rendered = (drawn, pngs)
        return pngs, ""


def headless() -> bool:
    """True when the running cell was sent by a client that no person watches: nbclient
    (`jupyter nbconvert --execute`, papermill) executes with `allow_stdin` false and stops
    listening when the last cell ends, so outputs that a thread would fill in later are
    saved unfinished. JupyterLab, Notebook and VS Code send `allow_stdin` true. False
    outside a kernel."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None:
        return False
    try:
        parent = kernel.get_parent()
    except Exception:  # an old or unusual kernel: assume a person is watching
        return False
    if not isinstance(parent, dict) or parent.get("msg_type") != "execute_request":
        return False
    return not parent.get("content", {}).get("allow_stdin", True)


def figure_names(state: CheckpointState) -> list[str]:
    """The names of the figures `snapshot_figures` returns, without building them."""
    names = ["expert coverage"] if has_expert_grid(state.scanned) else []
    return [*names, "shard sizes", "bytes per layer"]
