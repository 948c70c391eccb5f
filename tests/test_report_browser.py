"""Open the HTML report in headless Chromium with every network request blocked: the expert
heatmap must render and the findings table must list every finding. Screenshot in
build/test-artifacts/report.png."""

from __future__ import annotations

from pathlib import Path

import pytest
from browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, sync_playwright_or_fail
from inspector.widgets.report import write_html_report
from test_report_html import EXPERTS, LAYERS, write_moe_checkpoint

from inspector._internal.checkpoint.scan import scan
from inspector._internal.checks import check

pytestmark = pytest.mark.browser


def test_report_renders_offline_in_chromium(tmp_path: Path):
    sync_playwright = sync_playwright_or_fail()
    scanned = scan(write_moe_checkpoint(tmp_path / "tiny-moe"))
    findings = check(scanned)
    report = write_html_report(scanned, findings, tmp_path / "report.html")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    requested: list[str] = []
    errors: list[str] = []

    def only_local(route) -> None:
        # The report must need nothing but itself: anything not file:// is refused and recorded.
        url = route.request.url
        if url.startswith("file://"):
            route.continue_()
        else:
            requested.append(url)
            route.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.route("**/*", only_local)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(report.as_uri(), wait_until="load")
            page.wait_for_selector(
                "#expert-heatmap .js-plotly-plot .heatmaplayer image",
                state="attached",
                timeout=30_000,
            )
            # The z plotly.js decoded from its base64 typed-array encoding, as plain arrays.
            z = page.evaluate(
                "Array.from(document.getElementById('expert-heatmap-figure')._fullData[0].z,"
                " row => Array.from(row))"
            )
            rows = page.locator("#findings-table tr.finding")
            codes = [rows.nth(i).get_attribute("data-code") for i in range(rows.count())]
            missing_row = page.locator("#findings-table tr.finding[data-code='expert-missing'] td")
            missing_cells = missing_row.all_inner_texts()
            page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
        finally:
            browser.close()

    assert requested == [], f"the report tried to reach the network: {requested}"
    assert errors == [], f"JavaScript errors in the report: {errors}"
    # Rendered data: layer 3 lost experts 4-7, layer 1 expert 2 is incomplete.
    assert len(z) == LAYERS and len(z[0]) == EXPERTS
    assert [z[3][e] for e in range(4, 8)] == [0, 0, 0, 0]
    assert z[1][2] == 1 and z[0][0] == 2
    assert sorted(codes) == sorted(f.code for f in findings)
    assert {"expert-missing", "expert-incomplete"} <= set(codes)
    assert missing_cells[0] == "error" and missing_cells[1] == "expert-missing"
    assert "experts 4-7 missing" in missing_cells[2] and missing_cells[5] == "3"
    assert (ARTIFACTS / "report.png").stat().st_size > 10_000
