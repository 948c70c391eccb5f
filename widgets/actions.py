"""The dashboard tabs that act on disk: Repair, Consolidate and Report.

Each button is one call into `inspector` (or `widgets.report`); the panels only collect form
values and show what the call returned. Errors the core raises on purpose (`InspectorError`,
`ValueError` for a bad size, `OSError`) are shown in the panel instead of escaping into the
notebook as a traceback.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from inspector.ui import (
    SHARD_SPLIT_SIZE,
    InspectorError,
    PlanRefusedError,
    RepairPlan,
    RestorePlan,
    consolidation_reference,
    default_destination,
    diff_html,
    findings_html,
    findings_to_frame,
    fit,
    format_bytes,
    html_text,
    markdown_summary,
    plan_all,
    plan_consolidation,
    plan_repair,
    plan_restore,
    plural,
    preview_repair,
    restore_reference,
    scan,
    severity_badge,
    text_html,
)

from .controls import button
from .guard import EXPECTED_ERRORS, captured, error_html, guarded
from .report import write_html_report

if TYPE_CHECKING:
    from .tabs import Host

__all__ = ["ConsolidatePanel", "RepairPanel", "ReportPanel"]

# ipywidgets treats a None value as "nothing selected", so "" stands for "no policy".
_DUPLICATES = [
    ("refuse (decide yourself)", ""),
    ("keep the first shard's copy", "first"),
    ("keep the last shard's copy", "last"),
    ("keep the index's choice", "index"),
]
_DTYPES = [("keep", ""), ("BF16", "BF16"), ("F16", "F16"), ("F32", "F32")]


def _hidden(widget: w.Widget, hidden: bool) -> None:
    widget.layout.display = "none" if hidden else None


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
        self.duplicates = w.Dropdown(options=_DUPLICATES, description="duplicates")
        self.quant = w.Checkbox(description="also rebuild hf_quant_config.json", indent=False)
        self.scope = w.HTML().add_class("ckpt-repair-scope")
        self.verdict = w.HTML().add_class("ckpt-repair-verdict")
        self.result = w.HTML(self._result_html(dash.last_repair)).add_class("ckpt-repair-result")
        all_parts = button("Repair all", "ckpt-plan-all", icon="expand")
        all_parts.on_click(guarded(lambda: self.use_parts(()), self.verdict))
        candidate = restore_reference(dash.scanned)
        self.source = w.Text(
            value=candidate.path if candidate is not None else "",
            placeholder="a checkpoint that holds the lost tensors (folder or URL)",
            description="restore from",
            layout=w.Layout(width="60%"),
        ).add_class("ckpt-restore-source")
        restore = button("Plan restore", "ckpt-plan-restore", icon="download")
        restore.on_click(guarded(lambda: self.use_restore(self.source.value.strip()), self.verdict))
        replan = button("Plan again", "ckpt-plan-button", icon="refresh")
        replan.on_click(guarded(lambda: self.make_plan(), self.verdict))
        self.plan_view = w.HTML().add_class("ckpt-repair-plan")
        self.repair = button("Repair", "ckpt-repair-button", style="warning", icon="wrench")
        self.repair.on_click(guarded(lambda: self.ask(), self.verdict))
        self.question = w.HTML().add_class("ckpt-confirm-question")
        self.confirm = button("Confirm", "ckpt-confirm-button", style="danger", icon="check")
        self.confirm.on_click(guarded(lambda: self.execute(), self.result))
        self.cancel = button("Cancel", "ckpt-cancel-button")
        self.cancel.on_click(guarded(lambda: self.ask(cancel=True), self.verdict))
        self.confirm_box = w.VBox([self.question, w.HBox([self.confirm, self.cancel])])
        wrap = w.Layout(flex_flow="row wrap", align_items="center")
        self.widget = w.VBox(
            [
                self.result,
                w.HBox([self.scope, all_parts], layout=wrap),
                w.HBox([self.duplicates, self.quant, replan], layout=wrap),
                w.HBox([self.source, restore], layout=wrap),
                self.verdict,
                w.HBox([self.repair]),
                self.confirm_box,
                self.plan_view,
            ],
            layout=w.Layout(width="100%"),
        )
        self.verdict.value = "<i style='color:#666'>The plan is made when the tab is shown.</i>"
        self.repair.disabled = True
        _hidden(self.confirm_box, True)

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
        _hidden(self.confirm_box, True)
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
            _hidden(self.confirm_box, False)
            self.repair.disabled = True
            return
        _hidden(self.confirm_box, True)
        self.repair.disabled = not self.worth_it

    def execute(self) -> None:
        """Execute the plan, keep the result on the dashboard, and refresh every tab."""
        _hidden(self.confirm_box, True)
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


class ConsolidatePanel:
    """Form for `plan_consolidation` + `execute`: destination, mapping or reference, maximum
    shard size, dtype, workers, overwrite. Shows the plan, a progress bar while running, and
    the verification of the written folder. A destination that holds anything but this plan's
    own output is refused by `execute` unless overwrite is ticked; the refusal is shown with
    the two ways out."""

    def __init__(self, dash: Host) -> None:
        self.dash = dash
        source = dash.scanned.path
        # Beside the source, not in it: the output must not become part of what it replaces.
        self.dest = w.Text(value=str(default_destination(source)), description="destination")
        self.mapping = w.Text(
            placeholder="optional: JSON {tensor: file index}", description="mapping"
        )
        # A recorded mapping that collapses every tensor into one file is replaced by the
        # reference its finding names (`inspector._internal.diagnosis.references`): shown, so it can
        # be changed.
        suggested = consolidation_reference(dash.scanned)
        self.reference = w.Text(
            value=suggested.path if suggested is not None else "",
            placeholder="optional: HF folder or index",
            description="reference",
        ).add_class("ckpt-consolidate-reference")
        self.max_size = w.Text(
            value=format_bytes(SHARD_SPLIT_SIZE, digits=0), description="max shard"
        )
        self.dtype = w.Dropdown(options=_DTYPES, description="dtype")
        self.workers = w.BoundedIntText(value=1, min=1, max=64, description="workers")
        self.verify_data = w.Checkbox(description="compare tensor contents", indent=False)
        # The CLI's --overwrite: named so, as the core's refusal message names it.
        self.overwrite = w.Checkbox(
            description="overwrite (--overwrite): move what the destination holds to a backup",
            indent=False,
            layout=w.Layout(width="90%"),
        ).add_class("ckpt-consolidate-overwrite")
        for text in (self.dest, self.mapping, self.reference):
            text.layout.width = "90%"
        self.status = w.HTML().add_class("ckpt-consolidate-status")
        self.plan_button = plan = button("Plan", "ckpt-consolidate-plan")
        plan.on_click(guarded(lambda: self.make_plan(), self.status))
        self.run = button("Consolidate", "ckpt-consolidate-button", style="primary", icon="play")
        self.run.on_click(guarded(lambda: self.execute(), self.status))
        # Why a button is disabled, beside it: a disabled button's tooltip alone is not seen.
        self.why = w.HTML().add_class("ckpt-consolidate-why")
        # A refused plan disables Consolidate until the form changes (Plan asks again).
        for control in (self.dest, self.mapping, self.reference, self.max_size, self.dtype):
            control.observe(lambda _change: self._refused_by(""), names="value")
        # tqdm.auto draws its notebook progress bar into this output while the copy runs.
        self.progress = w.Output().add_class("ckpt-consolidate-progress")
        note = ""
        if suggested is not None:
            note = (
                "<i>The recorded mapping sends every tensor to one file (mapping-collapsed): "
                f"the reference is {html_text(suggested.label)}, which names "
                f"{plural(suggested.files, 'file')}.</i>"
            )
        if dash.scanned.dcp is None:
            note = (
                f"<i>Consolidation reads DCP-sharded safetensors; this checkpoint's layout is "
                f"{html_text(dash.scanned.layout)}, so planning will refuse.</i>"
            )
        form = [self.dest, self.mapping, self.reference, self.max_size, self.dtype, self.workers]
        self.widget = w.VBox(
            [
                w.HTML(note),
                *form,
                self.verify_data,
                self.overwrite,
                w.HBox([plan, self.run, self.why], layout=w.Layout(align_items="center")),
                self.progress,
                self.status,
            ]
        )
        self.layout_refusal = ""
        if dash.scanned.dcp is None:
            # Known before any click: `plan_consolidation` refuses every other layout.
            self.layout_refusal = f"this checkpoint's layout is {dash.scanned.layout}"
            self._refused_by(self.layout_refusal)

    def _refused_by(self, reason: str) -> None:
        """Disable Consolidate (and Plan, for a refusal no form value lifts) saying `reason`,
        or with no reason enable them again."""
        reason = self.layout_refusal or reason
        self.plan_button.disabled = bool(self.layout_refusal)
        self.run.disabled = bool(reason)
        tip = f"the plan is refused: {reason}" if reason else ""
        self.run.tooltip = self.plan_button.tooltip = tip
        self.why.value = f"<i style='color:#666'>{html_text(tip)}</i>" if reason else ""

    def make_plan(self) -> Any:
        """Plan from the form (nothing is written); show it and return it, None on refusal."""
        try:
            plan = plan_consolidation(
                self.dash.scanned,
                self.dest.value.strip(),
                mapping=self.mapping.value.strip() or None,
                reference=self.reference.value.strip() or None,
                max_shard_size=self.max_size.value.strip(),
                dtype=self.dtype.value or None,
            )
        except EXPECTED_ERRORS as exc:
            self.status.value = error_html(exc)
            if isinstance(exc, PlanRefusedError):
                self._refused_by(str(exc).splitlines()[0][:240])
            return None
        self._refused_by("")
        self.status.value = text_html(plan.describe())
        return plan

    def execute(self) -> Any:
        """Plan from the form, write the consolidated checkpoint with a progress bar, and show
        the verification of the result. Returns the result, None when refused or failed."""
        plan = self.make_plan()
        if plan is None:
            return None
        self.run.disabled = True
        self.progress.clear_output()
        try:
            result = captured(
                self.progress,
                lambda: plan.execute(
                    progress=True,
                    verify_data=self.verify_data.value,
                    workers=self.workers.value,
                    overwrite=self.overwrite.value,
                ),
            )
        except EXPECTED_ERRORS as exc:
            self.progress.clear_output()
            self.status.value = _refused(exc, overwrite=self.overwrite.value)
            return None
        finally:
            self._refused_by("")
        verdict = (
            "verified: no finding"
            if result.ok
            else f"verification: {plural(len(result.findings), 'finding')}"
            + (", partial tensors" if result.partial else "")
            + (", content differs" if result.data_mismatches else "")
        )
        color = "#2ca02c" if result.ok else "#d62728"
        self.status.value = f'<div style="color:{color}"><b>{verdict}</b></div>' + text_html(
            result.describe()
        )
        if result.findings:
            self.status.value += findings_html(findings_to_frame(result.findings), max_rows=50)
        return result


def _refused(exc: BaseException, *, overwrite: bool) -> str:
    """Why the consolidation did not run; for a destination that holds other files, what the
    form offers instead of the CLI flag the message names."""
    text = error_html(exc)
    if isinstance(exc, PlanRefusedError) and "--overwrite" in str(exc) and not overwrite:
        text += (
            "<div class='ckpt-consolidate-refused'>Nothing was written. Choose an empty "
            "destination above, or tick <b>overwrite</b> to move what is there to a backup "
            "and consolidate into it.</div>"
        )
    return text


class ReportPanel:
    """Buttons that write the self-contained HTML report and show the Markdown summary; the
    report's figures are interactive with plotly.js embedded (offline, about 1.5 MB), loaded
    from its CDN (small enough to attach) or PNG images."""

    def __init__(self, dash: Host) -> None:
        self.dash = dash
        name = dash.scanned.path.name or "checkpoint"
        self.path = w.Text(value=str(dash.report_dir / f"{name}-report.html"), description="file")
        self.path.layout.width = "90%"
        self.status = w.HTML().add_class("ckpt-report-status")
        write = button("Write HTML report", "ckpt-report-button", icon="file")
        write.on_click(guarded(lambda: self.write_report(), self.status))
        summary = button("Markdown summary", "ckpt-markdown-button", icon="list")
        summary.on_click(guarded(lambda: self.show_markdown(), self.status))
        self.figures = w.Dropdown(
            options=[
                ("interactive, plotly.js embedded (offline, ~1.5 MB)", "embedded"),
                ("light: plotly.js from its CDN (to attach)", "cdn"),
                ("PNG images (offline, not interactive)", "png"),
            ],
            value="embedded",
            description="figures",
            layout=w.Layout(width="28em"),
        ).add_class("ckpt-report-figures")
        self.markdown = w.Textarea(layout=w.Layout(width="100%", height="320px"))
        self.markdown.add_class("ckpt-markdown")
        _hidden(self.markdown, True)
        self.widget = w.VBox(
            [self.path, w.HBox([write, summary, self.figures]), self.status, self.markdown]
        )

    def write_report(self) -> Path | None:
        """Write the HTML report to the path in the form; returns it, None on failure."""
        state = self.dash.state
        try:
            target = write_html_report(
                state.scanned,
                state.findings,
                self.path.value.strip(),
                verdict=state.verdict,
                figures=self.figures.value,
            )
        except EXPECTED_ERRORS as exc:
            self.status.value = error_html(exc)
            return None
        size = target.stat().st_size
        self.status.value = f"Wrote <code>{html_text(target)}</code> ({size:,} bytes)."
        return target

    def show_markdown(self) -> str:
        """Show the Markdown summary (to paste into a bug report) and return it."""
        state = self.dash.state
        text = markdown_summary(
            state.scanned, state.findings, verdict=state.verdict, serving=fit(state.scanned)
        )
        self.markdown.value = text
        _hidden(self.markdown, False)
        return text
