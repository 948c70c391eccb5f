"""compressed-tensors checkpoints llm-compressor wrote (golden fixtures), damaged the ways
exports go wrong beyond the golden cases: scales of the wrong shape, `re:` ignore patterns,
a scale on a module no group targets."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from inspector._internal.checkpoint.scan import scan
from inspector._internal.checks import check

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "writers" / "llmcompressor"


def _copy(case: str, tmp_path: Path) -> Path:
    folder = tmp_path / case
    shutil.copytree(GOLDEN / case, folder)
    return folder


def _edit_tensors(folder: Path, edit) -> None:  # type: ignore[no-untyped-def]
    path = folder / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def _codes(folder: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in check(scan(folder), model=False):
        out.setdefault(f.code, []).append(f.message)
    return out


def test_healthy_outputs_are_clean() -> None:
    for case in ("w4a16", "nvfp4", "fp8-dynamic", "mixed-precision", "model-free-fp8-block"):
        assert _codes(GOLDEN / case) == {}, case


def test_group_scale_of_the_wrong_width(tmp_path: Path) -> None:
    folder = _copy("w4a16", tmp_path)
    name = "model.layers.0.self_attn.q_proj.weight_scale"

    def edit(t: dict[str, torch.Tensor]) -> None:
        t[name] = torch.cat([t[name], t[name]], dim=1)  # two groups of 128 for in = 128

    _edit_tensors(folder, edit)
    messages = _codes(folder)["quant-scheme-mismatch"]
    assert len(messages) == 1 and "q_proj" in messages[0] and "ceil(in / 128)" in messages[0]


def test_nvfp4_global_scale_missing(tmp_path: Path) -> None:
    folder = _copy("nvfp4", tmp_path)
    _edit_tensors(folder, lambda t: t.pop("model.layers.1.self_attn.o_proj.weight_global_scale"))
    messages = _codes(folder)["quant-scheme-mismatch"]
    assert len(messages) == 1 and "weight_global_scale" in messages[0]


def test_regex_ignore_is_honoured(tmp_path: Path) -> None:
    """An `re:` ignore entry that matches quantized attention modules: they are reported as
    quantized against the config, and nothing else."""
    folder = _copy("fp8-dynamic", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["ignore"].append(r"re:.*layers\.1\.self_attn\.(q|k)_proj$")
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "recipe.yaml").unlink()
    found = _codes(folder)
    assert set(found) == {"quant-config-missing-layer"}
    assert len(found["quant-config-missing-layer"]) == 2
    assert all("layers.1.self_attn" in m for m in found["quant-config-missing-layer"])


def test_recipe_patterns_are_resolved_not_compared_literally() -> None:
    """oneshot's config.json lists names where its recipe keeps `re:` patterns: no finding."""
    folder = GOLDEN / "mixed-precision"
    assert "re:" in (folder / "recipe.yaml").read_text()
    config = json.loads((folder / "config.json").read_text())
    assert not any(e.startswith("re:") for e in config["quantization_config"]["ignore"])
    assert "quant-recipe-mismatch" not in _codes(folder)
