"""Golden checkpoints written by the REAL libraries (issue 8), checked finding code by finding
code, and DCP outputs consolidated bit-exactly.

The fixtures under `tests/fixtures/writers/<writer>/<case>/` were written by
`tests/writers/write_*.py` in a separate virtual environment (`make fixtures`); what each case
is, which library version wrote it and the command that regenerates it are in
`tests/fixtures/writers/MANIFEST.json`, together with the sha256 of every tensor of each DCP
writer's own full state dict. Nothing here imports a writer: `make test` needs none installed.

The expectations below describe what the real writers put on disk; they run with every
`make test` (marked `golden`, so `pytest -m golden` runs them alone).
`test_manifest_and_budget` keeps the fixtures and manifest consistent and within the size
budget (each case well under 1 MB, all under 30 MB).

Expectations: for every case the EXACT set of error and warning codes that `check(scan(path))`
must report (healthy: none at all) and, for the first writers' cases, the layout `scan` must
detect. Info findings are not part of the contract here. The cases of the formats added later
(PyTorch .bin, compressed-tensors, MXFP4, block FP8, GGUF) state their expected codes in the
manifest itself; those that need a reader or a check not built yet are strict expected
failures, with the reason (`tests/golden_manifest.py`).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from golden_manifest import FIXTURES, MANIFEST, params

from inspector import check, scan
from inspector._internal.findings.finding import Severity
from inspector.errors import InspectorError

golden = pytest.mark.golden


# case (writer/case) -> (layout scan must detect, exact set of error + warning codes)
EXPECTED: dict[str, tuple[str, frozenset[str]]] = {
    # megatron-core 0.16.1 dist_checkpointing.save, 2 gloo ranks (TP 2, EP 2)
    "megatron/healthy": ("torch-dist", frozenset()),
    "megatron/healthy-rerun-active": ("torch-dist", frozenset()),
    "megatron/megatron-4448-cached-plan": ("torch-dist", frozenset({"torch-dist-common-drift"})),
    "megatron/missing-distcp": ("torch-dist", frozenset({"torch-dist-missing-file"})),
    "megatron/megatron-3624-mtp-extra-state": ("torch-dist", frozenset({"layer-keyset-outlier"})),
    "megatron/torch-dist-object-incomplete": (
        "torch-dist",
        frozenset({"torch-dist-object-incomplete"}),
    ),
    # nvidia-modelopt 0.47
    "modelopt/hf-fp8": ("hf-sharded", frozenset()),
    "modelopt/hf-nvfp4": ("hf-sharded", frozenset()),
    "modelopt/mcore-ep1": ("modelopt-per-layer", frozenset()),
    # Experts 2-3 of every layer are lost (the real 0.47 bug at EP > 1); transformers then
    # stacks 2 experts where Qwen3MoeForCausalLM expects 4 and from_pretrained raises on the
    # size mismatch: the load check (issue 12) reports that consequence too.
    "modelopt/mcore-ep2": (
        "modelopt-per-layer",
        frozenset({"expert-missing", "load-shape-mismatch"}),
    ),
    "modelopt/modelopt-1631-ep2-truncated-config": (
        "modelopt-per-layer",
        frozenset({"expert-missing", "config-unreadable"}),
    ),
    "modelopt/modelopt-1422-sidecar-drift": (
        "modelopt-per-layer",
        frozenset(
            {
                # the MTP tensors are in the last shard, not in its sidecar ...
                "sidecar-unlisted-tensor",
                # ... nor in the index merged from the sidecars
                "unindexed-tensor",
                # the sidecar's total_size and the index's are short by exactly their bytes
                "sidecar-total-size-mismatch",
                "total-size-mismatch",
            }
        ),
    ),
    # NeMo AutoModel 0.7 Checkpointer.save_model, 2 gloo ranks (checkpoint in <case>/model)
    "automodel/healthy": ("dcp-sharded", frozenset()),
    "automodel/automodel-2289-collapsed-mapping": ("dcp-sharded", frozenset({"mapping-collapsed"})),
    "automodel/last-rank-lost": ("dcp-sharded", frozenset({"dcp-coverage-gap"})),
    # PyTorch HuggingFaceStorageWriter(save_distributed=True), 2 gloo ranks
    "torch-dcp/healthy": ("dcp-sharded", frozenset()),
    "torch-dcp/last-rank-lost": ("dcp-sharded", frozenset({"dcp-coverage-gap"})),
    # the tests' 2-rank checkpoints (tests/dcp_writers.py): HuggingFaceStorageWriter with
    # AutoModel's .hf_metadata/, and dcp.save of a Megatron-style torch_dist run
    "torch-dcp/test-model": ("dcp-sharded", frozenset()),
    "torch-dcp/megatron-style-2rank": ("torch-dist", frozenset()),
    # transformers 5 save_pretrained, every MoE family we name
    **{
        f"transformers/{family}": ("hf-sharded", frozenset())
        for family in (
            "qwen2-moe",
            "qwen3-moe",
            "qwen3-next",
            "qwen3.5-moe",
            "deepseek-v2",
            "deepseek-v3",
            "glm4-moe",
            "mixtral",
            "nemotron-h",
            "gpt-oss",
            "llama4",
        )
    },
}

# DCP outputs whose consolidation must equal the writer's own tensors bit for bit.
CONSOLIDATABLE = [
    "torch-dcp/healthy",
    "torch-dcp/test-model",
    "automodel/healthy",
    "automodel/automodel-2289-collapsed-mapping",
]
# DCP outputs that lost a rank: consolidation must refuse rather than write a smaller model.
INCOMPLETE = ["torch-dcp/last-rank-lost", "automodel/last-rank-lost"]


def checkpoint_path(case: str) -> Path:
    """The folder to scan: NeMo cases keep the checkpoint in `model/` beside `upstream/`."""
    return FIXTURES / case / MANIFEST[case].get("checkpoint", ".")


def tensor_sha256(tensor: Any) -> str:
    """Same definition as the manifest's: sha256 of the raw little-endian row-major bytes."""
    import torch

    t = tensor.detach().contiguous().cpu()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    raw = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()


