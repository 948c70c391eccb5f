"""The Consolidate tab: a form for `plan_consolidation` and `execute`, the plan, a progress
bar while it writes, and the verification of what it wrote.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ipywidgets as w

from inspector.ui import (
    SHARD_SPLIT_SIZE,
    PlanRefusedError,
    consolidation_reference,
    default_destination,
    findings_html,
    findings_to_frame,
    format_bytes,
    html_text,
    plan_consolidation,
    plural,
    text_html,
)

from ..controls import button, fixed, still
from ..guard import EXPECTED_ERRORS, captured, error_html, guarded

if TYPE_CHECKING:
    from inspector.ui import ScannedCheckpoint

    from . import Host

__all__ = ["ConsolidatePanel"]

_DTYPES = [("keep", ""), ("BF16", "BF16"), ("F16", "F16"), ("F32", "F32")]


class ConsolidatePanel:
    """Form for `plan_consolidation` + `execute`: destination, mapping or reference, maximum
    shard size, dtype, workers, overwrite. Shows the plan, a progress bar while running, and
    the verification of the written folder. A destination that holds anything but this plan's
    own output is refused by `execute` unless overwrite is ticked; the refusal is shown with
    the two ways out."""

    def __init__(self, dash: Host) -> None:
        self.dash = dash
        # Beside the source, not in it: the output must not become part of what it replaces.
        # Its controls' layouts and styles are the kernel's shared ones (`still`): the form
        # was 45 widget models, each made again by every re-scan (issue 35).
        wide = {"width": "90%"}
        self.dest = still(
            w.Text,
            value=str(default_destination(dash.scanned.path)),
            description="destination",
            layout=wide,
        )
        self.mapping = still(
            w.Text,
            placeholder="optional: JSON {tensor: file index}",
            description="mapping",
            layout=wide,
        )
        # A recorded mapping that collapses every tensor into one file is replaced by the
        # reference its finding names (`inspector._internal.diagnosis.references`): shown, so it can
        # be changed.
        suggested = consolidation_reference(dash.scanned)
        self.reference = still(
            w.Text,
            "ckpt-consolidate-reference",
            value=suggested.path if suggested is not None else "",
            placeholder="optional: HF folder or index",
            description="reference",
            layout=wide,
        )
        self.max_size = still(
            w.Text, value=format_bytes(SHARD_SPLIT_SIZE, digits=0), description="max shard"
        )
        self.dtype = still(w.Dropdown, options=_DTYPES, description="dtype")
        self.workers = still(w.BoundedIntText, value=1, min=1, max=64, description="workers")
        self.verify_data = still(w.Checkbox, description="compare tensor contents", indent=False)
        # The CLI's --overwrite: named so, as the core's refusal message names it.
        self.overwrite = still(
            w.Checkbox,
            "ckpt-consolidate-overwrite",
            description="overwrite (--overwrite): move what the destination holds to a backup",
            indent=False,
            layout=wide,
        )
        self.status = still(w.HTML, "ckpt-consolidate-status")
        self.plan_button = plan = button("Plan", "ckpt-consolidate-plan", shared=True)
        plan.on_click(guarded(lambda: self.make_plan(), self.status))
        self.run = button(
            "Consolidate", "ckpt-consolidate-button", style="primary", icon="play", shared=True
        )
        self.run.on_click(guarded(lambda: self.execute(), self.status))
        # Why a button is disabled, beside it: a disabled button's tooltip alone is not seen.
        self.why = still(w.HTML, "ckpt-consolidate-why")
        # A refused plan disables Consolidate until the form changes (Plan asks again).
        for control in (self.dest, self.mapping, self.reference, self.max_size, self.dtype):
            control.observe(lambda _change: self._refused_by(""), names="value")
        # tqdm.auto draws its notebook progress bar into this output while the copy runs.
        self.progress = still(w.Output, "ckpt-consolidate-progress")
        form = [self.dest, self.mapping, self.reference, self.max_size, self.dtype, self.workers]
        self.note = still(w.HTML, value=_note(dash.scanned, suggested))
        self.widget = w.VBox(
            [
                self.note,
                *form,
                self.verify_data,
                self.overwrite,
                w.HBox([plan, self.run, self.why], layout=fixed(w.Layout, align_items="center")),
                self.progress,
                self.status,
            ]
        )
        self.layout_refusal = ""
        if dash.scanned.dcp is None:
            # Known before any click: `plan_consolidation` refuses every other layout.
            self.layout_refusal = f"this checkpoint's layout is {dash.scanned.layout}"
            self._refused_by(self.layout_refusal)

    def renew(self) -> bool:
        """The form as a tab built now shows it for the dashboard's scan (after a re-scan or a
        check of the values), in the widgets shown."""
        scanned = self.dash.scanned
        suggested = consolidation_reference(scanned)
        self.dest.value = str(default_destination(scanned.path))
        self.mapping.value = ""
        self.reference.value = suggested.path if suggested is not None else ""
        self.max_size.value = format_bytes(SHARD_SPLIT_SIZE, digits=0)
        self.dtype.value = ""
        self.workers.value = 1
        self.verify_data.value = self.overwrite.value = False
        if self.progress.outputs:  # a clear of nothing is one more message for the page
            self.progress.clear_output()
        self.status.value = ""
        self.note.value = _note(scanned, suggested)
        self.layout_refusal = (
            "" if scanned.dcp is not None else f"this checkpoint's layout is {scanned.layout}"
        )
        self._refused_by("")
        return True

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


def _note(scanned: ScannedCheckpoint, suggested: Any) -> str:
    """What the form says first: the reference it suggests, or that the layout is refused."""
    if scanned.dcp is None:
        return (
            f"<i>Consolidation reads DCP-sharded safetensors; this checkpoint's layout is "
            f"{html_text(scanned.layout)}, so planning will refuse.</i>"
        )
    if suggested is not None:
        return (
            "<i>The recorded mapping sends every tensor to one file (mapping-collapsed): "
            f"the reference is {html_text(suggested.label)}, which names "
            f"{plural(suggested.files, 'file')}.</i>"
        )
    return ""


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
