"""The Repair tab: the repair plan as words and a diff, what it fixes and what it leaves, and
Confirm to write it. Each button is one call into `inspector`; errors the core raises on
purpose are shown in the panel.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from inspector.ui import (
    InspectorError,
    RepairPlan,
    RestorePlan,
    diff_html,
    findings_html,
    findings_to_frame,
    html_text,
    plan_all,
    plan_repair,
    plan_restore,
    plural,
    preview_repair,
    restore_reference,
    scan,
    severity_badge,
    text_html,
)

from ..controls import button, fixed, hidden, still
from ..guard import EXPECTED_ERRORS, error_html, guarded

if TYPE_CHECKING:
    from . import Host

__all__ = ["RepairPanel"]

# A button of the panel is never hidden or restyled: its layout and style are shared.
_button = partial(button, shared=True)

# ipywidgets treats a None value as "nothing selected", so "" stands for "no policy".
_DUPLICATES = [
    ("refuse (decide yourself)", ""),
    ("keep the first shard's copy", "first"),
    ("keep the last shard's copy", "last"),
    ("keep the index's choice", "index"),
]


class RepairPanel:
    """The repair plan as words and a diff, and what it fixes: the findings the plan resolves
    and those it cannot (with what would fix them), from `preview_repair` re-checking the
    checkpoint as the plan leaves it. By default the plan is every part at once
    (`inspector._internal.plans.repair_all.plan_all`), so what is left is never the next part of the
    same repair; lost tensors are restored from a reference
    (`inspector._internal.plans.restore.plan_restore`, the field pre-filled with the candidate
    `inspector._internal.diagnosis.references` knows). Repair is enabled only when the plan fixes an
    error or a warning (or writes tensors back); it asks for confirmation, executes the plan, shows
    what was written and where the backups are, and refreshes the dashboard.

    The plan is made when the tab is first shown (`on_shown`), by the thread the tab click
    started, with a spinner meanwhile: on 300,000 tensors planning and re-checking takes
    seconds of the kernel's time, which a person who never opens the tab should not pay."""

    _PARTS = ("index", "sidecars", "quant-config")

    def __init__(self, dash: Host) -> None:
        self.dash = dash
        self.plan: Any = None
        self.preview: Any = None
        # Whether a plan was made (or is being made); the lock keeps two threads (a tab
        # click's and a button's) from planning at once.
        self.planned = False
        self._planning = threading.RLock()
        # Counts plans made and executed: a re-check that ends after either is dropped.
        self._round = 0
        self.parts: tuple[str, ...] = ()
        # The reference `repair --from` copies lost tensors from (None: a repair plan).
        self.restoring: str | None = None
        # Its controls' layouts and styles are the kernel's shared ones (`still`, `button`
        # with `shared`): only the confirmation's box is ever hidden.
        self.duplicates = still(w.Dropdown, options=_DUPLICATES, description="duplicates")
        self.quant = still(
            w.Checkbox, description="also rebuild hf_quant_config.json", indent=False
        )
        self.scope = still(w.HTML, "ckpt-repair-scope")
        self.verdict = still(w.HTML, "ckpt-repair-verdict")
        self.result = still(w.HTML, "ckpt-repair-result")
        all_parts = _button("Repair all", "ckpt-plan-all", icon="expand")
        all_parts.on_click(guarded(lambda: self.use_parts(()), self.verdict))
        self.source = still(
            w.Text,
            "ckpt-restore-source",
            placeholder="a checkpoint that holds the lost tensors (folder or URL)",
            description="restore from",
            layout={"width": "60%"},
        )
        restore = _button("Plan restore", "ckpt-plan-restore", icon="download")
        restore.on_click(guarded(lambda: self.use_restore(self.source.value.strip()), self.verdict))
        replan = _button("Plan again", "ckpt-plan-button", icon="refresh")
        replan.on_click(guarded(lambda: self.make_plan(), self.verdict))
        self.plan_view = still(w.HTML, "ckpt-repair-plan")
        self.repair = _button("Repair", "ckpt-repair-button", style="warning", icon="wrench")
        self.repair.on_click(guarded(lambda: self.ask(), self.verdict))
        self.question = still(w.HTML, "ckpt-confirm-question")
        self.confirm = _button("Confirm", "ckpt-confirm-button", style="danger", icon="check")
        self.confirm.on_click(guarded(lambda: self.execute(), self.result))
        self.cancel = _button("Cancel", "ckpt-cancel-button")
        self.cancel.on_click(guarded(lambda: self.ask(cancel=True), self.verdict))
        self.confirm_box = w.VBox(
            [self.question, w.HBox([self.confirm, self.cancel], layout=fixed(w.Layout))]
        )
        wrap = fixed(w.Layout, flex_flow="row wrap", align_items="center")
        self.widget = w.VBox(
            [
                self.result,
                w.HBox([self.scope, all_parts], layout=wrap),
                w.HBox([self.duplicates, self.quant, replan], layout=wrap),
                w.HBox([self.source, restore], layout=wrap),
                self.verdict,
                w.HBox([self.repair], layout=fixed(w.Layout)),
                self.confirm_box,
                self.plan_view,
            ],
            layout=w.Layout(width="100%"),
        )
        self.renew()

    def renew(self) -> bool:
        """The panel as a tab built now shows it (after a re-scan, the repair's included),
        in the widgets shown: no plan (showing the tab plans), the options at their first
        values, the last repair's result."""
        with self._planning:
            self._round += 1  # a re-check under way is dropped
            self.plan, self.preview, self.planned = None, None, False
            self.parts, self.restoring = (), None
            self.duplicates.value, self.quant.value = "", False
            candidate = restore_reference(self.dash.scanned)
            self.source.value = candidate.path if candidate is not None else ""
            self.result.value = self._result_html(self.dash.last_repair)
            self.scope.value = self.plan_view.value = ""
            self.verdict.value = "<i style='color:#666'>The plan is made when the tab is shown.</i>"
            self.repair.disabled = True
            hidden(self.confirm_box, True)
        return True

    def on_shown(self) -> None:
        """Its tab is shown (the dashboard's hook): make the plan, the first time."""
        with self._planning:
            if not self.planned:
                self.make_plan()

    def use_parts(self, parts: tuple[str, ...]) -> None:
        """Plan only `parts` (index, sidecars, quant-config); all of them when empty or
        "all". Before the tab was first shown, only the choice is made: showing it plans."""
        with self._planning:
            self.parts = () if "all" in parts else tuple(parts)
            self.restoring = None
            if "quant-config" in self.parts:
                self.quant.value = True
            if self.planned:
                self.make_plan()

    def use_restore(self, source: str) -> None:
        """Plan copying the tensors this checkpoint lost back from `source` (when the tab
        was shown before; else showing it plans)."""
        with self._planning:
            self.source.value = source
            self.restoring = source
            if self.planned:
                self.make_plan()

    def make_plan(self) -> None:
        """Plan from the current scan with the chosen options (nothing is written), and
        preview what the plan fixes."""
        with self._planning:
            self.planned = True
            self.ask(cancel=True)
            self.repair.disabled = True
            self.verdict.value = (
                "<div class='ckpt-repair-planning' style='color:#555'>"
                "<i class='fa fa-spinner fa-spin' style='margin-right:6px'></i>"
                "Planning the repair and re-checking what it fixes...</div>"
            )
            self._make_plan()

    def _make_plan(self) -> None:
        # The plan needs the scan alone, not the load check; the Repair click needs the plan
        # alone. So the plan is shown and Repair enabled as soon as it is made (a fraction of
        # a second), and the re-check of what it fixes (seconds: it waits for the load
        # check, then checks the repaired layout, the load check included) follows: Repair
        # stayed disabled 12.6 s on a demo while both ran. A re-check that finds the plan
        # fixes no error or warning disables Repair then.
        self._round += 1
        round_ = self._round
        self.preview = None
        if self.restoring is not None:
            self.scope.value = (
                f"plan: restore lost tensors from <code>{html_text(self.restoring)}</code>"
            )
        elif self.parts:
            self.scope.value = f"plan: <b>{html_text(', '.join(self.parts))}</b> only"
        else:
            self.scope.value = (
                "plan: all parts at once (index, sidecars, quantization config; the re-shard "
                "of a checkpoint collapsed into one file)"
            )
        try:
            self.plan = self._plan(self.dash.current.scanned)
        except EXPECTED_ERRORS as exc:
            self._failed(exc)
            if self.restoring is not None:
                # A refused restore is not kept as the choice: "Plan again" repeated the
                # refusal (an empty or wrong reference) instead of planning the repair.
                self.restoring = None
                self.verdict.value += (
                    "<div style='color:#555'>Plan again plans the repair; Plan restore "
                    "tries the restore again with the reference in the field.</div>"
                )
            return
        self.plan_view.value = text_html(self.plan.describe()) + diff_html(self.plan.diff())
        if isinstance(self.plan, RepairPlan):  # an empty one's re-check says what it cannot fix
            self.verdict.value = (
                "<div class='ckpt-repair-planning' style='color:#555'>"
                "<i class='fa fa-spinner fa-spin' style='margin-right:6px'></i>"
                "Re-checking what the plan fixes (Repair does not wait for it)...</div>"
            )
            self.repair.disabled = self.plan.empty
            try:
                state = self.dash.state
                preview = preview_repair(
                    self.plan,
                    state.scanned,
                    findings=state.findings,
                    verdict=state.verdict,
                    model=state.verdict is not None,
                    trust_remote_code=self.dash.trust_remote_code,
                    cache=self.dash.cache,
                )
            except EXPECTED_ERRORS as exc:
                if round_ == self._round:
                    self._failed(exc)
                return
            if round_ != self._round:  # executed or planned again meanwhile
                return
            self.preview = preview
        self.verdict.value = self._verdict_html()
        if self.confirm_box.layout.display != "none":
            self.ask()  # asked meanwhile: the question now says what it fixes, or goes
        else:
            self.repair.disabled = not self.worth_it

    def _failed(self, exc: BaseException) -> None:
        """The plan or its re-check was refused: no plan, its reason in the verdict."""
        self.plan, self.preview = None, None
        self.verdict.value = error_html(exc)
        self.plan_view.value = ""
        hidden(self.confirm_box, True)
        self.repair.disabled = True

    def _new_shards(self) -> list[str]:
        """The shards a restore or re-shard plan writes."""
        copy = getattr(self.plan, "copy", None)
        return [o.name for o in copy.outputs] if copy is not None else []

    def _plan(self, scanned: Any) -> Any:
        """The plan the panel's options ask for, from `scanned` (see `make_plan`)."""
        if self.restoring is not None:
            if not self.restoring:
                raise InspectorError(
                    "name the checkpoint to restore from: a folder or URL that holds the "
                    "tensors this one lost"
                )
            return plan_restore(scanned, scan(self.restoring))
        if not self.parts:
            return plan_all(scanned, duplicates=self.duplicates.value or None)
        return plan_repair(
            scanned,
            only=set(self.parts),
            duplicates=self.duplicates.value or None,
            quant_config=self.quant.value,
        )

    @property
    def worth_it(self) -> bool:
        """True when the plan writes something and fixes an error or a warning (a plan that
        writes shards, re-shard or restore, is checked once it ran)."""
        if self.plan is None or self.plan.empty:
            return False
        return self.preview is None or self.preview.matters

    def ask(self, *, cancel: bool = False) -> None:
        """Show (or with `cancel`, hide) the confirm / cancel pair."""
        if not cancel and self.worth_it:
            files = ", ".join([*self._new_shards(), *(wr.path for wr in self.plan.writes)])
            fixes = (
                f" It fixes {plural(len(self.preview.fixes), 'finding')}."
                if self.preview is not None
                else ""
            )
            self.question.value = (
                f"Write {html_text(files)} in <code>{html_text(self.plan.root)}</code>"
                f"?{fixes} The current files are backed up first."
            )
            hidden(self.confirm_box, False)
            self.repair.disabled = True
            return
        hidden(self.confirm_box, True)
        self.repair.disabled = not self.worth_it

    def execute(self) -> None:
        """Execute the plan, keep the result on the dashboard, and refresh every tab."""
        hidden(self.confirm_box, True)
        self._round += 1
        try:
            result = self.plan.execute()
        except EXPECTED_ERRORS as exc:
            self.result.value = error_html(exc)
            self.make_plan()
            return
        self.dash.last_repair = result
        self.dash.refresh()

    def _verdict_html(self) -> str:
        """What the plan fixes and what it cannot, in issues (with what fixes the rest)."""
        preview = self.preview
        if preview is None:
            what = (
                f"restores {plural(len(self.plan.restored), 'tensor')}"
                if isinstance(self.plan, RestorePlan)
                else "writes new shards"
            )
            return (
                f"<div style='line-height:1.5'><b>This plan {what}</b> (nothing is written "
                "until you confirm); the checks run on the result once it is written.</div>"
                if not self.plan.empty
                else "<div><b>Nothing to write:</b> see the plan below for why.</div>"
            )
        state = self.dash.state
        fixes, rest = preview.issues(state.problems)
        lines = []
        if not state.findings:
            lines.append(
                "<b>No findings: nothing to repair.</b>"
                + (
                    f" (A plan would only change: {html_text(_changes(self.plan))}.)"
                    if self.plan.writes
                    else ""
                )
            )
        elif self.plan.empty and not self.plan.refused:
            lines.append(
                "<b>Nothing to rewrite:</b> no index, sidecar or quant-config repair applies."
            )
        elif not preview.matters:
            lines.append(
                "<b>This plan fixes no error or warning</b>, so Repair is disabled"
                + (
                    f" (it would only change: {html_text(_changes(self.plan))})."
                    if self.plan.writes
                    else "."
                )
            )
        else:
            lines.append(
                f"<b>This plan fixes {len(preview.fixes):,} of "
                f"{plural(len(state.findings), 'finding')}:</b><ul>"
                + "".join(f"<li>{html_text(p.title)}</li>" for p in fixes)
                + "</ul>"
            )
        if preview.introduces:
            lines.append(
                f"<b style='color:#b07d00'>It would add "
                f"{plural(len(preview.introduces), 'finding')}</b> "
                f"({html_text(', '.join(sorted({f.code for f in preview.introduces})))}) "
                "until the other parts are repaired too: plan all parts to fix everything "
                "at once."
            )
        if rest:
            lines.append(
                "<b>It cannot fix:</b><ul>"
                + "".join(
                    f"<li>{severity_badge(p.severity)} {html_text(p.title)}: "
                    f"{html_text(p.action.text)} <code>{html_text(p.action.command)}</code>"
                    "</li>"
                    for p in rest
                )
                + "</ul>"
            )
        return (
            "<div style='line-height:1.5'>" + "".join(f"<div>{x}</div>" for x in lines) + "</div>"
        )

    @staticmethod
    def _result_html(result: Any) -> str:
        if result is None:
            return ""
        written = "".join(f"<li><code>{html_text(p)}</code></li>" for p in result.written)
        backup = html_text(result.backup_dir) if result.backup_dir else "none"
        remaining = findings_to_frame(result.remaining)
        return (
            '<div style="border-left:4px solid #2ca02c;padding-left:8px">'
            f"<b>Repaired.</b> Wrote:<ul>{written}</ul>Backups of the replaced files: "
            f"<code>{backup}</code><br>Findings after the re-scan: {len(remaining)}</div>"
            + (findings_html(remaining, max_rows=20) if len(remaining) else "")
        )


def _changes(plan: Any) -> str:
    return "; ".join(f"{wr.path}: {', '.join(wr.changes)}" for wr in plan.writes)
