"""Names chosen by an attacker (SECURITY.md, "Names are shown bounded and escaped").

A checkpoint names its files and tensors, and every name reaches a person: the terminal, a CI
log, the Markdown summary pasted into a bug report, the HTML report, the CSV export, the
dashboard. Each goes through one function, `inspector._internal.common.display.legible`: at most a
few hundred characters (head and tail kept), control characters escaped, then escaped for the
target. The tests build hostile folders (a tensor name of millions of characters, names and
file names carrying terminal escape sequences, bidi overrides, a forged `ERROR` line, HTML,
Markdown links and images, spreadsheet formulas) and run every command on them: no raw
control character, no markup from a name, bounded output and memory.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tracemalloc
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from commands import cli, run
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli_errors import no_traceback

from inspector._internal.checks import check
from inspector._internal.cli.main import main
from inspector._internal.common.display import MESSAGE_LIMIT, NAME_LIMIT, legible, legible_each
from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME
from inspector._internal.common.text import short_repr
from inspector._internal.findings.finding import make_finding
from inspector._internal.report.html import findings_html, problems_html, scanned_html
from inspector._internal.report.markdown import markdown_summary
from inspector._internal.report.query import export_tensors
from inspector._internal.scan.entry import scan

INDEX = INDEX_NAME
# What a terminal, a log viewer or a text renderer acts on: C0 controls (ESC, CR, BS, BEL,
# NL...), DEL, C1 controls (CSI 0x9b, OSC 0x9d), line and paragraph separators, the bidi
# embeddings, overrides and isolates, zero-width characters and the BOM.
CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]"
)
ESCAPES = "\x1b]0;pwned\x07\x1b[2K\r\b\x9b31m\x7f\nERROR forged line \u202etxt.exe\u2066"
MARKUP = [
    '<img src=x onerror="window.__pwned=1">',
    "[click](javascript:window.__pwned=1)",
    "![t](http://127.0.0.1:9/track.png)",
    "<script>window.__pwned=1</script>",
    "$\\href{javascript:window.__pwned=1}{x}$ \\(x\\)",
    "www.example.com http://example.com/x user@example.com",
]
FORMULAS = [
    '=HYPERLINK("http://example.com","x")',
    "=cmd|' /C calc'!A0",
    "+1+1",
    "-2+3",
    "@SUM(A1)",
]
BIG = 2_000_000  # characters in the longest tensor name
RSS_BUDGET_KB = 700_000  # about 400 MB measured: the 20 MB shard, its index, the tables


def _shard(path: Path, names: list[str]) -> None:
    """A valid safetensors file holding one 1-element F32 tensor per name (any names)."""
    header = {n: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i, n in
              enumerate(names)}  # fmt: skip
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(4 * len(names)))


def big_name(n: int = BIG) -> str:
    return "model.layers.0.mlp." + "A" * n + ".weight"


def hostile_folder(root: Path, *, big: int = BIG) -> Path:
    """An HF-sharded checkpoint whose names attack what shows them: a huge tensor name and one
    with escape sequences that the index does not list, a shard file named with escape
    sequences, and index entries (markup, formulas) that point at a shard not holding them."""
    folder = root / "hostile"
    folder.mkdir(parents=True)
    _shard(folder / "model-00001-of-00002.safetensors", ["model.layers.0.a", big_name(big)])
    _shard(folder / f"model-00002-of-00002{ESCAPES}.safetensors", [f"model.layers.1.x{ESCAPES}"])
    weight_map = {"model.layers.0.a": "model-00001-of-00002.safetensors"}
    weight_map |= dict.fromkeys(MARKUP + FORMULAS, "model-00001-of-00002.safetensors")
    weight_map[f"lost{ESCAPES}"] = f"gone{ESCAPES}.safetensors"
    doc = {"metadata": {"total_size": 4}, "weight_map": weight_map}
    (folder / INDEX).write_text(json.dumps(doc))
    return folder


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    return hostile_folder(tmp_path_factory.mktemp("names"))


# -- the one function --------------------------------------------------------------------------


def test_a_huge_name_keeps_its_head_and_tail_and_says_how_much_was_cut():
    name = big_name(90_000_000)
    shown = legible(name)
    # The peak is traced in a process of its own: tracemalloc counts every thread's
    # allocations, and in a full run earlier tests leave threads (servers, readers) behind.
    probe = (
        "import sys, tracemalloc\n"
        "from inspector._internal.common.display import legible\n"
        f"name = 'model.layers.0.mlp.' + 'A' * {len(name) - 26} + '.weight'\n"
        "tracemalloc.start()\n"
        "legible(name)\n"
        "print(tracemalloc.get_traced_memory()[1])\n"
    )
    peak = int(subprocess.check_output([sys.executable, "-c", probe], text=True, timeout=120))
    assert len(shown) <= NAME_LIMIT
    assert shown.startswith("model.layers.0.mlp.AAA") and shown.endswith("AAA.weight")
    cut = int(re.search(r"\(([\d,]+) characters cut\)", shown)[1].replace(",", ""))
    assert cut == len(name) - len(shown) + len(re.search(r"\.\.\.\(.*\)\.\.\.", shown)[0])
    assert peak < 100_000, f"legible copied the name: {peak:,} bytes"  # never a copy of it


def test_control_characters_are_escaped_visibly():
    shown = legible(f"x{ESCAPES}\x00\u2028\ud800")
    assert shown.isprintable() and not CONTROL.search(shown)
    assert "\\x1b]0;pwned\\x07" in shown and "\\r\\x08" in shown and "\\nERROR forged" in shown
    assert "\\u202etxt.exe\\u2066" in shown and "\\x9b31m\\x7f" in shown and "\\ud800" in shown
    assert legible(shown) == shown  # escaping twice changes nothing
    assert legible("model.layers.0.mlp.down_proj.weight") == "model.layers.0.mlp.down_proj.weight"
    assert legible("a\nb\x1b", lines=True) == "a\nb\\x1b"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=600), st.sampled_from([40, 80, NAME_LIMIT, MESSAGE_LIMIT]))
def test_legible_is_bounded_printable_and_stable(text: str, limit: int):
    shown = legible(text, limit=limit)
    assert len(shown) <= limit and shown.isprintable()
    assert legible(shown, limit=limit) == shown
    if len(text) <= limit and text.isprintable():
        assert shown == text
    assert "<" not in legible(text, target="html", limit=limit)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(max_size=300) | st.integers() | st.none(), max_size=20),
    st.sampled_from([40, 80, NAME_LIMIT]),
)
def test_legible_each_is_legible_of_each(values: list, limit: int):
    """The grids' bulk form (its common case tested inline) shows what `legible` shows."""
    assert legible_each(values, limit=limit) == [legible(v, limit=limit) for v in values]
    assert legible_each([ESCAPES, "x" * 300]) == [legible(ESCAPES), legible("x" * 300)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=300) | st.sampled_from(["a.weight", "x" * 257]), max_size=12))
