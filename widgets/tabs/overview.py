"""The Overview tab: the issues (what is wrong, its impact, what fixes it, with buttons that fix
or show it), whether the model code would load the checkpoint, then its facts.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

import ipywidgets as w

from inspector.ui import (
    FINDING,
    ISSUE,
    Problem,
    TensorQuery,
    facts_html,
    has_expert_grid,
    html_text,
    load_verdict_html,
    plural,
    problem_html,
    restore_reference,
)

from ..controls import button, classed, close_tree, fixed, still
from ..guard import guarded
from ..state import still_checking
from .rows import examples, finding_row

if TYPE_CHECKING:
    from ..state import CheckpointState
    from . import Host

__all__ = ["OverviewPanel"]

_FINDINGS_PER_PROBLEM = 3

# The Overview never hides or restyles a button: its buttons share the kernel's layout and
# style (`controls.fixed`).
_button = partial(button, shared=True)


class OverviewPanel:
    """Issues first (what is wrong, its impact, what fixes it, with buttons that fix it or
    show it), then whether the model code would load the checkpoint, then its facts. Drawn
    from `dash.current` and updated in place as the checks publish more (`update`): only a
    part whose content changed is sent again, an issue's card is made once and closed when
    the issue goes, and a state that changes nothing shown sends nothing (issue 35: the
    Overview was built whole again for each state, its old widgets never closed)."""

    def __init__(self, dash: Host) -> None:
        self.dash = dash
        self.head = classed(w.HTML, "ckpt-overview-verdict")
        self.actions = w.HBox()
        self.load = classed(w.VBox, "ckpt-load-verdict", layout=w.Layout(width="100%"))
        self.facts = classed(w.HTML, "ckpt-facts")
        # The card of each issue shown, with the issue (a frozen value: an issue whose findings
        # or action changed is another issue, and gets a card of its own).
        self.cards: list[tuple[Problem, w.VBox]] = []
        self._fix_all: w.Button | None = None
        # The load verdict the load box shows (`None` and pending: the spinner's words).
        self._verdict: tuple[bool, object] | None = None
        # How many states changed something shown (a test counts them).
        self.redrawn = 0
        self.widget = classed(w.VBox, "ckpt-overview", layout=w.Layout(width="100%"))
        state = dash.current
        self.update(state)
        dash.when_checked(self.update, drawn=state)

    def update(self, state: CheckpointState) -> None:
        """Show `state`: the parts it changes are sent again, nothing when it changes none."""
        dash = self.dash
        problems = state.problems
        changed = False
        head = _head_html(state)
        facts = facts_html(state.scanned, state.findings)
        if (head, facts) != (self.head.value, self.facts.value):
            self.head.value, self.facts.value = head, facts
            changed = True
        fix = any(p.action.kind in ("repair", "reshard") for p in problems)
        if fix and self._fix_all is None:
            self._fix_all = _button("Repair all", "ckpt-repair-all", style="warning", icon="wrench")
            self._fix_all.on_click(guarded(lambda: dash.repair(("all",)), dash.notice))
        actions = (self._fix_all,) if fix and self._fix_all is not None else ()
        if self.actions.children != actions:
            self.actions.children = actions
            changed = True
        verdict = (state.pending, state.verdict)
        old_load: tuple[w.Widget, ...] = ()
        if self._verdict is None or (
            self._verdict[0] != verdict[0] or self._verdict[1] is not verdict[1]
        ):
            self._verdict = verdict
            old_load = self.load.children
            self.load.children = _load_parts(dash, state)
            changed = True
        kept: dict[Problem, list[w.VBox]] = {}
        for problem, card in self.cards:
            kept.setdefault(problem, []).append(card)
        self.cards = [
            (p, kept[p].pop() if kept.get(p) else _problem_card(dash, p)) for p in problems
        ]
        gone = [card for left in kept.values() for card in left]
        children = (self.head, self.actions, self.load, *(c for _, c in self.cards), self.facts)
        if self.widget.children != children:
            self.widget.children = children
            changed = True
        # Closed once no box shows them (a closed widget still shown is a view of a model the
        # page no longer has).
        for part in (*old_load, *gone):
            close_tree(part)
        self.redrawn += changed

    def renew(self) -> bool:
        """Show the dashboard's state after a re-scan or a check of the values, in place (an
        issue it still has keeps its card), and what the checks publish for it."""
        state = self.dash.current
        self.update(state)
        self.dash.when_checked(self.update, drawn=state)
        return True

    def close(self) -> None:
        """Close every widget of the panel (a re-scan replaced it)."""
        if self._fix_all is not None:
            close_tree(self._fix_all)
        close_tree(self.widget)


def _head_html(state: CheckpointState) -> str:
    """How many issues and findings, or that none were found; what still runs."""
    problems = state.problems
    findings = plural(len(state.findings), FINDING)
    if state.unchecked:  # the costliest rules run after the Overview shows
        so_far = f"{plural(len(problems), ISSUE)} so far" if problems else "No issues so far"
        return (
            f"<h3 style='margin:4px 0'>{so_far} <span style='font-weight:normal;"
            f"color:#666'>({findings}; <i>{html_text(still_checking(state))}</i>)</span></h3>"
        )
    if problems:
        return (
            f"<h3 style='margin:4px 0'>{plural(len(problems), ISSUE)} "
            f"<span style='font-weight:normal;color:#666'>({findings})</span></h3>"
        )
    return (
        "<h3 style='margin:4px 0;color:#2ca02c'>No issues found</h3>"
        f"<div style='color:#666'>{findings}</div>"
    )


def _load_parts(dash: Host, state: CheckpointState) -> tuple[w.Widget, ...]:
    """ "Will it load?": the verdict in words, and a button per kind of key that shows the
    stored tensors behind it (the findings, for missing ones: no tensor holds them)."""
    if state.pending:
        text = (
            "<div class='ckpt-load' data-loads='pending' style='border-left:4px solid #7f7f7f;"
            "padding:4px 10px;margin:6px 0'><b>Will it load?</b> <i>checking: building the "
            "model config.json describes (no weights) and matching it with the stored "
            "tensors...</i></div>"
        )
        return (still(w.HTML, value=text),)
    v = state.verdict
    buttons: list[w.Button] = []
    if v is not None and v.ran:
        if v.missing:
            missing = _button(f"Missing ({len(v.missing):,})", "ckpt-load-missing", icon="list")
            missing.on_click(
                guarded(lambda: dash.show_findings(("load-missing-tensor",)), dash.notice)
            )
            buttons.append(missing)
        kinds = (
            ("Another shape", "ckpt-load-mismatched", [m.key for m in v.mismatched]),
            ("Unexpected", "ckpt-load-unexpected", list(v.unexpected)),
        )
        for label, css, keys in kinds:
            if keys:
                names = tuple(dict.fromkeys(n for k in keys for n in v.sources.get(k, (k,))))
                buttons.append(_tensors_button(dash, f"{label} ({len(keys):,})", css, names))
        if v.mtp_skipped:
            label = f"MTP skipped ({len(v.mtp_skipped):,})"
            buttons.append(_tensors_button(dash, label, "ckpt-load-mtp", v.mtp_skipped))
    return (
        still(w.HTML, value=load_verdict_html(v)),
        w.HBox(buttons, layout=fixed(w.Layout, flex_flow="row wrap")),
    )


def _tensors_button(dash: Host, label: str, css: str, names: Sequence[str]) -> w.Button:
    show = _button(label, css, icon="table")
    query = TensorQuery(names=tuple(names))
    show.on_click(guarded(lambda: dash.show_tensors(query), dash.notice))
    return show


def _reference(dash: Host) -> str:
    """The candidate reference to restore lost tensors from ("" when none is known)."""
    found = restore_reference(dash.scanned)
    return found.path if found is not None else ""


def _problem_card(dash: Host, problem: Problem) -> w.VBox:
    """A problem: its text, a button per way to act on it, and its first findings as links."""
    buttons: list[w.Button] = []
    action = problem.action
    if action.kind == "repair":
        fix = _button(
            f"Repair: {', '.join(action.parts)}",
            "ckpt-problem-repair",
            style="warning",
            icon="wrench",
        )
        fix.on_click(guarded(lambda: dash.repair(action.parts), dash.notice))
        buttons.append(fix)
    elif action.kind == "restore" and " --from " in action.command:
        back = _button("Restore from...", "ckpt-problem-restore", style="warning", icon="download")
        # The reference of the scan shown when clicked: a card outlives a re-scan (`renew`).
        back.on_click(guarded(lambda: dash.restore(_reference(dash)), dash.notice))
        buttons.append(back)
    elif action.kind == "reshard":
        split = _button("Repair: reshard", "ckpt-problem-reshard", style="warning", icon="wrench")
        split.on_click(guarded(lambda: dash.repair(("all",)), dash.notice))
        buttons.append(split)
    elif action.kind == "consolidate":
        go = _button("Consolidate...", "ckpt-problem-consolidate", icon="compress")
        go.on_click(guarded(lambda: dash.select("Consolidate"), dash.notice))
        buttons.append(go)
    if problem.tensors:
        names = problem.tensors
        show = _button(f"Tensors ({len(names):,})", "ckpt-problem-tensors", icon="table")
        show.on_click(guarded(lambda: dash.show_tensors(TensorQuery(names=names)), dash.notice))
        buttons.append(show)
    if problem.cells and has_expert_grid(dash.scanned):
        layer, expert = problem.cells[0]
        cell = _button("On the heatmap", "ckpt-problem-heatmap", icon="th")
        cell.on_click(guarded(lambda: dash.show_cell(layer, expert), dash.notice))
        buttons.append(cell)
    codes = problem.codes
    listing = _button(f"Findings ({len(problem.findings):,})", "ckpt-problem-findings", icon="list")
    listing.on_click(guarded(lambda: dash.show_findings(codes), dash.notice))
    buttons.append(listing)
    rows = [finding_row(dash, f) for f in examples(problem.findings, _FINDINGS_PER_PROBLEM)]
    return classed(
        w.VBox,
        "ckpt-problem",
        f"ckpt-problem-{problem.key}",
        children=[
            still(w.HTML, value=problem_html(problem)),
            w.HBox(buttons, layout=fixed(w.Layout, flex_flow="row wrap")),
            *rows,
        ],
        layout=fixed(
            w.Layout, border="1px solid #e3e3e3", padding="6px 10px", margin="4px 0", width="100%"
        ),
    )
