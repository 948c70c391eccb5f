"""One vocabulary (`inspector._internal.findings.words`): a finding is one coded observation, an
issue the findings of one root cause with its fix, severities error / warning / info, counts
pluralised by one helper. Every text a person reads on the demo checkpoints (the CLI's outputs, the
Markdown summary, the HTML report, every dashboard tab) is scanned for the forms that broke it:
"problems none" from a scan that ran no check, "1 problem (1 findings)", "2 problems
(2 error)", "found 253 in layers 40", the "Drift" tab."""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

import pytest

from inspector._internal.cli.main import main
from inspector._internal.common.text import layers_text, plural
from inspector._internal.findings.words import severity_counts

pytest.importorskip("ipywidgets")

_COUNTED = r"(?:finding|error|warning|issue|problem|tensor|file|expert|shard|layer)"
# (pattern, what is wrong with it)
BAD = [
    (re.compile(rf"(?<![\d.,])\b1 {_COUNTED}s\b"), "a plural after 1"),
    (
        re.compile(
            rf"(?<![\d.,-])\b(?:0|[2-9]|[1-9]\d+|\d{{1,3}}(?:,\d{{3}})+) {_COUNTED}\b"
            r"(?![\w-]| (?:bytes|elements|names|data)\b)"
        ),
        "a singular after a count other than 1",
    ),
    (re.compile(r"\bproblems?\b", re.IGNORECASE), "'problem': the word is issue (or finding)"),
    (re.compile(r"\blayers \d+(?![\d,-])"), "'layers' before one layer"),
    (re.compile(r"\bDrift\b"), "the findings tab is called Findings"),
    (re.compile(r"\w\(s\)"), "'(s)' instead of a counted plural"),
]


def bad_forms(text: str) -> list[str]:
    """Each bad form found in `text`, with the line it is on."""
    out = []
    for line in text.splitlines():
        for pattern, why in BAD:
            for match in pattern.finditer(line):
                out.append(f"{why}: {match.group(0)!r} in {line.strip()[:160]!r}")
    return out


def visible(markup: str) -> str:
    """What a person reads of an HTML fragment: tags, scripts and styles removed."""
    markup = re.sub(r"<(script|style)\b.*?</\1>", " ", markup, flags=re.DOTALL)
    return html.unescape(re.sub(r"<[^>]+>", " ", markup))


def test_the_helpers_count_and_fold_as_people_read():
    assert plural(1, "finding") == "1 finding" and plural(2, "error") == "2 errors"
    assert plural(3, "info") == "3 info" and plural(1_234, "issue") == "1,234 issues"
    assert severity_counts({"error": 2, "warning": 1}) == "2 errors, 1 warning"
    assert layers_text([40]) == "layer 40" and layers_text([1, 2, 3, 7]) == "layers 1-3, 7"
    assert layers_text([17, 18, 19], noun="expert") == "experts 17-19"
    # The scanner catches what it is for.
    for wrong in ("1 problem (1 findings)", "2 problems (2 error)", "found 253 in layers 40"):
        assert bad_forms(wrong), wrong
    assert not bad_forms("2 issues (2 errors); 1 finding; layers 0-39, 41; layer 40; 3 info")


@pytest.fixture(scope="module")
def demos(tmp_path_factory: pytest.TempPathFactory, copy_demos) -> Path:
    target = tmp_path_factory.mktemp("words-demos")
    copy_demos(target)
    return target


def test_cli_outputs_speak_one_vocabulary(
    demos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], kept_demo_verdicts: Path
) -> None:
    # The words, not the verdict, are under test: the demos' verdicts are kept already, so
    # `check` and `report` show them without building a model for each demo.
    texts = []
    for folder in sorted(p for p in demos.iterdir() if p.is_dir()):
        work = Path(shutil.copytree(folder, tmp_path / folder.name))
        runs = [
            ["scan", str(work)],
            ["check", str(work)],
            ["repair", str(work), "--dry-run"],
            ["report", str(work), "--markdown"],
            ["report", str(work), "-o", str(tmp_path / f"{folder.name}.html")],
        ]
        if (work / ".hf_metadata").is_dir():
            runs.append(
                ["consolidate", str(work), str(tmp_path / f"{folder.name}-out"), "--dry-run"]
            )
        for argv in runs:
            main(argv)
            captured = capsys.readouterr()
            texts.append((" ".join(argv[:1]) + " " + folder.name, captured.out + captured.err))
        texts.append(
            (f"report {folder.name}", visible((tmp_path / f"{folder.name}.html").read_text()))
        )
    main(
        [
            "diff",
            str(demos / "healthy-modelopt-per-layer"),
            str(demos / "modelopt-1631-ep-collision"),
        ]
    )
    texts.append(("diff", capsys.readouterr().out))
    found = [f"{where}: {bad}" for where, text in texts for bad in bad_forms(text)]
    assert not found, "\n".join(found)
    scan_out = next(text for where, text in texts if where == "scan modelopt-1422-sidecar-drift")
    assert "checks      not run by scan" in scan_out and "problems" not in scan_out


@pytest.mark.usefixtures("dashboards_closed")
def test_dashboard_strings_speak_one_vocabulary(demos: Path, kept_demo_verdicts: Path) -> None:
    # The verdicts kept already (as above): no load check's child imports torch for them.
    from test_dashboard import Dashboard, _texts

    found = []
    for name in (
        "modelopt-1422-sidecar-drift",
        "modelopt-1631-ep-collision",
        "automodel-2289-dcp-mapping-collapsed",
        "healthy-hf-sharded",
    ):
        dash = Dashboard(demos / name)
        for title in dash.TABS:
            dash.select(title)
        text = "\n".join(
            [dash.header.value, *dash.tab.titles, *(_texts(p.widget) for p in dash.panels.values())]
        )
        found += [f"{name}: {bad}" for bad in bad_forms(visible(text))]
        assert "Findings (" in dash.tab.titles[dash.TABS.index("Findings")]
    assert not found, "\n".join(found)


def test_a_refusal_of_many_findings_stays_one_screen() -> None:
    """21 findings of 5 codes (a consolidation refusal): how many, the first three codes with
    counts and a cut first message, how many codes more, and the command that lists them
    all, in a few hundred characters however long the messages are."""
    from inspector._internal.findings.finding import make_finding
    from inspector._internal.findings.words import refusal_digest

    codes = ["dcp-coverage-gap"] * 15 + [
        "dcp-chunk-overlap",
        "dcp-dtype-conflict",
        "dcp-dtype-conflict",
        "mapping-unreadable",
        "dcp-sharding-info-missing",
        "dcp-sharding-info-missing",
    ]
    found = [
        make_finding(c, f"tensor {i} " + "x" * 3_000, file="a.safetensors")
        for i, c in enumerate(codes)
    ]
    text = refusal_digest(found, path="/data/run 1")
    assert text.startswith("21 findings: dcp-coverage-gap x15 (e.g. tensor 0 ")
    assert (
        "dcp-chunk-overlap (tensor 15 " in text and "dcp-dtype-conflict x2 (e.g. tensor 16 " in text
    )
    assert "mapping-unreadable" not in text and "; and 2 more codes;" in text
    assert text.endswith("`ckpt-inspect check '/data/run 1'` lists them all")
    assert len(text) < 1_500 and "\n" not in text
