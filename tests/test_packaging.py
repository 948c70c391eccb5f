"""The distribution installs one import name, `inspector`, with the notebook UI as
`inspector.widgets`; the package list in pyproject.toml names every package folder."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import distribution, entry_points
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_package_list_names_every_package_folder() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = config["package-dir"]
    listed = set(config["packages"])
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "inspector").rglob("__init__.py")
    }
    on_disk |= {name for name, folder in dirs.items() if (ROOT / folder / "__init__.py").is_file()}
    assert listed == on_disk


def test_one_top_level_import_name() -> None:
    top = (distribution("checkpoint-inspector").read_text("top_level.txt") or "").split()
    # An editable install may not write top_level.txt; then the package list says it.
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    names = set(top) or {p.split(".")[0] for p in config["packages"]}
    assert names == {"inspector"}


def test_ui_is_inspector_widgets_and_plugs_report_into_the_cli() -> None:
    (entry,) = [e for e in entry_points(group="checkpoint_inspector.commands")]
    assert (entry.name, entry.value) == ("report", "inspector.widgets.cli")
    code = (
        "import sys, inspector._internal.cli.main, inspector.widgets\n"
        "assert 'ipywidgets' not in sys.modules and 'plotly' not in sys.modules\n"
        "assert 'widgets' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT / "tests")


def test_core_never_imports_the_ui() -> None:
    ui = re.compile(
        r"^\s*(?:from|import)\s+(?:inspector\.widgets|widgets|ipywidgets|IPython|plotly|jupyter)\b"
        r"|import_module\(\s*[\"'](?:inspector\.)?widgets",
        re.M,
    )
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "inspector").rglob("*.py")
        if ui.search(p.read_text())
    ]
    assert offenders == []