def folder_hashes(folder: Path) -> dict[str, dict[str, Any]]:
    from safetensors.torch import load_file

    out: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.safetensors")):
        for name, t in load_file(str(path)).items():
            out[name] = {
                "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape),
                "sha256": tensor_sha256(t),
            }
    return dict(sorted(out.items()))


# Cases of the formats added after the first writers: their expectations are in the manifest.
LATER = sorted(case for case, entry in MANIFEST.items() if "format" in entry)
# `command` runs the writer's script with the interpreter of the environment it needs.
COMMAND = re.compile(r"build/writers-venv(-tf4|-llmc)?/bin/python tests/writers/write_\w+\.py")


def test_manifest_and_budget() -> None:
    """Every case on disk has a manifest entry and an expectation, and the reverse; each case
    is under 1 MB, the later formats' cases under 5 MB together and all of them under 30 MB."""
    on_disk = {
        f"{w.name}/{c.name}"
        for w in FIXTURES.iterdir()
        if w.is_dir()
        for c in w.iterdir()
        if c.is_dir() and not c.name.startswith(".")
    }
    assert on_disk == set(MANIFEST) == set(EXPECTED) | set(LATER)
    assert not set(EXPECTED) & set(LATER)
    total = later = 0
    for case, entry in MANIFEST.items():
        size = sum(p.stat().st_size for p in (FIXTURES / case).rglob("*") if p.is_file())
        assert size == entry["bytes"] and size < 1_000_000, case
        assert COMMAND.fullmatch(entry["command"]), case
        codes = EXPECTED[case][1] if case in EXPECTED else entry["expected_codes"]
        assert entry["healthy"] == (not codes), case
        total += size
        later += size if case in LATER else 0
    assert total < 30_000_000
    assert later < 5_000_000


def expected_of(case: str) -> tuple[str | None, frozenset[str]]:
    """(layout scan must detect or None when not stated, exact error + warning codes)."""
    if case in EXPECTED:
        return EXPECTED[case]
    return None, frozenset(MANIFEST[case]["expected_codes"])


@pytest.mark.parametrize("case", params(sorted(MANIFEST)))
@golden
def test_golden_codes(case: str) -> None:
    layout, expected = expected_of(case)
    scanned = scan(checkpoint_path(case))
    findings = check(scanned)
    codes = {f.code for f in findings if f.severity in (Severity.ERROR, Severity.WARNING)}
    got = (scanned.layout if layout else None, codes)
    assert got == (layout, expected), [(f.code, f.message) for f in findings]
    assert len(scanned.tensors) > 0


@pytest.mark.parametrize("case", CONSOLIDATABLE)
@golden
def test_golden_consolidation_bit_exact(case: str, tmp_path: Path) -> None:
    """Our consolidation equals the writer's own full state dict, and every consolidator of
    the writer's ecosystem that ran when the fixture was written (NeMo's, PyTorch's)."""
    from inspector._internal.plans.consolidate import consolidate

    entry = MANIFEST[case]
    reference = FIXTURES / case / entry["reference"] if "reference" in entry else None
    consolidate(checkpoint_path(case), tmp_path / "out", reference=reference, progress=False)
    ours = folder_hashes(tmp_path / "out")
    assert ours == entry["writer_state"]
    for other in ("nemo_consolidated", "torch_consolidated"):
        if (entry.get(other) or {}).get("ran"):
            assert ours == entry[other]["tensors"], other


@golden
def test_golden_torch_consolidator_live(tmp_path: Path) -> None:
    """PyTorch's own consolidator, run here on the real NeMo output (torch is installed in
    CI), agrees with the writer's state dict: the independent check the manifest records."""
    from torch.distributed.checkpoint._consolidate_hf_safetensors import (
        consolidate_safetensors_files,
    )

    case = "automodel/healthy"
    src = checkpoint_path(case)
    mapping = json.loads((src / ".hf_metadata" / "fqn_to_file_index_mapping.json").read_text())
    (tmp_path / "out").mkdir()
    consolidate_safetensors_files(str(src), str(tmp_path / "out"), mapping)
    assert folder_hashes(tmp_path / "out") == MANIFEST[case]["writer_state"]


@pytest.mark.parametrize("case", INCOMPLETE)
@golden
def test_golden_consolidation_refuses_lost_rank(case: str, tmp_path: Path) -> None:
    """A DCP output whose last rank's files are all gone must not consolidate into a
    smaller model."""
    from inspector._internal.plans.consolidate import consolidate

    with pytest.raises(InspectorError):
        consolidate(checkpoint_path(case), tmp_path / "out", progress=False)
