"""The architecture holds: no import cycles, layouts never judge, every rule declares its
codes."""

from __future__ import annotations

import ast
import functools
import json
import pkgutil
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import inspector
from inspector._internal.checks import MODEL_RULES, RULES, check, model_rules_for, rules_for
from inspector._internal.common.filenames import CONFIG_NAME
from inspector._internal.findings.codes import Code
from inspector._internal.load.records import ShapeMismatch
from inspector._internal.load.verdict import LoadVerdict
from inspector._internal.scan.entry import scan

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(inspector.__path__, "inspector.")
    # The UI needs ipywidgets/plotly; its own tests import it.
    if not m.name.startswith("inspector.widgets") and m.name != "inspector.__main__"
)


ORDERS = [
    ("inspector._internal.checks", "inspector._internal.scan.entry"),
    ("inspector._internal.scan.entry", "inspector._internal.checks"),
    ("inspector._internal.checks", "inspector._internal.layouts"),
    ("inspector._internal.layouts", "inspector._internal.checks"),
    (
        "inspector._internal.checkpoint.scanned",
        "inspector._internal.layouts",
        "inspector._internal.checks",
    ),
]


@pytest.fixture(scope="module")
def imported_alone() -> dict[tuple[str, ...], str | None]:
    """Each module alone, and each order of ORDERS, imported in a process that has no
    `inspector` module loaded (tests/import_alone.py: forked from a parent that holds only
    the third-party libraries, or from one that also imported the module's package from
    scratch, as a fresh interpreter does first): group -> None, or the last line of its
    error."""
    groups = [(m,) for m in MODULES] + ORDERS + [("inspector",)]
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
    assert imported_alone[("inspector",)] is None  # the facade, its __init__ run


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


def test_modules_forked_from_their_package_still_import_alone(tmp_path: Path) -> None:
    """A package that is a group of its own is imported once and its modules are forked from
    there (tests/import_alone.py): each still sees only what a fresh interpreter would, the
    package and what its `__init__` imported, never what a sibling imported before it."""
    package = tmp_path / "inspector_probe_pkg"
    (package / "broken").mkdir(parents=True)
    (package / "__init__.py").write_text("from inspector_probe_pkg import base\n")
    (package / "base.py").write_text("BASE = 1\n")
    (package / "a.py").write_text("from inspector_probe_pkg.b import B\nA = 1\n")
    (package / "b.py").write_text("from inspector_probe_pkg.a import A\nB = 2\n")
    (package / "d.py").write_text("X = 3\n")
    (package / "e.py").write_text("import inspector_probe_pkg.d\n")
    # Works only after something imported `d`: in a fresh interpreter it fails.
    (package / "c.py").write_text("import inspector_probe_pkg\nY = inspector_probe_pkg.d.X\n")
    (package / "f.py").write_text("import inspector_probe_pkg\nZ = inspector_probe_pkg.base.BASE\n")
    (package / "broken" / "__init__.py").write_text("raise RuntimeError('broken package')\n")
    (package / "broken" / "m.py").write_text("M = 1\n")
    groups = ["inspector_probe_pkg"] + [f"inspector_probe_pkg.{m}" for m in "bedacf"]
    groups += ["inspector_probe_pkg.broken", "inspector_probe_pkg.broken.m"]
    result = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("import_alone.py"))],
        input="\n".join(groups),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    errors = {
        g[0].removeprefix("inspector_probe_pkg."): e
        for g, e in map(json.loads, result.stdout.splitlines())
    }
    assert [g for g in errors] == [g.removeprefix("inspector_probe_pkg.") for g in groups]
    assert errors["inspector_probe_pkg"] is None
    assert errors["d"] is errors["e"] is errors["f"] is None
    assert "ImportError" in errors["a"] and "circular" in errors["a"]
    assert "ImportError" in errors["b"] and "circular" in errors["b"]
    assert "AttributeError" in errors["c"] and "'d'" in errors["c"]
    assert errors["broken"] == errors["broken.m"] == "RuntimeError: broken package"


def test_no_module_is_forked_from_the_facade() -> None:
    """The group `inspector` runs the public facade: the modules directly in the project's
    package are forked from the bare parent, never from that group's process."""
    from import_alone import _by_package

    groups = [["inspector"], ["inspector.errors"], ["inspector._internal"]]
    groups += [["inspector._internal.checks"], ["inspector._internal.checks.rules"]]
    assert _by_package(groups) == {"inspector._internal": [3], "inspector._internal.checks": [4]}


