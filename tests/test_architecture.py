"""The architecture holds: no import cycles, layouts never judge, every rule declares its
codes."""

from __future__ import annotations

import ast
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import inspector
from inspector.checks import MODEL_RULES, RULES, check, model_rules_for, rules_for
from inspector.codes import Code
from inspector.model_load import LoadVerdict, ShapeMismatch
from inspector.scan import scan

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(inspector.__path__, "inspector.")
    # The UI needs ipywidgets/plotly; its own tests import it.
    if not m.name.startswith("inspector.widgets") and m.name != "inspector.__main__"
)


ORDERS = [
    ("inspector.checks", "inspector.scan"),
    ("inspector.scan", "inspector.checks"),
    ("inspector.checks", "inspector.layouts"),
    ("inspector.layouts", "inspector.checks"),
    ("inspector.model", "inspector.layouts", "inspector.checks"),
]


@pytest.fixture(scope="module")
def imported_alone() -> dict[tuple[str, ...], str | None]:
    """Each module alone, and each order of ORDERS, imported in a process that has no
    `inspector` module loaded (tests/import_alone.py: forked from a parent that holds only
    the third-party libraries): group -> None, or the last line of its error."""
    groups = [(m,) for m in MODULES] + ORDERS
    result = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("import_alone.py"))],
        input="\n".join(" ".join(g) for g in groups),
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    return {tuple(group): error for group, error in rows}


def test_every_module_imports_alone(imported_alone: dict) -> None:
    # One process per module: a cycle hidden by the package's import order shows here.
    failed = {m: imported_alone[(m,)] for m in MODULES if imported_alone[(m,)] is not None}
    assert failed == {}


def test_a_cycle_fails_in_the_import_probe(tmp_path: Path) -> None:
    """The probe sees what a fresh interpreter sees: a module that only imports after
    another one fails alone, and the probe's parent holds no module of the project."""
    package = tmp_path / "inspector_probe_demo"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from inspector_probe_demo.b import B\nA = 1\n")
    (package / "b.py").write_text("from inspector_probe_demo.a import A\nB = 2\n")
    result = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("import_alone.py"))],
        input="inspector_probe_demo.a\njson\n",
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    (a, a_error), (json_group, json_error) = map(json.loads, result.stdout.splitlines())
    assert a == ["inspector_probe_demo.a"] and "ImportError" in a_error and "circular" in a_error
    assert json_group == ["json"] and json_error is None


@pytest.mark.parametrize("order", ORDERS)
def test_checks_scan_and_layouts_import_in_either_order(
    order: tuple[str, ...], imported_alone: dict
) -> None:
    assert imported_alone[order] is None


def test_layouts_never_import_checks_or_build_findings() -> None:
    offenders = []
    for path in (ROOT / "inspector" / "layouts").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name.startswith("inspector.checks") or name in (
                    "inspector.findings.Finding",
                    "inspector.findings.make_finding",
                ):
                    offenders.append(f"{path.name}: {name}")
    assert offenders == []


def test_rule_names_are_unique_and_codes_are_real() -> None:
    rules = [*RULES, *MODEL_RULES]
    assert len({r.name for r in rules}) == len(rules)
    for rule in rules:
        assert rule.codes and rule.codes <= set(Code), rule.name


@pytest.fixture(scope="module")
def demo_scans(tmp_path_factory: pytest.TempPathFactory) -> list:
    from inspector.demo import write_demos

    folder = tmp_path_factory.mktemp("demos")
    write_demos(folder, log=lambda _line: None)
    return [scan(p) for p in sorted(folder.iterdir()) if p.is_dir()]


def test_every_emitted_code_is_declared_by_its_rule(demo_scans: list) -> None:
    """Each rule, run on every demo (healthy and damaged, every layout), emits only the codes
    it declares; and the demos exercise most rules."""
    fired = set()
    for scanned in demo_scans:
        for rule in RULES:
            if rule.layouts is not None and scanned.layout not in rule.layouts:
                continue
            codes = {f.code for f in rule.run(scanned)}
            assert codes <= rule.codes, (rule.name, scanned.path.name, codes - rule.codes)
            if codes:
                fired.add(rule.name)
        assert {f.code for f in check(scanned)} <= set(Code)
    assert len(fired) >= 4, fired


