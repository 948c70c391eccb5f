"""The Findings tab: every finding, filtered by severity and code, a page at a time; those of
the plain checks at once, the load check's joining them when it answers."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import ipywidgets as w

from inspector.ui import code_help_html, html_text, plural

from ..controls import button, close_tree, fixed, still
from ..guard import error_html, guarded
from .rows import FindingRow

if TYPE_CHECKING:
    from inspector.ui import Finding

    from ..state import CheckpointState
    from . import Host

__all__ = ["FindingsPanel"]

_ALL = "all"
_PAGE = 25


class FindingsPanel:
    """The findings, filterable by severity and code, a page at a time; every finding links
    to its tensor, heatmap cell or file, and every shown code is explained.

    Drawn from `dash.current`: the scan's and the plain checks' findings show at once (they
    waited 3.5-7 s for the load check's child on the 1422 demo). While the load check runs, a
    slot of its own says so with a spinner; its findings then join the list (`checked`), the
    page and the filters kept, and the slot says what they added."""

    def __init__(self, dash: Host) -> None:
        self.dash = dash
        state = dash.current
        self.findings: tuple[Finding, ...] = state.findings
        self.frame = state.frame
        # Before the load check answers: the plain checks' findings, to say what it added.
        self.plain = state.findings if state.pending else None
        # A click's thread and the load check's thread may both redraw the page.
        self._drawing = threading.RLock()
        # Its controls' layouts and styles are the kernel's shared ones (`still`).
        self.severity = still(
            w.ToggleButtons,
            "ckpt-severity-filter",
            options=[_ALL, "error", "warning", "info"],
            description="severity",
        )
        self.code = still(
            w.Dropdown, "ckpt-code-filter", options=self._code_options(), description="code"
        )
        self.load = still(w.HTML, "ckpt-findings-load", value=self._load_html())
        self.rows = still(w.VBox, "ckpt-findings-table", layout={"width": "100%"})
        self.help = still(w.HTML, "ckpt-code-help")
        self.prev = button("Previous", "ckpt-page-prev", icon="chevron-left", shared=True)
        self.next = button("Next", "ckpt-page-next", icon="chevron-right", shared=True)
        self.where = still(w.HTML)
        self.start = 0
        self.prev.on_click(guarded(lambda: self.render(self.start - _PAGE), self.dash.notice))
        self.next.on_click(guarded(lambda: self.render(self.start + _PAGE), self.dash.notice))
        self.codes: tuple[str, ...] = ()
        # The rows made so far, the first ones shown: a page turned or filtered shows its
        # findings in them (`_render`), and a row is made only for a page longer than any before.
        self._rows: list[FindingRow] = []
        self._none = still(w.HTML, value="<i>No findings.</i>")
        for control in (self.severity, self.code):
            control.observe(guarded(lambda: self.render(0), dash.notice), names="value")
        self.render(0)
        self.widget = w.VBox(
            [
                w.HBox([self.severity, self.code], layout=fixed(w.Layout, flex_flow="row wrap")),
                self.load,
                self.rows,
                w.HBox(
                    [self.prev, self.next, self.where],
                    layout=fixed(w.Layout, align_items="center"),
                ),
                self.help,
            ],
            layout=w.Layout(width="100%"),
        )
        dash.when_checked(self.checked, drawn=state, failed=self.check_failed)

    def checked(self, state: CheckpointState) -> None:
        """More findings arrived (the deferred plain rules', then the load check's): list
        them with the others, on the page shown."""
        with self._drawing:
            if state.pending and self.plain is not None:
                self.plain = state.findings  # plain rules' findings: not the load check's
            self.findings, self.frame = state.findings, state.frame
            chosen, start = self.code.value, self.start
            options = self._code_options()
            # A code the load check's findings no longer hold is unset: all codes show.
            self.code.options = options
            # (Setting the options may redraw the first page: the page shown is drawn after.)
            self.code.value = chosen if chosen in {value for _, value in options} else _ALL
            self.render(start)
            self.load.value = self._load_html(done=not state.pending)

    def renew(self) -> bool:
        """Show the dashboard's state after a re-scan or a check of the values, in the
        widgets shown, as a tab built now shows it: its first page, every severity and code."""
        state = self.dash.current
        with self._drawing:
            self.plain = state.findings if state.pending else None
            self.findings, self.frame = state.findings, state.frame
            self.codes = ()
            self.code.options = self._code_options()
            self.code.value = _ALL
            self.severity.value = _ALL
            self.render(0)
            self.load.value = self._load_html()
        self.dash.when_checked(self.checked, drawn=state, failed=self.check_failed)
        return True

    def close(self) -> None:
        """Close every widget of the tab (a re-scan replaced it), the rows and the empty page's
        line too (shown or not)."""
        close_tree(self.widget)
        for part in (*(row.widget for row in self._rows), self._none):
            close_tree(part)

    def check_failed(self, exc: BaseException) -> None:
        """The load check raised (a bug): its slot says so, with the traceback behind
        "details", in place of a spinner that would turn forever."""
        self.load.value = error_html(exc, bug=True)

    def _code_options(self) -> list[tuple[str, str]]:
        codes = self.frame["code"].astype(str).value_counts()
        return [(_ALL, _ALL)] + [(f"{c} ({n})", str(c)) for c, n in sorted(codes.items())]

    def _load_html(self, *, done: bool = False) -> str:
        """The load check's slot: a spinner while it runs, then what it added."""
        if self.plain is None:
            return ""  # off, or in already when the tab was built: its findings are listed
        if not done:
            return (
                "<div class='ckpt-load-waiting' style='color:#555;padding:4px 0'>"
                "<i class='fa fa-spinner fa-spin' style='margin-right:6px'></i>"
                "Waiting for the load check: the findings below are the scan's and the "
                "structural checks'; what the load check finds joins them when it answers."
                "</div>"
            )
        before = set(self.plain)
        added = [f for f in self.findings if f not in before]
        if not added:
            return (
                "<div class='ckpt-load-done' style='color:#555;padding:4px 0'>"
                "The load check added no findings.</div>"
            )
        codes = ", ".join(sorted({f.code for f in added}))
        return (
            "<div class='ckpt-load-done' style='color:#555;padding:4px 0'>"
            f"The load check added {plural(len(added), 'finding')} ({html_text(codes)}); "
            "they are in the list.</div>"
        )

    def show_codes(self, codes: Sequence[str]) -> None:
        """Show only the findings of `codes` (one code also sets the code filter)."""
        with self._drawing:
            self.codes = tuple(codes)
            self.severity.value = _ALL
            one = codes[0] if len(codes) == 1 else _ALL
            self.code.value = one if one in {value for _, value in self.code.options} else _ALL
            self.render(0)

    def shown(self) -> list[int]:
        """Positions (in `findings`, worst first) of the findings the filters let through."""
        out = []
        for i, f in enumerate(self.findings):
            if self.severity.value != _ALL and str(f.severity) != self.severity.value:
                continue
            if self.code.value != _ALL and f.code != self.code.value:
                continue
            if self.codes and self.code.value == _ALL and f.code not in self.codes:
                continue
            out.append(i)
        return out

    def render(self, start: int = 0) -> None:
        """Redraw the page of findings that begins at `start` for the current filters."""
        with self._drawing:
            self._render(start)

    def _render(self, start: int) -> None:
        shown = self.shown()
        last = max(0, (len(shown) - 1) // _PAGE * _PAGE)
        self.start = min(max(0, start), last)
        page = shown[self.start : self.start + _PAGE]
        for at, i in enumerate(page):
            if at < len(self._rows):
                self._rows[at].show(self.findings[i])
            else:
                self._rows.append(FindingRow(self.dash, self.findings[i], detail=True))
        shown_rows = tuple(row.widget for row in self._rows[: len(page)])
        self.rows.children = shown_rows or (self._none,)
        end = self.start + len(page)
        self.where.value = f"findings {self.start + 1 if page else 0:,}-{end:,} of {len(shown):,}"
        self.prev.disabled = self.start == 0
        self.next.disabled = end >= len(shown)
        codes = sorted({self.findings[i].code for i in shown})
        self.help.value = code_help_html(codes)