@pytest.mark.parametrize("order", ORDERS)
def test_checks_scan_and_layouts_import_in_either_order(
    order: tuple[str, ...], imported_alone: dict
) -> None:
    assert imported_alone[order] is None


def test_layouts_never_import_checks_or_build_findings() -> None:
    offenders = []
    layouts = sorted((ROOT / "inspector" / "_internal" / "layouts").glob("*.py"))
    assert len(layouts) > 5, "the layouts folder moved: this test would check nothing"
    for path in layouts:
        for base, level, imported, _, _ in _source(path).imports:
            if level and not base:
                continue
            names = [base, f"{base}.{imported}"] if imported else [base]
            for name in names:
                if name.startswith("inspector._internal.checks") or name in (
                    "inspector._internal.findings.finding.Finding",
                    "inspector._internal.findings.finding.make_finding",
                ):
                    offenders.append(f"{path.name}: {name}")
    assert offenders == []


def test_rule_names_are_unique_and_codes_are_real() -> None:
    rules = [*RULES, *MODEL_RULES]
    assert len({r.name for r in rules}) == len(rules)
    for rule in rules:
        assert rule.codes and rule.codes <= set(Code), rule.name


@pytest.fixture(scope="module")
def demo_scans(demo_checkpoints: Path) -> list:
    return [scan(p) for p in sorted(demo_checkpoints.iterdir()) if p.is_dir()]


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
        # Without the model: the model rules' codes are the next test's (a verdict against
        # every demo), and building each demo's model here cost 4-5 s of CPU; every finding
        # is made by `make_finding`, which refuses a code the table does not hold.
        assert {f.code for f in check(scanned, model=False)} <= set(Code)
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
    import inspector._internal.checks

    built: list[object] = []

    def counting(scanned, *, trust_remote_code=False, cache=True):
        built.append(scanned)
        return _verdict_against(scanned)

    monkeypatch.setattr(inspector._internal.checks, "load_verdict", counting)
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
# (/proc/self/statm): the child it runs is handed bytes the storage read; and the verdict
# cache, which reads and writes its own folder outside any checkpoint, and digests the Python
# files of the tool and, for `trust_remote_code`, of the folder.
_OWN_FILE_ACCESS = {
    "inspector/_internal/storage/local.py",
    "inspector/_internal/execution/atomic.py",
    # lists a folder it recovers (names and lstat only), removing what a killed run left
    "inspector/_internal/execution/temps.py",
    "inspector/_internal/plans/consolidate/engine.py",
    "inspector/_internal/formats/pickles/sandbox.py",
    "inspector/_internal/load/verdict.py",
    "inspector/_internal/load/seal.py",
    # writes the private copy vLLM reads, inside the sealed folder (reads go through storage)
    "inspector/_internal/load/engine_child.py",
    "inspector/_internal/load/cache.py",
    "inspector/_internal/demo/__init__.py",
    "inspector/_internal/demo/dcp.py",
    "inspector/_internal/demo/safetensors_layouts.py",
    "inspector/_internal/demo/torch_dist.py",
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


# -- the import graph, read from the source (imports inside functions included) -----------


def _module_files() -> dict[str, Path]:
    """Every module of the core and the UI, by dotted name (`widgets/` is `inspector.widgets`)."""
    out = {}
    for root, package in (
        (ROOT / "inspector", "inspector"),
        (ROOT / "widgets", "inspector.widgets"),
    ):
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((package, *parts))] = path
    return out


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (types only, never executed)."""
    hidden = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _names_type_checking(node.test):
            for child in node.body:
                hidden.update(id(n) for n in ast.walk(child))
    return hidden


def _names_type_checking(test: ast.expr) -> bool:
    """Whether an `if`'s test names TYPE_CHECKING (`TYPE_CHECKING`, `typing.TYPE_CHECKING`):
    read from its nodes, not from its text (`ast.unparse` of every `if` was a fifth of the
    time `_source` took)."""
    return any(
        (isinstance(n, ast.Name) and n.id == "TYPE_CHECKING")
        or (isinstance(n, ast.Attribute) and n.attr == "TYPE_CHECKING")
        for n in ast.walk(test)
    )


@dataclass(frozen=True)
class _Source:
    """What the tests below read from one source file: its import statements (the module
    as written, `level` dots for a relative one, the name imported or "", the line, whether
    only under `if TYPE_CHECKING:`), its string constants that are not docstrings and the
    pickle mechanisms it uses (`_pickle_mechanisms`)."""

    imports: tuple[tuple[str, int, str, int, bool], ...]
    strings: tuple[tuple[str, int], ...]
    pickles: frozenset[str]


@functools.cache
def _source(path: Path) -> _Source:
    """`path` parsed once per test process (the files do not change during a run): about
    200 files, each parsed and walked once instead of once per test that reads them."""
    text = path.read_text()
    tree = ast.parse(text)
    # An `if` can name TYPE_CHECKING only in a file that spells it.
    hidden = _type_checking_only(tree) if "TYPE_CHECKING" in text else set()
    docstrings: set[int] = set()
    imports: list[tuple[str, int, str, int, bool]] = []
    strings: list[tuple[str, int]] = []
    pickles: set[str] = set()
    # One walk, breadth first: a definition is met before its docstring.
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports += [(a.name, 0, "", node.lineno, id(node) in hidden) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base, level = node.module or "", node.level
            imports += [(base, level, a.name, node.lineno, id(node) in hidden) for a in node.names]
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            strings.append((node.value, node.lineno))
        elif (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        ):
            docstrings.add(id(node.body[0].value))
        if isinstance(node, _PICKLE_NODES):
            pickles |= _pickle_mechanism(node)
    return _Source(tuple(imports), tuple(strings), frozenset(pickles))


def _imports(module: str, path: Path, *, types: bool = False) -> list[tuple[str, str, int]]:
    """(imported module or `module.name`, the name, the line) for every import statement of
    `module`, at any depth (inside functions too); those under `if TYPE_CHECKING:` only with
    `types`."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for base, level, name, line, hidden in _source(path).imports:
        if hidden and not types:
            continue
        if level:
            anchor = package
            for _ in range(level - 1):
                anchor = anchor.rpartition(".")[0]
            base = f"{anchor}.{base}" if base else anchor
        out.append((base, name, line))
    return out


