"""`make lab` and the README's set-up, as a new user meets them: JupyterLab is rooted outside
the clone (exports and reports never land in the repository), and the README says how to
reach `ckpt-inspect` after `make demo` and how to install just the tool."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_make_lab_roots_jupyterlab_outside_the_repository(tmp_path: Path):
    lab = tmp_path / "lab"
    dry = _make("-n", "lab", f"LAB_DIR={lab}")
    assert dry.returncode == 0, dry.stderr
    (root,) = re.findall(r"--ServerApp\.root_dir=\"?([^\"\s]+)", dry.stdout)
    assert Path(root) == lab and not Path(root).is_relative_to(REPO)
    # The default is outside the clone too.
    default = _make("-n", "lab")
    (root,) = re.findall(r"--ServerApp\.root_dir=\"?([^\"\s]+)", default.stdout)
    assert not Path(root).resolve().is_relative_to(REPO)


def test_lab_notebooks_are_copied_once_and_edits_kept(tmp_path: Path):
    lab = tmp_path / "lab"
    done = _make("lab-notebooks", f"LAB_DIR={lab}")
    assert done.returncode == 0, done.stderr
    shipped = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
    assert shipped and sorted(p.name for p in lab.glob("*.ipynb")) == shipped
    edited = lab / shipped[0]
    edited.write_text("{}")  # a person's edit survives the next `make lab`
    assert _make("lab-notebooks", f"LAB_DIR={lab}").returncode == 0
    assert edited.read_text() == "{}"


def test_lab_refuses_a_folder_inside_the_repository():
    refused = _make("lab-notebooks", "LAB_DIR=build/lab-inside")
    assert refused.returncode != 0 and "inside the repository" in refused.stdout
    assert not (REPO / "build" / "lab-inside").exists()


def test_readme_says_how_to_reach_the_cli_and_how_to_install_only_the_tool():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "source .venv/bin/activate" in readme and ".venv/bin/ckpt-inspect" in readme
    assert 'pip install "checkpoint-inspector[ui]"' in readme
    # `make lab` is documented on the notebooks page the README links.
    assert "docs/notebooks.md" in readme
    assert "LAB_DIR" in (REPO / "docs" / "notebooks.md").read_text(encoding="utf-8")