def _verdict_against(scanned) -> LoadVerdict:
    """A verdict that finds fault with the scan's own tensors: one missing, one unexpected,
    one mis-shaped, and a parameter count that agrees with neither the index nor the shards."""
    names = [n for s in scanned.shards for n in s.names]
    shape = scanned.shards[0].shapes[0] if scanned.shards else ()
    return LoadVerdict(
        architecture="DemoModel",
        missing=("model.not_stored.weight",),
        unexpected=tuple(names[:1]),
        mismatched=tuple(ShapeMismatch(n, tuple(shape), (*shape, 2)) for n in names[1:2]),
        parameters=7,
    )


def test_every_model_rule_adds_or_revises_only_declared_codes(demo_scans: list) -> None:
    """Each model rule, given findings and a verdict, changes only findings of the codes it
    declares; the load rule fires on every loadable demo."""
    fired = set()
    for scanned in demo_scans:
        found = [f for rule in rules_for(scanned.layout) for f in rule.run(scanned)]
        verdict = _verdict_against(scanned)
        for rule in model_rules_for(scanned.layout):
            after = rule.run(scanned, verdict, list(found))
            changed = {f.code for f in set(after) ^ set(found)}
            assert changed <= rule.codes, (rule.name, scanned.path.name, changed - rule.codes)
            if changed:
                fired.add((rule.name, scanned.layout))
            found = after
    assert {name for name, _ in fired} >= {"load"}


def test_check_builds_the_load_verdict_once_or_reuses_the_callers(
    demo_scans: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    import inspector.model_load

    built: list[object] = []

    def counting(scanned, *, trust_remote_code=False):
        built.append(scanned)
        return _verdict_against(scanned)

    monkeypatch.setattr(inspector.model_load, "load_verdict", counting)
    scanned = next(s for s in demo_scans if s.layout == "hf-sharded")
    codes = {f.code for f in check(scanned)}
    assert len(built) == 1 and {"load-missing-tensor", "load-unexpected-tensor"} <= codes
    given = _verdict_against(scanned)
    assert {f.code for f in check(scanned, verdict=given)} == codes and len(built) == 1
    assert not {f.code for f in check(scanned, model=False)} & {"load-missing-tensor"}
    assert len(built) == 1


# Modules that may touch local files themselves: the storage layer (the one reader), the
# writers of outputs (journaled repairs, the copy engine's DEST, the demo writers), the
# load check's gate on modelling code (it looks for links among the folder's .py files) and
# the importer of that code (it checks each file it imports is a regular file reached through
# no link), and the sandbox, which reads only its own process's memory use
# (/proc/self/statm): the child it runs is handed bytes the storage read.
_OWN_FILE_ACCESS = {
    "inspector/storage/local.py",
    "inspector/atomic.py",
    "inspector/consolidate/engine.py",
    "inspector/consolidate/driver.py",
    "inspector/consolidate/dest.py",
    "inspector/sandbox.py",
    "inspector/model_load.py",
    "inspector/sealed.py",
    "inspector/demo/__init__.py",
    "inspector/demo/dcp.py",
    "inspector/demo/safetensors_layouts.py",
    "inspector/demo/torch_dist.py",
}
_FILE_CALLS = re.compile(
    r"(?<![.\w])(?<!def )open\(|\bos\.(open|scandir|listdir|stat|lstat|pread|walk)\(|"
    r"\.read_bytes\(\)|\.read_text\(|\.iterdir\(|\.glob\(|\bshutil\.copy"
)


def test_every_read_goes_through_the_storage_layer() -> None:
    """`grep` for file access in the core: only the storage layer and writers of outputs."""
    offenders = {}
    for path in sorted((ROOT / "inspector").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in _OWN_FILE_ACCESS:
            continue
        hits = [
            f"{n}: {line.strip()}"
            for n, line in enumerate(path.read_text().splitlines(), 1)
            if _FILE_CALLS.search(line.split("#")[0])
        ]
        if hits:
            offenders[rel] = hits
    assert offenders == {}