def _owner(files: dict[str, Path], name: str) -> str | None:
    """The module of `files` that `name` (a module, or `module.attribute`) is, or is in."""
    while name and name not in files:
        name = name.rpartition(".")[0]
    return name or None


def _import_graph(
    files: dict[str, Path], *, types: bool = False
) -> tuple[dict[str, set[str]], list[str]]:
    """module -> the project modules it imports (type-only imports too with `types`); and
    the private names imported across modules (`from a import _x`, a not the importer)."""

    graph: dict[str, set[str]] = {}
    private = []
    for module, path in files.items():
        edges = set()
        for base, name, _ in _imports(module, path, types=types):
            if not base.startswith("inspector"):
                continue
            full = f"{base}.{name}"
            target = _owner(files, full if full in files else base)
            if target and target != module:
                edges.add(target)
            # A dunder (`__version__`) is public by convention; `_name` is not.
            hidden = name.startswith("_") and not name.endswith("__")
            if hidden and target != module and f"{base}.{name}" not in files:
                private.append(f"{module}: from {base} import {name}")
        graph[module] = edges
    return graph, private


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_cycle_anywhere_even_inside_functions() -> None:
    """Every import statement of every module, those inside functions included (only
    `if TYPE_CHECKING:` blocks, which never run, are left out), makes a graph without a
    cycle: each module can be read knowing only the modules below it."""
    graph, _ = _import_graph(_module_files())
    assert _cycles(graph) == []


def test_no_circle_of_files_even_through_types() -> None:
    """Type-only imports count too: a module that names another's type for its signatures
    stands above it, so no two files may name each other, even for types (`widgets/` too:
    a tab names the dashboard through `widgets.tabs.Host`, never `Dashboard`)."""
    graph, _ = _import_graph(_module_files(), types=True)
    assert _cycles(graph) == []


def test_the_ui_reaches_the_core_through_one_door() -> None:
    """`widgets/` imports the core only through `inspector.ui` (docs/architecture.md): a tab
    that needs a fact the core does not name there gets it added to the core, not derived in
    the UI. Imports inside functions and type-only ones count."""
    files = _module_files()
    through: dict[str, set[str]] = {}
    for module, path in files.items():
        if not module.startswith("inspector.widgets"):
            continue
        for base, name, _ in _imports(module, path, types=True):
            target = f"{base}.{name}" if name else base
            if base == "inspector.ui" or target == "inspector.ui":
                continue
            if target.split(".")[0] == "inspector" and not target.startswith("inspector.widgets"):
                through.setdefault(module, set()).add(target)
    assert through == {}