def test_the_grids_columns_show_what_legible_shows(values: list[str]):
    """The Tensors grid's name columns (kept as they are when every value is already
    legible, categories made legible once) show `legible` of each value."""
    from inspector.widgets.browser import _legible

    expected = legible_each(values)
    for dtype in ("str", "category"):
        assert [str(v) for v in _legible(pd.Series(values, dtype=dtype))] == expected, dtype
    # A slice of a column (an Arrow array with an offset into its data) too.
    column = pd.Series(["\x1b[2J", *values, "b.weight"], dtype="str").iloc[1:]
    assert [str(v) for v in _legible(column)] == legible_each([*values, "b.weight"])


def test_csv_cells_that_spreadsheets_run_are_neutralised():
    for formula in FORMULAS:
        assert legible(formula, target="csv") == "'" + formula
    assert legible("\t=1+1", target="csv") == "\\t=1+1"  # escaped: no longer a leading tab
    assert legible("model.layers.0.q.weight", target="csv") == "model.layers.0.q.weight"


# -- Markdown: nothing in a name becomes markup --------------------------------------------------


def _mistune(text: str) -> str:
    """The renderer nbconvert uses for Markdown (mistune, raw HTML passed through)."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    return markdown2html_mistune(text)


def _markdown_it(text: str) -> str:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).render(text)


class _Tags(HTMLParser):
    """Every element and attribute of an HTML text, and its text outside code elements."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text: list[str] = []
        self.in_code = 0
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        if tag == "a" and ("class", "anchor-link") in attrs:
            return  # nbconvert's link to its own heading (`#Checkpoint-inspection...`)
        self.tags.append((tag, attrs))
        self.in_code += tag == "code"

    def handle_endtag(self, tag):
        self.in_code -= tag == "code"

    def handle_data(self, data):
        if not self.in_code:  # MathJax never typesets code
            self.text.append(data)


