"""`diff A B --reference`: each difference of a checkpoint derived from A (a quantized export, a
conversion) classified as expected or unexpected, on real save_pretrained output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_exports import modelopt_export, resaved, tiny_deepseek_v3

from inspector._internal.checks.diff import diff_checkpoints
from inspector._internal.cli.main import main
from inspector._internal.scan.entry import scan

transformers = pytest.importorskip("transformers")

LAYERS = 3


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny DeepSeek-V3 as save_pretrained writes it, plus the MTP layer DeepSeek ships."""
    return tiny_deepseek_v3(tmp_path_factory.mktemp("orig") / "ckpt", layers=LAYERS)


def _drop(*names: str):
    return lambda s: {k: v for k, v in s.items() if k not in names and not k.startswith(names)}


def kinds(result) -> dict[str, bool]:
    return {c.kind: c.expected for c in result.reference}


def test_quantized_export_differs_only_as_expected(original: Path, tmp_path: Path) -> None:
    export = modelopt_export(original, tmp_path / "nvfp4", "NVFP4", experts_only=True)
    result = diff_checkpoints(scan(original), scan(export), reference=True)
    assert not result.identical and result.unexpected == ()
    assert kinds(result) == {"quantization-scales-added": True, "quantized": True}
    quantized = next(c for c in result.reference if c.kind == "quantized")
    assert "model.layers.1.mlp.experts.0.up_proj.weight" in quantized.names
    # The MTP layer's experts are quantized too, and said to be MTP.
    assert "layers 1-2: experts 0-3" in quantized.detail
    assert "MTP layer 3: experts 0-3" in quantized.detail


def test_mtp_added_and_experts_fused_are_expected(original: Path, tmp_path: Path) -> None:
    # A: transformers' own output without MTP; B: the experts fused (as transformers 5 holds
    # them in memory) and DeepSeek's MTP layer kept.
    plain = resaved(original, tmp_path / "plain", _drop(f"model.layers.{LAYERS}."))

    def fuse(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {k: v for k, v in state.items() if ".mlp.experts." not in k}
        for layer in range(1, LAYERS + 1):
            p = f"model.layers.{layer}.mlp.experts"
            for proj in ("gate_proj", "up_proj", "down_proj"):
                out[f"{p}.{proj}"] = torch.stack(
                    [state[f"{p}.{e}.{proj}.weight"] for e in range(4)]
                )
        return out

    fused = resaved(original, tmp_path / "fused", fuse)
    result = diff_checkpoints(scan(plain), scan(fused), reference=True)
    assert kinds(result) == {"experts-fused": True, "mtp-added": True}
    back = diff_checkpoints(scan(fused), scan(original), reference=True)
    assert kinds(back) == {"experts-unfused": True}


@pytest.mark.parametrize(
    ("edit", "kind"),
    [
        (_drop(f"model.layers.{LAYERS}."), "mtp-lost"),
        (_drop("lm_head.weight"), "lm-head-lost"),
        (_drop("model.layers.2.mlp.experts.3."), "experts-lost"),
        (_drop("model.layers.2."), "layers-lost"),
        (lambda s: {**s, "model.embed_tokens.weight": torch.zeros(72, 32)}, "shape-changed"),
    ],
)
def test_losses_and_shape_changes_are_unexpected(
    original: Path, tmp_path: Path, edit, kind: str
) -> None:
    damaged = resaved(original, tmp_path / "b", edit)
    result = diff_checkpoints(scan(original), scan(damaged), reference=True)
    assert kinds(result) == {kind: False}


def test_cli_exit_code_follows_the_unexpected_differences(
    original: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export = modelopt_export(original, tmp_path / "fp8", "FP8")
    assert main(["diff", str(original), str(export), "--reference"]) == 0
    out = capsys.readouterr().out
    assert "expected   dtype changed by quantization" in out
    assert "every difference is expected" in out
    assert main(["diff", str(original), str(export)]) == 1  # without --reference: not identical
    capsys.readouterr()
    broken = modelopt_export(original, tmp_path / "broken", "FP8", edit=_drop("lm_head.weight"))
    assert main(["diff", str(original), str(broken), "--reference", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["unexpected"] == 1
    (lost,) = [c for c in doc["reference"] if not c["expected"]]
    assert lost["kind"] == "lm-head-lost" and lost["names"] == ["lm_head.weight"]


def test_lost_experts_of_a_quantized_export_are_one_loss_by_layer_and_expert(
    original: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Experts 1-2 of layer 2 lost from an NVFP4 export: `diff` listed every name and
    `--reference` split the one loss into "experts lost" (the weights) and "quantization
    scales lost" (their scales). Both say it once, by layer and expert, as `check` does."""
    nvfp4 = modelopt_export(original, tmp_path / "nvfp4", "NVFP4", experts_only=True)
    lost = _drop("model.layers.2.mlp.experts.1.", "model.layers.2.mlp.experts.2.")
    broken = modelopt_export(original, tmp_path / "lost", "NVFP4", experts_only=True, edit=lost)
    gone = sorted(set(scan(nvfp4).tensors["name"]) - set(scan(broken).tensors["name"]))
    assert len(gone) == 2 * 3 * 4  # 2 experts x 3 projections x weight and 3 scales
    result = diff_checkpoints(scan(nvfp4), scan(broken), reference=True)
    assert kinds(result) == {"experts-lost": False}
    (loss,) = result.unexpected
    assert sorted(loss.names) == gone
    assert loss.detail == "experts lost: layer 2: experts 1-2 (24 tensors, 12 per expert)"
    assert main(["diff", str(nvfp4), str(broken)]) == 1
    out = capsys.readouterr().out
    assert "only in A: 24\n  layer 2: experts 1-2 (24 tensors, 12 per expert)\n" in out
    assert not any(name in out for name in gone)
    assert "keys differ" not in out  # whole experts are said once, above
    assert main(["diff", str(nvfp4), str(broken), "--reference"]) == 1
    out = capsys.readouterr().out
    assert "UNEXPECTED experts lost: layer 2: experts 1-2" in out
    assert "quantization scales lost" not in out