# The libraries mypy skips on purpose though the code imports them (pyproject.toml says why).
_SKIPPED_AND_IMPORTED = {"torch", "transformers", "vllm"}


def test_mypy_skips_no_other_library_the_code_imports() -> None:
    """mypy does not analyse the libraries that only other libraries import (pyproject.toml,
    `follow_imports = "skip"`): one the code itself imports would be typed Any there, and
    mypy would see no error in its use. Imports inside functions and type-only ones count."""
    import tomllib

    overrides = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    skipped = {
        pattern.removesuffix(".*")
        for override in overrides
        if override.get("follow_imports") == "skip"
        for pattern in override["module"]
    }
    imported = {
        base.split(".")[0]
        for module, path in _module_files().items()
        for base, _, _ in _imports(module, path, types=True)
    }
    assert skipped & imported == _SKIPPED_AND_IMPORTED


# -- the floors: each room of inspector/_internal/ above everything it imports -----------

INTERNAL = "inspector._internal"


def _floors(text: str) -> list[list[str]]:
    """The rooms on each floor, lowest floor first, from the picture under "## Floors" in
    docs/architecture.md (one line per floor, top floor first; a line that starts with
    spaces continues the one above)."""
    block = text.split("\n## Floors\n", 1)[1].split("```")[1]
    floors = []
    for line in block.splitlines():
        if line.strip() and not line.startswith(" "):
            floors.append(re.findall(r"(\w+)/", line.split("   ")[0]))
    return floors[::-1]


def _room(module: str) -> str | None:
    """`checks` for `inspector._internal.checks.model_load`; None outside the rooms."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["inspector", "_internal"] and len(parts) > 2 else None


def _climbing(files: dict[str, Path], floors: list[list[str]]) -> list[str]:
    """Every import, type-only and inside functions included, from a room into a room on
    its own floor or a higher one."""
    floor = {room: n for n, rooms in enumerate(floors) for room in rooms}
    out: list[str] = []
    for module, path in files.items():
        here = _room(module)
        for base, name, line in _imports(module, path, types=True):
            full = f"{base}.{name}"
            target = _owner(files, full if full in files else base)
            there = _room(target) if target else None
            if here is None or there is None or there == here:
                continue
            if floor[there] >= floor[here]:
                out.append(f"{module}:{line}: {here} -> {there}")
    return sorted(set(out))


def test_the_floors_picture_names_every_room_once() -> None:
    floors = _floors((ROOT / "docs" / "architecture.md").read_text())
    rooms = [room for rooms in floors for room in rooms]
    on_disk = sorted(
        p.parent.name for p in (ROOT / "inspector" / "_internal").glob("*/__init__.py")
    )
    assert sorted(rooms) == on_disk


def test_every_room_stands_above_everything_it_imports() -> None:
    """No import climbs the floors of docs/architecture.md, or crosses to a neighbour on the
    same floor: each room can be read knowing only the floors below it."""
    floors = _floors((ROOT / "docs" / "architecture.md").read_text())
    core = {m: p for m, p in _module_files().items() if m.startswith(INTERNAL)}
    assert _climbing(core, floors) == []


def test_the_floor_check_sees_a_type_only_import_that_climbs(tmp_path: Path) -> None:
    """The checker itself: an import under `if TYPE_CHECKING:` from a low room into a high
    one climbs, and so does one into a neighbour on the same floor; a downward one does not."""
    for room, source in {
        "low": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from inspector._internal.high.b import B\n",
        "high": "from inspector._internal.low.a import A\n",
        "side": "def f():\n    import inspector._internal.high.b\n",
    }.items():
        folder = tmp_path / "inspector" / "_internal" / room
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text("")
        (folder / ("a.py" if room == "low" else "b.py")).write_text(source)
    files = {
        ".".join(p.relative_to(tmp_path).with_suffix("").parts).removesuffix(".__init__"): p
        for p in sorted(tmp_path.rglob("*.py"))
    }
    text = (
        "\n## Floors\n\n```\nhigh/  side/   top\n               more\nlow/           bottom\n```\n"
    )
    assert _floors(text) == [["low"], ["high", "side"]]
    assert sorted(_climbing(files, _floors(text))) == [
        "inspector._internal.low.a:3: low -> high",
        "inspector._internal.side.b:2: side -> high",
    ]


# The one place each pickle mechanism lives (issue 32, step 3): the opcode walker, the
# restricted unpickler, and torch's own loader for the common state.
_PICKLE_HOMES = {
    "pickletools": "inspector/_internal/formats/pickles/audit.py",
    "Unpickler": "inspector/_internal/formats/pickles/unpickler.py",
    "find_class": "inspector/_internal/formats/pickles/unpickler.py",
    "torch.load": "inspector/_internal/formats/pickles/common_state.py",
}


def _pickle_mechanisms(path: Path) -> set[str]:
    """Which of `_PICKLE_HOMES` a file uses: imports pickletools, subclasses or calls an
    Unpickler, defines find_class, or calls torch.load (`pickle.load` and `loads` too).
    Found in the walk `_source` makes of the file (one parse for every test here)."""
    return set(_source(path).pickles)


# The kinds of node `_pickle_mechanism` finds a mechanism in.
_PICKLE_NODES = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.Attribute)


def _pickle_mechanism(node: ast.AST) -> set[str]:
    """The pickle mechanism one node of a file's tree uses (`_pickle_mechanisms`)."""
    if isinstance(node, ast.Import | ast.ImportFrom):
        names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
        return {"pickletools"} & {n.split(".")[0] for n in names}
    if isinstance(node, ast.FunctionDef) and node.name == "find_class":
        return {"find_class"}
    if isinstance(node, ast.Attribute):
        owner = node.value.id if isinstance(node.value, ast.Name) else ""
        if node.attr == "Unpickler":
            return {"Unpickler"}
        if node.attr in ("load", "loads") and owner in ("pickle", "_pickle", "dill"):
            return {f"pickle.{node.attr}"}
        if node.attr == "load" and owner == "torch":
            return {"torch.load"}
    return set()