def _no_markup_from_names(rendered: str, allowed: set[str]) -> None:
    parsed = _Tags(rendered)
    tags = {t for t, _ in parsed.tags}
    attrs = [(t, a) for t, attrs in parsed.tags for a, _ in attrs]
    assert tags <= allowed, tags - allowed
    assert not [a for a in attrs if a[1].startswith("on") or a[1] in ("href", "src")], attrs
    # Math delimiters never reach the page text (MathJax typesets what it finds there).
    text = "".join(parsed.text)
    assert "\\(" not in text and "\\[" not in text and not re.search(r"\$[^$`]+\$", text)


@pytest.mark.parametrize("render", [_mistune, _markdown_it], ids=["mistune", "markdown-it"])
@pytest.mark.parametrize("name", [*MARKUP, ESCAPES, "`a``b`", "a|b", "# x", "1. x", "_x_ *y*"])
def test_a_markdown_name_renders_as_text(render, name: str):
    for target, wrap in (("markdown", "- {}\n"), ("markdown-code", "- {}\n")):
        text = legible(name, target=target)
        rendered = render(wrap.format(text))
        _no_markup_from_names(rendered, {"ul", "li", "code"})
        # and a table cell stays one cell
        row = render(f"| a | b |\n|---|---|\n| {text} | z |\n")
        assert row.count("<td") == 2, row


def test_markdown_summary_of_a_hostile_checkpoint(hostile: Path):
    scanned = scan(hostile)
    text = markdown_summary(scanned, check(scanned, model=False), examples=100)
    assert not CONTROL.search(text.replace("\n", "")) and len(text) < 50_000
    allowed = {"h3", "p", "ul", "li", "strong", "code", "table", "thead", "tbody", "tr", "th", "td"}
    for render in (_mistune, _markdown_it):
        _no_markup_from_names(render(text), allowed)


@pytest.mark.browser
def test_markdown_summary_runs_no_script_in_chromium(hostile: Path, tmp_path: Path, chromium):
    """The summary as nbconvert renders it, opened in Chromium: no handler runs, nothing is
    fetched (an image from a name would be)."""
    scanned = scan(hostile)
    body = _mistune(markdown_summary(scanned, check(scanned, model=False), examples=100))
    page_file = tmp_path / "summary.html"
    page_file.write_text(f"<!doctype html><meta charset='utf-8'><body>{body}</body>")
    requested: list[str] = []

    def only_the_page(route) -> None:
        if route.request.url == page_file.as_uri():
            route.continue_()
        else:
            requested.append(route.request.url)
            route.abort()

    context = chromium.new_context()  # its own cookies, storage and routes
    try:
        page = context.new_page()
        page.route("**/*", only_the_page)
        page.goto(page_file.as_uri(), wait_until="load")
        page.wait_for_timeout(300)
        pwned = page.evaluate("window.__pwned === 1")
        counts = page.evaluate(  # nbconvert links each heading to itself: not ours
            "['img', 'script', 'a:not(.anchor-link)', 'iframe', '[onerror]']"
            ".map(s => document.querySelectorAll(s).length)"
        )
        shown = page.inner_text("body")
    finally:
        context.close()
    assert not pwned and counts == [0, 0, 0, 0, 0] and requested == []
    assert "onerror" in shown and "javascript:" in shown  # shown as text, not dropped


# -- HTML: the report, the notebook repr, the dashboard's tables ---------------------------------


def test_html_views_escape_and_bound_names(hostile: Path):
    scanned = scan(hostile)
    findings = check(scanned, model=False)
    from inspector._internal.findings.finding import findings_to_frame
    from inspector._internal.report.html import frame_html

    for html in (
        scanned_html(scanned, findings=findings),
        findings_html(findings_to_frame(findings)),
        problems_html(scanned, findings),
        frame_html(scanned.tensors, columns=["name", "file", "dtype"]),
    ):
        assert not CONTROL.search(html.replace("\n", "")) and len(html) < 200_000
        parsed = _Tags(html)
        assert {t for t, _ in parsed.tags} <= {
            "style", "div", "b", "code", "table", "thead", "tbody", "tr", "th", "td", "span", "br"
        }  # fmt: skip
        assert not [a for _, attrs in parsed.tags for a, _ in attrs if a.startswith("on")]


