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
    html_text,
    load_verdict_html,
    plural,
    problem_html,
    restore_reference,
)

from ..controls import button, classed
from ..guard import guarded
from ..state import still_checking
from .rows import examples, finding_row

if TYPE_CHECKING:
    from ..state import CheckpointState
    from . import Host

__all__ = ["OverviewPanel"]

_FINDINGS_PER_PROBLEM = 3

# The Overview is built again for each state the checks publish and never hides or restyles
# a button: its buttons share the kernel's layout and style (`controls.fixed`).
_button = partial(button, shared=True)


class OverviewPanel:
    """Issues first (what is wrong, its impact, what fixes it, with buttons that fix it or
    show it), then whether the model code would load the checkpoint, then its facts. Drawn
    from `dash.current`: while the load check runs it says so, and is redrawn when done."""

    def __init__(self, dash: Host) -> None:
        state = dash.current
        problems = state.problems
        findings = plural(len(state.findings), FINDING)
        if state.unchecked:  # the costliest rules run after the Overview shows
            so_far = f"{plural(len(problems), ISSUE)} so far" if problems else "No issues so far"
            head = (
                f"<h3 style='margin:4px 0'>{so_far} <span style='font-weight:normal;"
                f"color:#666'>({findings}; <i>{html_text(still_checking(state))}</i>)</span></h3>"
            )
        elif problems:
            head = (
                f"<h3 style='margin:4px 0'>{plural(len(problems), ISSUE)} "
                f"<span style='font-weight:normal;color:#666'>({findings})</span></h3>"
            )
        else:
            head = (
                "<h3 style='margin:4px 0;color:#2ca02c'>No issues found</h3>"
                f"<div style='color:#666'>{findings}</div>"
            )
        cards = [_problem_card(dash, p) for p in problems]
        actions = []
        if any(p.action.kind in ("repair", "reshard") for p in problems):
            fix_all = _button("Repair all", "ckpt-repair-all", style="warning", icon="wrench")
            fix_all.on_click(guarded(lambda: dash.repair(("all",)), dash.notice))
            actions.append(fix_all)
        self.widget = w.VBox(
            [
                w.HTML(head).add_class("ckpt-overview-verdict"),
                w.HBox(actions),
                _load_box(dash, state),
                *cards,
                w.HTML(facts_html(state.scanned, state.findings)).add_class("ckpt-facts"),
            ],
            layout=w.Layout(width="100%"),
        ).add_class("ckpt-overview")


def _load_box(dash: Host, state: CheckpointState) -> w.VBox:
    """ "Will it load?": the verdict in words, and a button per kind of key that shows the
    stored tensors behind it (the findings, for missing ones: no tensor holds them)."""
    if state.pending:
        text = (
            "<div class='ckpt-load' data-loads='pending' style='border-left:4px solid #7f7f7f;"
            "padding:4px 10px;margin:6px 0'><b>Will it load?</b> <i>checking: building the "
            "model config.json describes (no weights) and matching it with the stored "
            "tensors...</i></div>"
        )
        return w.VBox([w.HTML(text)]).add_class("ckpt-load-verdict")
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
    box = w.VBox(
        [w.HTML(load_verdict_html(v)), w.HBox(buttons, layout=w.Layout(flex_flow="row wrap"))],
        layout=w.Layout(width="100%"),
    )
    return box.add_class("ckpt-load-verdict")


def _tensors_button(dash: Host, label: str, css: str, names: Sequence[str]) -> w.Button:
    show = _button(label, css, icon="table")
    query = TensorQuery(names=tuple(names))
    show.on_click(guarded(lambda: dash.show_tensors(query), dash.notice))
    return show


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
        found = restore_reference(dash.scanned)
        back = _button("Restore from...", "ckpt-problem-restore", style="warning", icon="download")
        back.on_click(
            guarded(lambda: dash.restore(found.path if found is not None else ""), dash.notice)
        )
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
    if problem.cells and len(dash.scanned.experts):
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
            w.HTML(problem_html(problem)),
            w.HBox(buttons, layout=w.Layout(flex_flow="row wrap")),
            *rows,
        ],
        layout=w.Layout(
            border="1px solid #e3e3e3", padding="6px 10px", margin="4px 0", width="100%"
        ),
    )