def test_every_pickle_reader_uses_the_one_walker_and_the_one_unpickler() -> None:
    """No module walks opcodes, unpickles or calls torch.load outside its one home in
    `formats/pickles/`, and nothing calls `pickle.load(s)`: a new reader is a use of them."""
    offenders = []
    for root in ("inspector", "widgets"):
        for path in sorted((ROOT / root).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for used in sorted(_pickle_mechanisms(path)):
                if _PICKLE_HOMES.get(used) != rel:
                    offenders.append(f"{rel}: {used}")
    assert offenders == []


def test_the_pickle_check_sees_each_mechanism(tmp_path: Path) -> None:
    source = tmp_path / "reader.py"
    source.write_text(
        "import pickle, pickletools, torch\n"
        "class U(pickle.Unpickler):\n"
        "    def find_class(self, m, n): ...\n"
        "pickle.loads(b''); torch.load(None)\n"
    )
    assert _pickle_mechanisms(source) == {*_PICKLE_HOMES, "pickle.loads"}


def test_no_module_imports_another_modules_private_name() -> None:
    _, private = _import_graph(_module_files())
    assert private == []


def test_the_import_graph_sees_cycles_and_private_names(tmp_path: Path) -> None:
    """The checker itself: a cycle closed by an import inside a function is a cycle, one
    under `if TYPE_CHECKING:` is not, and a private name taken from another module shows."""
    (tmp_path / "a.py").write_text("def f():\n    from inspector.b import g\n")
    (tmp_path / "b.py").write_text("from inspector.c import _h\n")
    (tmp_path / "c.py").write_text("import inspector.a\n_h = 1\n")
    (tmp_path / "d.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import inspector.e\n"
    )
    (tmp_path / "e.py").write_text("import inspector.d\n")
    files = {f"inspector.{p.stem}": p for p in sorted(tmp_path.glob("*.py"))}
    graph, private = _import_graph(files)
    assert _cycles(graph) == [["inspector.a", "inspector.b", "inspector.c"]]
    assert private == ["inspector.b: from inspector.c import _h"]


def test_well_known_file_names_come_from_the_one_table() -> None:
    """No string literal in the core or the UI spells a well-known file name (or the DCP
    `.hf_metadata` folder) except `inspector/_internal/common/filenames.py`, the one table
    of them: prose in messages and docstrings may name them, code takes the constant."""
    from inspector._internal.common.filenames import HF_METADATA_DIR, WELL_KNOWN

    names = set(WELL_KNOWN) | {HF_METADATA_DIR}
    table = ROOT / "inspector" / "_internal" / "common" / "filenames.py"
    offenders = []
    for path in sorted([*(ROOT / "inspector").rglob("*.py"), *(ROOT / "widgets").rglob("*.py")]):
        if path == table:
            continue
        for value, line in _source(path).strings:
            if value in names or value.split("/")[0] == HF_METADATA_DIR:
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {value!r}")
    assert offenders == []


def test_docs_architecture_lists_every_module_and_no_other() -> None:
    """docs/architecture.md's module list is the tree: a module added, moved or removed
    without its line there fails here."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## Modules", 1)[1].split("```")[1]
    listed = {line.split()[0] for line in block.splitlines() if line.strip()}
    on_disk = {
        p.relative_to(ROOT).as_posix()
        for root in ("inspector", "widgets")
        for p in (ROOT / root).rglob("*.py")
    }
    assert sorted(listed - on_disk) == [] and sorted(on_disk - listed) == []


def test_the_public_surface_is_the_documented_one() -> None:
    """Outside `inspector/_internal/` the package holds only the documented public modules;
    `inspector/__init__.py` exports exactly what docs/architecture.md names."""
    public = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "inspector").glob("*.py"))
    assert public == [
        "inspector/__init__.py",
        "inspector/__main__.py",
        "inspector/errors.py",
        "inspector/ui.py",
    ]
    assert sorted(p.name for p in (ROOT / "inspector").iterdir() if p.is_dir()) in (
        ["_internal"],
        ["__pycache__", "_internal"],
    )
    surface = (ROOT / "docs" / "architecture.md").read_text().split("## The public surface")[1]
    surface = surface.split("\n## ")[0]
    for name in inspector.__all__:
        if name not in ("CannotInspectError", "InspectorError", "PlanRefusedError"):
            assert f"`{name}`" in surface, name


def test_every_code_carries_its_fix_and_the_issues_and_read_findings_use_it(
    demo_scans: list,
) -> None:
    """The fix of a finding lives in one place, `Code.fix`: every code has one; an issue no
    grouping rule explains takes its kind and text from it; a file a reader could not read
    is reported with its code's fix as the message's tail."""
    from typing import get_args

    from inspector._internal.checkpoint.read_problems import (
        FileRole,
        ReadProblem,
        read_problem_findings,
    )
    from inspector._internal.diagnosis.issues import group_problems
    from inspector._internal.findings.codes import FixKind
    from inspector._internal.findings.finding import make_finding

    for code in Code:
        assert code.fix.kind in get_args(FixKind) and code.fix.text.strip(), code
    (finding,) = read_problem_findings([ReadProblem(CONFIG_NAME, FileRole.CONFIG, "is empty")])
    assert finding.code == "config-unreadable"
    assert finding.message.endswith(f"; {Code.CONFIG_UNREADABLE.fix.text}")
    zero = make_finding(Code.TENSOR_ALL_ZERO, "model.layers.0.w is all zeros", file="a.safetensors")
    scanned = next(s for s in demo_scans if s.layout == "hf-sharded")
    (issue,) = group_problems(scanned, [zero])
    assert (issue.action.kind, issue.action.text) == (
        Code.TENSOR_ALL_ZERO.fix.kind,
        Code.TENSOR_ALL_ZERO.fix.text,
    )


def test_the_cli_is_one_module_per_command() -> None:
    """Each command of `ckpt-inspect` is a row of `COMMANDS` and a module of
    `inspector/_internal/cli/` with `add_arguments` and `run`, and the parser offers exactly
    those (and the plugins'), each with the table's help line."""
    import importlib

    from inspector._internal.cli.main import COMMANDS, _parser

    cli = ROOT / "inspector" / "_internal" / "cli"
    modules = {p.stem for p in cli.glob("*.py")} - {"__init__", "main", "args"}
    assert {c.module_name.rsplit(".", 1)[1] for c in COMMANDS} == modules
    for command in COMMANDS:
        module = importlib.import_module(command.module_name)
        assert callable(module.add_arguments) and callable(module.run), module.__name__
    (sub,) = [a for a in _parser()._actions if a.dest == "command"]
    assert set(sub.choices) - {"report"} == modules
    shown = {a.dest: a.help for a in sub._choices_actions}
    assert {c.name: c.help for c in COMMANDS} == {n: shown[n] for n in modules}