def test_html_report_escapes_and_bounds_names(hostile: Path, tmp_path: Path):
    pytest.importorskip("plotly")
    from inspector.widgets.report import write_html_report

    scanned = scan(hostile)
    report = write_html_report(scanned, check(scanned, model=False), tmp_path / "r.html")
    text = report.read_text(encoding="utf-8")
    page = re.sub(r"<script\b.*?</script>", "", text, flags=re.S)  # plotly.js, figure data
    assert not CONTROL.search(page.replace("\n", ""))
    assert not re.search(r"mlp\.A{300}", text)  # the 2M-character name is cut, figures too
    assert "\\u001b]0;pwned" not in text  # nor do figures carry raw escapes (JSON-encoded)
    for bad in ("<img src=x", "<script>window.__pwned", 'onerror="window'):
        assert bad not in text


# -- CSV: the tensor export ------------------------------------------------------------------


def test_csv_export_neutralises_formulas(tmp_path: Path):
    names = [*FORMULAS, "\tx", "\rx", "model.layers.0.q.weight", "a;=1+1", big_name(100_000)]
    rows = pd.DataFrame(
        {"name": names, "file": "s.safetensors", "dtype": "BF16", "shape": [(1,)] * len(names),
         "numel": 1, "nbytes": 2, "layer": pd.array([0] * len(names), dtype="Int64")}
    )  # fmt: skip
    out = export_tensors(rows, tmp_path / "t.csv")
    with out.open(newline="", encoding="utf-8") as f:
        cells = [row[0] for row in list(csv.reader(f))[1:]]
    for cell in cells:
        assert cell[:1] not in ("=", "+", "-", "@", "\t", "\r"), cell
        assert not CONTROL.search(cell) and len(cell) <= 32_000
    assert cells[: len(FORMULAS)] == ["'" + f for f in FORMULAS]
    assert cells[5:9] == ["\\tx", "\\rx", "model.layers.0.q.weight", "a;=1+1"]
    assert pd.read_csv(out)["numel"].tolist() == [1] * len(names)  # numbers stay numbers
    assert pd.read_parquet(export_tensors(rows, tmp_path / "t.parquet"))["name"].tolist() == names


# -- every command, in a terminal or a CI log ---------------------------------------------------


def _terminal_safe(proc: subprocess.CompletedProcess, *, limit: int = 100_000) -> None:
    no_traceback(proc)
    for stream in (proc.stdout, proc.stderr):
        assert not CONTROL.search(stream.replace("\n", "")), CONTROL.search(
            stream.replace("\n", "")
        )
        assert len(stream) < limit, len(stream)
        assert not re.search(r"^ERROR forged", stream, re.M)


def _outcome(proc: subprocess.CompletedProcess) -> tuple[int, str, str]:
    """What a run showed: `commands.run` in this process must show what the child did."""
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def dcp_hostile(tmp_path_factory) -> Path:
    """DCP-sharded safetensors whose `.hf_metadata/` holds a file named with escape sequences
    and whose recorded mapping names a tensor no shard holds, with escapes and markup."""
    from inspector._internal.demo.dcp import write_dcp_demo

    folder = write_dcp_demo(tmp_path_factory.mktemp("dcp") / "run")
    meta = folder / ".hf_metadata"
    (meta / f"tokenizer{ESCAPES}.json").write_text("{}")
    mapping = meta / "fqn_to_file_index_mapping.json"
    doc = json.loads(mapping.read_text())
    doc[f"ghost{ESCAPES}<img src=x onerror=1>"] = 1
    mapping.write_text(json.dumps(doc))
    return folder


@pytest.mark.parametrize(
    "command",
    [
        ["check", "--no-model", "--verbose"],
        ["check", "--no-model", "--fail-on", "never", "--verbose"],
        ["report", "--markdown", "--no-model"],
        ["repair", "--dry-run", "--diff"],
    ],
    ids=lambda c: " ".join(c),
)
def test_commands_on_a_hostile_checkpoint_print_no_control_characters(hostile: Path, command):
    proc = run(command[0], hostile, *command[1:])
    assert proc.returncode in (0, 1), (proc.returncode, proc.stderr[-2000:])
    _terminal_safe(proc)
    # The huge name, shown by head and tail (check lists names with --verbose: by default it
    # fits a screen, the issues and one line per code).
    assert "characters cut)" in proc.stdout
    assert "\\u202etxt.exe" in proc.stdout  # and the escapes, shown escaped
    if command[0] == "check":
        _terminal_safe(run("check", hostile, "--no-model"))


