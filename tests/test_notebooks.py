"""Execute every notebook in notebooks/ top to bottom with nbclient; any error fails.

The notebooks assert what they show (findings present, repair leaves no finding, consolidated
output verified), so a notebook that runs is a notebook whose story still holds. They read the
demo checkpoints from CKPT_DEMO_DIR (written once per session here) and write their copies
under CKPT_WORK_DIR.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
ALL = sorted(NOTEBOOKS.glob("*.ipynb"))
KERNEL = "python3"


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from inspector.demo import write_demos

    target = tmp_path_factory.mktemp("demo")
    write_demos(target, log=lambda _line: None)
    return target


@pytest.fixture(scope="session")
def kernel_env(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of the notebook kernels; the python3 kernelspec must be this venv's."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(KERNEL)
    python = Path(spec.argv[0])
    # jupyter_client runs a bare "python" with sys.executable; an absolute path to another
    # interpreter would run the notebooks without this project installed.
    if python.is_absolute() and python.resolve() != Path(sys.executable).resolve():
        pytest.fail(
            f"kernelspec {KERNEL!r} runs {python}, not {sys.executable}; install this venv's: "
            f"{sys.executable} -m ipykernel install --sys-prefix"
        )
    work = tmp_path_factory.mktemp("notebook-work")
    return {"CKPT_DEMO_DIR": str(demo_dir), "CKPT_WORK_DIR": str(work)}


def test_every_notebook_is_stored_without_outputs():
    assert [p.name for p in ALL] == [
        "01-explore-a-checkpoint.ipynb",
        "02-repair-an-index-that-forgot-mtp.ipynb",
        "03-find-lost-experts.ipynb",
        "04-rerun-a-collapsed-consolidation.ipynb",
        "05-torch-dist-common-state-drift.ipynb",
    ]
    for path in ALL:
        book = json.loads(path.read_text())
        for cell in book["cells"]:
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None, path.name


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_notebook_runs_top_to_bottom(path: Path, kernel_env: dict[str, str], monkeypatch):
    for key, value in kernel_env.items():
        monkeypatch.setenv(key, value)
    book = nbformat.read(path, as_version=4)
    client = NotebookClient(
        book,
        kernel_name=KERNEL,
        timeout=120,
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    client.execute()  # raises CellExecutionError, naming the cell, on the first error
    outputs = [o for cell in book.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    # The dashboard cell produced a widget view, not a text repr.
    if "Dashboard" in "".join(cell.source for cell in book.cells):
        views = [
            o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
        ]
        assert views, f"{path.name}: no widget was displayed"
    # The working copies are where the env var says (the demo folder itself stays untouched).
    assert not (Path(kernel_env["CKPT_DEMO_DIR"]) / ".ckpt-inspect-backup").exists()
