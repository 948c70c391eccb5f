"""One parameter count for one checkpoint: the scan, the reports, the load check and every
index a repair writes count the values (packed 4-bit weights unpacked, quantization scales and
buffers left out: `inspector._internal.checkpoint.parameters`), and say so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inspector._internal.checkpoint.parameters import (
    PARAMETER_RULE,
    count_parameters,
    parameters_of,
    scan_parameters,
)
from inspector._internal.checks import check
from inspector._internal.cli.main import main
from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME
from inspector._internal.demo.safetensors_layouts import modelopt_1422
from inspector._internal.load.verdict import LoadVerdict, ShapeMismatch, load_verdict
from inspector._internal.plans.repair import plan_repair
from inspector._internal.report.markdown import markdown_summary
from inspector._internal.report.summary import summarize
from inspector._internal.scan.entry import scan

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "writers"
INDEX = INDEX_NAME


def test_seed_1422_scan_load_check_and_repair_give_one_number(tmp_path: Path, capsys):
    """Before: scan 29,152 (stored elements, U8 bytes as elements), the load check 28,496
    (the model transformers builds, without its MTP layer) and the repaired index 27,824
    (scales left out, packed bytes counted once)."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    modelopt_1422(folder)
    scanned = scan(folder)
    ours = count_parameters(scanned.tensors, config=scanned.config)
    assert ours != int(scanned.tensors["numel"].sum())  # NVFP4 experts: 2 values a byte
    assert summarize(scanned)["parameters"] == ours
    verdict = load_verdict(scanned)
    assert verdict.stored_parameters == ours
    # The model transformers builds has no MTP layer: the difference is said, not hidden.
    assert verdict.parameters is not None and verdict.mtp_parameters > 0
    assert verdict.parameters + verdict.mtp_parameters == ours
    assert verdict.parameters_text() == (
        f"{verdict.parameters:,} parameters in the model, {ours:,} stored "
        f"({verdict.mtp_parameters:,} in MTP tensors transformers skips)"
    )
    (write,) = [w for w in plan_repair(scanned).writes if w.path == INDEX]
    assert json.loads(write.new)["metadata"]["total_parameters"] == ours
    # The CLI says the number and the rule everywhere it shows one.
    assert main(["scan", str(folder)]) == 0
    out = capsys.readouterr().out
    assert f"parameters  {ours:,}  ({PARAMETER_RULE})" in out
    main(["check", str(folder)])
    out = capsys.readouterr().out
    assert f"{ours:,} stored" in out
    md = markdown_summary(scanned, check(scanned, verdict=verdict), verdict=verdict)
    assert f"parameters: {ours:,} ({PARAMETER_RULE})" in md
    # The repaired index is clean, with the model and without.
    (folder / INDEX).write_text(write.new)
    after = scan(folder)
    codes = {f.code for f in check(after)} | {f.code for f in check(after, model=False)}
    assert "total-parameters-mismatch" not in codes


def test_a_model_larger_than_the_checkpoint_is_a_positive_count_with_its_cause() -> None:
    """The 300,000-tensor checkpoint with experts 17-19 of layer 40 lost read "-132,120,576
    in tensors the checkpoint lacks": no key was missing, the two stacked expert tensors of
    layer 40 were stored shorter. The difference is a count, and the verdict names where."""
    verdict = LoadVerdict(
        architecture="DeepseekV3ForCausalLM",
        mismatched=(
            ShapeMismatch("model.layers.40.mlp.experts.gate_up_proj", (509, 8, 4), (512, 8, 4)),
            ShapeMismatch("model.layers.40.mlp.experts.down_proj", (509, 4, 4), (512, 4, 4)),
        ),
        parameters=1_051_640_683_520,
        stored_parameters=1_074_394_755_072,
        mtp_parameters=22_886_192_128,
    )
    text = verdict.parameters_text()
    assert "-" not in text.replace("tensors transformers", "")
    assert text.endswith(
        "(22,886,192,128 in MTP tensors transformers skips; 132,120,576 fewer than the model "
        "holds (2 tensors stored with another shape))"
    )
    assert "lacks" not in text