def test_scan_of_a_hostile_checkpoint_prints_no_control_characters(hostile: Path):
    _terminal_safe(run("scan", hostile))
    _terminal_safe(run("scan", hostile / f"model-00002-of-00002{ESCAPES}.safetensors"))


def test_diff_and_html_report_on_a_hostile_checkpoint(hostile: Path, tmp_path: Path):
    healthy = tmp_path / "healthy"
    healthy.mkdir()
    _shard(healthy / "model.safetensors", ["model.layers.0.a"])
    proc = cli("diff", healthy, hostile)  # a real process: diff's smoke test
    assert proc.returncode == 1
    assert _outcome(run("diff", healthy, hostile)) == _outcome(proc)  # what the others use
    _terminal_safe(proc)
    assert "only in B" in proc.stdout and "characters cut" in proc.stdout
    # A name is shown in at most NAME_LIMIT characters, in its line of places too (the
    # huge name outside the layers was cut only at a message's 2,000).
    assert max(map(len, proc.stdout.splitlines())) <= NAME_LIMIT + 4
    # The escaped name is in a shard the index does not list, which transformers never reads
    # (so the folder's diff leaves it out): diff that shard itself.
    proc = run("diff", healthy, hostile / f"model-00002-of-00002{ESCAPES}.safetensors")
    assert proc.returncode == 1
    _terminal_safe(proc)
    assert "only in B" in proc.stdout and "\\u202etxt.exe" in proc.stdout
    proc = run("report", hostile, "--no-model", "-o", tmp_path / "r.html")
    _terminal_safe(proc)


