"""The architecture holds: no import cycles, layouts never judge, every rule declares its
codes."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import inspector
from inspector.checks import RULES, check
from inspector.codes import Code
from inspector.scan import scan

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(inspector.__path__, "inspector.")
    # The UI needs ipywidgets/plotly; its own tests import it.
    if not m.name.startswith("inspector.widgets") and m.name != "inspector.__main__"
)


def _imports_alone(*modules: str) -> subprocess.CompletedProcess[str]:
    code = "\n".join(f"import {m}" for m in modules)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_every_module_imports_alone_in_a_fresh_interpreter() -> None:
    # One interpreter per module: a cycle hidden by the package's import order shows here.
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(zip(MODULES, pool.map(_imports_alone, MODULES), strict=True))
    failed = {m: r.stderr.strip().splitlines()[-1] for m, r in results.items() if r.returncode}
    assert failed == {}


@pytest.mark.parametrize(
    "order",
    [
        ("inspector.checks", "inspector.scan"),
        ("inspector.scan", "inspector.checks"),
        ("inspector.checks", "inspector.layouts"),
        ("inspector.layouts", "inspector.checks"),
        ("inspector.model", "inspector.layouts", "inspector.checks"),
    ],
)
def test_checks_scan_and_layouts_import_in_either_order(order: tuple[str, ...]) -> None:
    result = _imports_alone(*order)
    assert result.returncode == 0, result.stderr


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
    assert len({r.name for r in RULES}) == len(RULES)
    for rule in RULES:
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
