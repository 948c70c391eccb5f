"""The README and the documentation pages say what the code does.

MkDocs' strict build (`make docs`, and `make test`) checks the links and anchors between the
pages of docs/ and renders the API pages from the docstrings. This file checks what that build
does not see: the README (an entry page outside the site) runs as written, its commands and
the CLI pages' options exist, its links resolve, every external link anywhere is a well-formed
https URL (CI cannot reach other hosts, so they are not fetched), and the pages name only the
public surface.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import inspector
from inspector import scan, widgets
from inspector._internal.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# The pages written for people (not generated, not owned by one module's authors) that must
# name the Python API only by its public names; formats.md, architecture.md and SECURITY.md
# speak of the code's modules on purpose.
PUBLIC_PAGES = [
    README,
    *(DOCS / name for name in ("index.md", "cli.md", "python.md", "remote.md")),
    *(DOCS / name for name in ("notebooks.md", "benchmarks.md", "development.md")),
]
ALL_MARKDOWN = [README, ROOT / "SECURITY.md", *sorted(DOCS.glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)|<(https?://[^>\s]+)>")
DEMO = "modelopt-1422-sidecar-drift"
# What that demo's index and sidecar get wrong (they forgot its MTP tensors).
DEMO_DRIFT = {"unindexed-tensor", "sidecar-unlisted-tensor", "total-size-mismatch"}


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def _lines(block: str) -> list[str]:
    return [line for line in block.splitlines() if line.strip()]


def _readme_block(heading: str, language: str) -> list[str]:
    section = README.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    (block,) = _blocks(section, language)
    return _lines(block)


def _slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) and GitHub give a heading, for our headings."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", text))


def _cli(*argv: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
    return code, out.getvalue() + err.getvalue()


def test_readme_set_up_is_the_two_commands_and_ci_runs_the_test_one() -> None:
    commands = [
        line.split("#")[0].strip()
        for line in _readme_block("Set-up: two commands on a fresh machine", "sh")
    ]
    assert commands == ["make demo", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert _lines(ci)[-1].strip() == "make test"


def test_readme_has_ten_cli_lines_and_each_is_a_real_command_with_real_options() -> None:
    lines = _readme_block("Ten CLI lines", "sh")
    assert len(lines) == 10
    for line in lines:
        _check_options(line.split("#")[0].split())


def test_every_option_the_cli_pages_show_exists() -> None:
    """Each `ckpt-inspect COMMAND ... --option` line of the CLI and remote pages names options
    that COMMAND's --help lists (a renamed or dropped option turns this red)."""
    checked = 0
    for page in (DOCS / "cli.md", DOCS / "remote.md"):
        for block in _blocks(page.read_text(), "sh"):
            for line in _lines(block):
                words = line.split("#")[0].split()
                if words[:1] == ["ckpt-inspect"]:
                    _check_options(words)
                    checked += 1
    assert checked >= 30


def _check_options(words: list[str]) -> None:
    assert words[0] == "ckpt-inspect", words
    command = words[1]
    code, help_text = _cli(command, "--help")
    assert code == 0, f"`ckpt-inspect {command}` is not a command:\n{help_text}"
    for word in words[2:]:
        option = word.strip("[]").split("=")[0]
        if option.startswith("--"):
            assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", help_text), (
                f"`ckpt-inspect {command}` has no option {option}"
            )