@pytest.mark.parametrize(
    "case",
    sorted(
        p.relative_to(GOLDEN).as_posix()
        for p in GOLDEN.glob("*/*")
        if (p / CONFIG_NAME).is_file() and (p / INDEX).is_file()
    ),
)
def test_the_count_is_the_models_own_on_every_real_writer(case: str):
    """Where the load check builds the model, our count of a complete checkpoint is the
    model's `num_parameters()` plus the MTP tensors transformers skips: NVFP4 U8 unpacked,
    FP8 and NVFP4 scales and router buffers left out."""
    scanned = scan(GOLDEN / case)
    verdict = load_verdict(scanned)
    if verdict.parameters is None or not verdict.loads or verdict.unexpected:
        pytest.skip(f"no complete model to compare with: {verdict.summary()}")
    ours = count_parameters(scanned.tensors, config=scanned.config)
    assert ours == verdict.parameters + verdict.mtp_parameters


@pytest.mark.parametrize(
    "case",
    sorted(
        c
        for c, e in json.loads((GOLDEN / "MANIFEST.json").read_text()).items()
        if "parameters" in e
        and e.get("format") in ("pytorch-bin", "compressed-tensors", "mxfp4", "fp8-block", "gguf")
        and not e.get("not_intact")
        and not e.get("lost")
    ),
)
def test_the_count_is_the_source_models_on_every_later_format(case: str):
    """The manifest's `parameters` is the source model's `num_parameters()` before it was
    quantized or converted: .bin tied weights once, compressed-tensors packed weights at each
    group's own bit width (mixed precision), MXFP4 blocks two values a byte, block-FP8 scales
    (fused per expert too) left out, GGUF prod(ne) whatever the ggml type."""
    entry = json.loads((GOLDEN / "MANIFEST.json").read_text())[case]
    # GGUF: the values of the files present (a replaced split part may hold fewer).
    expected = entry.get("elements_in_intact_files", entry["parameters"])
    assert scan_parameters(scan(GOLDEN / case)) == expected


def test_packed_nvfp4_counts_two_values_a_byte_and_no_scales():
    scanned = scan(GOLDEN / "modelopt" / "hf-nvfp4")
    t = scanned.tensors
    assert set(t["dtype"].astype(str)) >= {"U8", "F8_E4M3"}
    assert count_parameters(t, config=scanned.config) == 29_024 > int(t["numel"].sum())


def test_rules_for_each_packing():
    # Model-Optimizer NVFP4: a U8 weight beside weight_scale_2.
    nvfp4 = ["m.weight", "m.weight_scale", "m.weight_scale_2", "m.input_scale"]
    assert parameters_of(nvfp4, ["U8", "F8_E4M3", "F32", "F32"], [(4, 8), (4, 1), (), ()]) == 64
    # A U8 tensor without evidence of packing is what it stores.
    assert parameters_of(["m.weight"], ["U8"], [(4, 8)]) == 32
    # compressed-tensors: I32 weight_packed holds 32 / num_bits values.
    config = {
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "config_groups": {"g": {"weights": {"num_bits": 4}}},
        }
    }
    packed = ["m.weight_packed", "m.weight_scale", "m.weight_shape"]
    assert (
        parameters_of(packed, ["I32", "BF16", "I64"], [(4, 2), (4, 1), (2,)], config=config) == 64
    )
    assert parameters_of(packed, ["I32", "BF16", "I64"], [(4, 2), (4, 1), (2,)]) == 8
    # MXFP4 (gpt-oss): *_blocks two values a byte, *_scales not parameters.
    mx = ["e.gate_up_proj_blocks", "e.gate_up_proj_scales", "e.gate_up_proj_bias"]
    assert parameters_of(mx, ["U8", "U8", "BF16"], [(2, 4, 1, 16), (2, 4, 1), (2, 4)]) == 264
    # Buffers are not parameters; a name stored twice counts once.
    assert parameters_of(["g.e_score_correction_bias", "x", "x"], ["F32"] * 3, [(8,)] * 3) == 8