def test_consolidation_plan_shows_hostile_names_escaped(dcp_hostile: Path, tmp_path: Path):
    proc = run("consolidate", dcp_hostile, tmp_path / "out", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    _terminal_safe(proc)
    assert "tokenizer\\x1b]0;pwned\\x07" in proc.stdout  # copied, and shown escaped
    assert not (tmp_path / "out").exists()


def test_an_error_line_shows_the_name_escaped(tmp_path: Path):
    target = tmp_path / f"missing{ESCAPES}"
    proc = cli("scan", target)  # a real process's stderr and exit code: scan's smoke test
    assert proc.returncode == 2
    assert _outcome(run("scan", target)) == _outcome(proc)
    _terminal_safe(proc)
    assert len(proc.stderr.strip().splitlines()) == 1 and "\\x1b]0;pwned" in proc.stderr


def test_problems_and_findings_hold_exact_names_but_show_escaped_ones(hostile: Path):
    """The data stays exact (tables, filters and --json match on it); the words are legible."""
    from inspector._internal.diagnosis.issues import group_problems

    scanned = scan(hostile)
    findings = check(scanned, model=False)
    assert any(f.tensor == big_name() for f in findings)  # exact, not a copy per finding
    assert all(len(f.message) <= MESSAGE_LIMIT and f.message.isprintable() for f in findings)
    for p in group_problems(scanned, findings):
        for text in (p.title, p.impact, p.action.text, p.action.command):
            assert text.isprintable() and len(text) <= MESSAGE_LIMIT


# -- memory ----------------------------------------------------------------------------------


def test_building_findings_does_not_copy_a_huge_name():
    name = big_name(50_000_000)
    tracemalloc.start()
    found = [
        make_finding("unindexed-tensor", f"s.safetensors holds '{legible(name)}'", tensor=name)
        for _ in range(200)
    ]
    found.append(make_finding("header-invalid-entry", f"tensor {short_repr(name)} is bad"))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2_000_000, f"{peak:,} bytes for 201 findings about a 50 MB name"
    assert all(f.tensor is name for f in found[:200])


# VmHWM, not ru_maxrss: Linux carries ru_maxrss over fork+exec, so a child of a large pytest
# process would report its parent's size.
_MEASURED = (
    "import re, sys\n"
    "from inspector._internal.cli.main import main\n"
    "code = main(sys.argv[1:])\n"
    "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)\n"
    "print(f'maxrss {hwm}', file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def test_check_of_a_huge_name_is_bounded_in_a_subprocess(tmp_path: Path):
    """A 20M-character name (a valid 20 MB shard): the text output stays a few kB (it was the
    name once per finding, 20 MB each) and the process stays within a fixed budget."""
    folder = hostile_folder(tmp_path, big=20_000_000)
    cmd = [sys.executable, "-c", _MEASURED, "check", str(folder), "--no-model"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    *err, measured = proc.stderr.splitlines()
    proc.stderr = "\n".join(err)
    assert proc.returncode == 1, proc.stderr
    _terminal_safe(proc, limit=20_000)
    peak_kb = int(measured.removeprefix("maxrss "))
    assert peak_kb < RSS_BUDGET_KB, f"check used {peak_kb:,} kB for a 20 MB name"


# -- names no loader reads the same way: one rule, findings, never a traceback ------------------


def test_a_shard_named_with_a_backslash_is_a_finding_not_a_traceback(tmp_path: Path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    _shard(folder / "model.safetensors", ["model.layers.0.a"])
    _shard(folder / "model\\copy.safetensors", ["model.layers.0.b"])
    findings = check(scan(folder), model=False)
    unsafe = [f for f in findings if f.code == "file-unsafe"]
    assert [f.file for f in unsafe] == ["model\\copy.safetensors"]
    assert "backslash" in unsafe[0].message
    for command in (["check", folder, "--no-model"], ["scan", folder], ["repair", folder]):
        proc = run(*command)
        no_traceback(proc)
        assert proc.returncode in (0, 1), (command, proc.stderr)
    single = run("scan", folder / "model\\copy.safetensors")
    no_traceback(single)
    assert "file-unsafe" in single.stdout


def test_a_file_name_that_is_not_utf8_is_a_finding_not_a_crash(tmp_path: Path):
    """Bytes that are not UTF-8 reach Python as lone surrogates, which no table, JSON file or
    terminal can hold (they crashed the scan inside pyarrow)."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    _shard(folder / "model.safetensors", ["model.layers.0.a"])
    _shard(Path(os.fsdecode(os.fsencode(folder) + b"/bad\xff\x1b.safetensors")), ["b"])
    findings = check(scan(folder), model=False)
    unsafe = [f for f in findings if f.code == "file-unsafe"]
    assert [f.file for f in unsafe] == ["bad\ufffd\x1b.safetensors"]
    assert "not valid UTF-8" in unsafe[0].message and unsafe[0].message.isprintable()
    proc = run("check", folder, "--no-model")
    assert proc.returncode == 1
    _terminal_safe(proc)


def test_consolidation_decides_about_names_in_its_plan(tmp_path: Path):
    """A metadata file DEST cannot be given is named in the plan and not copied; the
    consolidation writes every shard and the index (it used to stop after the shards)."""
    from inspector._internal.demo.dcp import write_dcp_demo

    source = write_dcp_demo(tmp_path / "run")
    shutil.copy(source / ".hf_metadata" / CONFIG_NAME, source / ".hf_metadata" / "tok\\en.json")
    proc = run("consolidate", source, tmp_path / "out", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    no_traceback(proc)
    assert "not copied: .hf_metadata/tok\\en.json has a backslash" in proc.stdout
    assert (tmp_path / "out" / INDEX).is_file() and (tmp_path / "out" / CONFIG_NAME).is_file()
    assert not (tmp_path / "out" / "tok\\en.json").exists()


def test_a_rank_file_named_with_a_backslash_refuses_the_plan_before_writing(tmp_path: Path):
    from inspector._internal.demo.dcp import write_dcp_demo

    source = write_dcp_demo(tmp_path / "run")
    first = sorted(source.glob("shard-*.safetensors"))[0]
    shutil.copy(first, first.with_name(first.stem + "\\.safetensors"))
    proc = run("consolidate", source, tmp_path / "out", "--no-progress")
    no_traceback(proc)
    assert proc.returncode == 2 and "file-unsafe" in proc.stderr and "backslash" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_an_unexpected_error_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path: Path):
    """A bug must not read as findings to CI (exit 1) nor flood its log with a traceback."""
    import inspector._internal.report.summary

    def broken(*_a, **_k):
        raise ValueError("something no code path expected")

    # `scan`'s run imports summarize when it runs (its module stays light for --help).
    monkeypatch.setattr(inspector._internal.report.summary, "summarize", broken)
    _shard(tmp_path / "model.safetensors", ["model.layers.0.a"])
    assert main(["scan", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "internal error at test_hostile_names.py" in err[0]
    assert "ValueError: something no code path expected" in err[0]


def test_fuzz_findings_check_rejects_control_characters():
    from fuzz.targets import _check_findings

    from inspector._internal.findings.finding import Finding, Severity

    _check_findings([make_finding("file-unsafe", f"a{ESCAPES}")])  # made legible
    with pytest.raises(AssertionError):
        _check_findings([Finding("file-unsafe", Severity.ERROR, "a\x1bb")])