@pytest.mark.slow
def test_readme_python_lines_run_as_written(tmp_path: Path) -> None:
    """The README's ten Python lines, on a copy of the demo they name: the repair plan they
    execute really fixes the checkpoint. (The last line opens the dashboard, which needs a
    notebook front end: tests/test_lab_browser.py drives it in JupyterLab.)"""
    lines = _readme_block("Ten Python lines", "python")
    assert len(lines) == 10
    assert lines[-1].startswith("ckpt.dashboard()")
    demos = tmp_path / "demos"
    assert _cli("demo", str(demos))[0] == 0
    copy = tmp_path / "build" / "demo" / DEMO
    shutil.copytree(demos / DEMO, copy)
    before = inspector.check(scan(copy))
    assert {f.code for f in before} >= DEMO_DRIFT

    namespace: dict[str, object] = {}
    with contextlib.chdir(tmp_path), contextlib.redirect_stdout(io.StringIO()) as out:
        exec(compile("\n".join(lines[:-1]), "README.md", "exec"), namespace)
    assert "load check" in out.getvalue() or "loads" in out.getvalue()
    assert "+++" in out.getvalue()  # the plan's unified diff
    after = {f.code for f in inspector.check(scan(copy))}
    assert not after & DEMO_DRIFT, after
    assert (copy / ".ckpt-inspect-backup").is_dir()


def test_api_page_documents_exactly_the_public_surface() -> None:
    directives = re.findall(r"^::: (\S+)$", (DOCS / "python.md").read_text(), flags=re.M)
    public = [f"inspector.{name}" for name in inspector.__all__] + [
        f"inspector.widgets.{name}" for name in widgets.__all__
    ]
    assert sorted(directives) == sorted(public)


def test_pages_name_only_public_modules_and_names() -> None:
    """Module paths inside the package move; the pages people read name the public surface."""
    public = set(inspector.__all__) | {"widgets"}
    ui_names = set(widgets.__all__)
    for page in PUBLIC_PAGES:
        for match in re.finditer(
            r"\binspector\.([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?", page.read_text()
        ):
            first, second = match.groups()
            assert first in public, f"{page.name} names inspector.{first}, not public"
            if first == "widgets" and second:
                assert second in ui_names, f"{page.name} names inspector.widgets.{second}"


def test_readme_links_resolve_and_cover_every_page() -> None:
    text = README.read_text()
    targets = [m[0] for m in LINK.findall(text) if m[0]]
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)
    for target in targets + images:
        if urlsplit(target).scheme:
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path
        assert file.is_file(), f"README links to {target}: no such file"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", file.read_text(), flags=re.M)
            assert anchor in {_slug(h) for h in headings}, f"README: no anchor #{anchor} in {path}"
    linked = {Path(t.partition("#")[0]).name for t in targets}
    pages = {p.name for p in DOCS.glob("*.md")} - {"index.md", "security.md"} | {"SECURITY.md"}
    assert pages <= linked, f"pages the README does not link: {sorted(pages - linked)}"


def _external_link_problem(target: str) -> str | None:
    """Why `target` is not a well-formed external link (None: it is, or it is relative)."""
    parts = urlsplit(target)
    if not parts.scheme:
        return "protocol-relative" if target.startswith("//") else None
    if parts.scheme != "https":
        return "not https"
    if not re.fullmatch(r"[a-z0-9-]+(\.[a-z0-9-]+)+", parts.hostname or ""):
        return "no public host name"
    if re.search(r"[\s<>\"'`]", target) or target.endswith((".", ",", ";", ":")):
        return "stray characters"
    return None


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        ("https://huggingface.co/docs/safetensors", None),
        ("cli.md#will-it-load", None),
        ("http://example.com/x", "not https"),
        ("//example.com/x", "protocol-relative"),
        ("https://localhost/x", "no public host name"),
        ("https:/example.com", "no public host name"),
        ("https://example.com/x.", "stray characters"),
    ],
)
def test_the_link_check_tells_a_malformed_link(target: str, problem: str | None) -> None:
    assert _external_link_problem(target) == problem


@pytest.mark.parametrize("page", ALL_MARKDOWN, ids=lambda p: p.name)
def test_external_links_are_well_formed_https(page: Path) -> None:
    for inline, bare in LINK.findall(page.read_text()):
        target = inline or bare
        problem = _external_link_problem(target)
        assert problem is None, f"{page.name}: {target}: {problem}"


def test_screenshot_is_a_small_png() -> None:
    data = (DOCS / "dashboard.png").read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert 20_000 < len(data) < 400_000
