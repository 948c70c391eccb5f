"""Open the HTML report in headless Chromium with every network request blocked: the expert
heatmap must render and the findings table must list every finding. Screenshot in
build/test-artifacts/report.png. The tests share one checkpoint, and the session's Chromium
(tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from browser import ARTIFACTS
from inspector.widgets.report import write_html_report
from test_report_html import EXPERTS, LAYERS, write_moe_checkpoint

from inspector._internal.checks import check
from inspector._internal.scan.entry import scan

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """The small MoE checkpoint (layer 3 lost experts 4-7), scanned and checked once."""
    folder = tmp_path_factory.mktemp("report") / "tiny-moe"
    scanned = scan(write_moe_checkpoint(folder))
    return scanned, check(scanned)


@pytest.fixture(scope="module")
def report(moe: tuple, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report of `moe` with plotly.js embedded, written once: the tests only read it."""
    scanned, findings = moe
    return write_html_report(scanned, findings, tmp_path_factory.mktemp("report") / "report.html")


def test_report_renders_offline_in_chromium(moe: tuple, report: Path, chromium):
    _, findings = moe
    requested: list[str] = []
    errors: list[str] = []
    page = chromium.new_page(viewport={"width": 1280, "height": 900})
    # The report must need nothing but itself: anything not file:// is refused.
    page.route("**/*", _only_files(requested))
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
    page.close()

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
    assert missing_cells[6] == "4-7"  # which experts, not an empty cell
    assert (ARTIFACTS / "report.png").stat().st_size > 10_000


# Every line break inside a name cell must come right after a separator (a <wbr> point):
# for each text node, the characters whose box starts a new line.
_BREAKS_INSIDE_WORDS = """() => {
    const bad = [];
    for (const td of document.querySelectorAll('#findings-table td.name')) {
        const walker = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
        let previous = null;
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            for (let i = 0; i < node.length; i++) {
                const range = document.createRange();
                range.setStart(node, i);
                range.setEnd(node, i + 1);
                const rect = range.getBoundingClientRect();
                if (previous && rect.top > previous.top + 2 && !'.-/_'.includes(previous.ch))
                    bad.push(td.textContent.slice(0, 80) + ' @ ' + node.data.slice(0, i + 1));
                previous = {top: rect.top, ch: node.data[i]};
            }
        }
    }
    return bad;
}"""


def test_names_in_the_findings_table_wrap_between_words(report: Path, chromium):
    """In a narrow window the file column wraps "model-00002-of-00003.safetensors" after its
    separators, never inside "safetensors"."""
    page = chromium.new_page(viewport={"width": 760, "height": 900})
    page.route("**/*", _only_files())
    page.goto(report.as_uri(), wait_until="load")
    table = page.locator("#findings-table")
    table.scroll_into_view_if_needed()
    wrapped = page.evaluate(
        "() => [...document.querySelectorAll('#findings-table td.name')]"
        ".filter(td => td.getClientRects().length && td.offsetHeight > 24).length"
    )
    bad = page.evaluate(_BREAKS_INSIDE_WORDS)
    table.screenshot(path=str(ARTIFACTS / "report-findings-narrow.png"))
    page.close()
    assert wrapped > 0, "the window is narrow enough that some names wrap"
    assert bad == [], bad


def test_light_report_draws_from_the_cdn_and_says_when_it_cannot(
    moe: tuple, chromium, tmp_path: Path
):
    """`--light`: with the CDN reachable (served here from plotly.py's own copy, so the SRI
    hash is checked for real) the heatmap draws; offline the report says the figures are
    missing and how to get them."""
    import plotly.offline
    from inspector.widgets.report import plotly_cdn_url

    scanned, findings = moe
    report = write_html_report(scanned, findings, tmp_path / "light.html", figures="cdn")
    bundle = plotly.offline.get_plotlyjs()
    served: list[str] = []

    def cdn(route) -> None:
        url = route.request.url
        if url == plotly_cdn_url():
            served.append(url)
            route.fulfill(
                status=200,
                body=bundle,
                content_type="application/javascript",
                headers={"Access-Control-Allow-Origin": "*"},
            )
        else:
            _only_files()(route)

    online = chromium.new_page(viewport={"width": 1280, "height": 900})
    online.route("**/*", cdn)
    online.goto(report.as_uri(), wait_until="load")
    online.wait_for_selector(
        "#expert-heatmap .js-plotly-plot .heatmaplayer image",
        state="attached",
        timeout=30_000,
    )
    note_online = online.locator("#figures-note").inner_text()
    online.screenshot(path=str(ARTIFACTS / "report-light.png"))
    offline = chromium.new_page(viewport={"width": 1280, "height": 900})
    offline.route("**/*", _only_files())
    offline.goto(report.as_uri(), wait_until="load")
    missing = offline.locator(".cdn-missing")
    missing.wait_for(state="visible", timeout=30_000)
    note_offline = offline.locator("#figures-note").inner_text()
    offline.locator("#figures-note").screenshot(path=str(ARTIFACTS / "report-light-offline.png"))
    online.close()
    offline.close()
    assert served == [plotly_cdn_url()]
    assert "cdn.plot.ly" in note_online and "could not be loaded" not in note_online
    assert "could not be loaded" in note_offline and "ckpt-inspect report PATH" in note_offline


def _only_files(refused: list[str] | None = None):
    """A route handler that lets file:// URLs through and refuses (and records) the rest."""

    def route_(route) -> None:
        url = route.request.url
        if url.startswith("file://"):
            route.continue_()
        else:
            if refused is not None:
                refused.append(url)
            route.abort()

    return route_
