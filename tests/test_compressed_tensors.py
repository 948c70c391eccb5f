"""compressed-tensors checkpoints llm-compressor wrote (golden fixtures), damaged the ways
exports go wrong beyond the golden cases: scales of the wrong shape, `re:` ignore patterns,
a scale on a module no group targets."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from inspector._internal.checks import check
from inspector._internal.common.filenames import CONFIG_NAME
from inspector._internal.load.verdict import load_verdict
from inspector._internal.scan.entry import scan

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
    config = json.loads((folder / CONFIG_NAME).read_text())
    config["quantization_config"]["ignore"].append(r"re:.*layers\.1\.self_attn\.(q|k)_proj$")
    (folder / CONFIG_NAME).write_text(json.dumps(config))
    (folder / "recipe.yaml").unlink()
    found = _codes(folder)
    assert set(found) == {"quant-config-missing-layer"}
    assert len(found["quant-config-missing-layer"]) == 2
    assert all("layers.1.self_attn" in m for m in found["quant-config-missing-layer"])


def test_a_recipe_modifier_without_lists_of_names_is_reported_in_full(tmp_path: Path) -> None:
    """A QuantizationModifier whose targets are not names: the read problem says where it
    sits and what is wrong with it (the second half of the reason was once a statement of
    its own after the `return`, never part of the message)."""
    folder = _copy("fp8-dynamic", tmp_path)
    (folder / "recipe.yaml").write_text(
        "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      targets: 5\n"
    )
    (problem,) = [p for p in scan(folder).read_problems if p.file == "recipe.yaml"]
    assert problem.reason == (
        "has a QuantizationModifier at quant_stage/quant_modifiers whose targets, ignore or "
        "config_groups are not lists of names"
    )


def test_recipe_patterns_are_resolved_not_compared_literally() -> None:
    """oneshot's config.json lists names where its recipe keeps `re:` patterns: no finding."""
    folder = GOLDEN / "mixed-precision"
    assert "re:" in (folder / "recipe.yaml").read_text()
    config = json.loads((folder / CONFIG_NAME).read_text())
    assert not any(e.startswith("re:") for e in config["quantization_config"]["ignore"])
    assert "quant-recipe-mismatch" not in _codes(folder)


# -- hostile patterns (issue 31): a config's regex never backtracks ---------------------------

# Python's re takes time doubling with each letter on `(a+)+$` against this name (over a
# minute for 34 letters); a name past the matcher's cap.
_EXPONENTIAL = "a" * 34 + "!"
_LONG = "model.layers.0." + "a" * 5000


def _hostile(tmp_path: Path, pattern: str) -> Path:
    """llm-compressor's FP8 export with `pattern` added to config.json's and recipe.yaml's
    ignore lists, and two Linear modules the writer saved under hostile names: a plain one
    and a quantized one (an F8 weight with its channel scales)."""
    folder = _copy("fp8-dynamic", tmp_path)
    config = json.loads((folder / CONFIG_NAME).read_text())
    config["quantization_config"]["ignore"].append(f"re:{pattern}")
    (folder / CONFIG_NAME).write_text(json.dumps(config))
    recipe = (folder / "recipe.yaml").read_text()
    (folder / "recipe.yaml").write_text(recipe.replace("ignore: [", f"ignore: ['re:{pattern}', "))

    def edit(t: dict[str, torch.Tensor]) -> None:
        t[f"{_EXPONENTIAL}.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
        t[f"{_LONG}.weight"] = torch.zeros(4, 4).to(torch.float8_e4m3fn)
        t[f"{_LONG}.weight_scale"] = torch.ones(4, 1)

    _edit_tensors(folder, edit)
    return folder


@pytest.mark.timeout(120)  # a hang guard: Python's re would need years for these names
def test_exponential_pattern_is_matched_without_backtracking(tmp_path: Path) -> None:
    """`re:(a+)+$` with a module named `aaa...a!`: the pattern is matched as compressed-
    tensors would (no match, so the plain module is flagged against group_0's Linear
    target), in one pass; the module whose name is past the cap is not judged, and said so:
    the load check, which needs to know whether it is quantized, is skipped."""
    folder = _hostile(tmp_path, "(a+)+$")
    scanned = scan(folder)
    found: dict[str, list[str]] = {}
    for f in check(scanned):
        found.setdefault(f.code, []).append(f.message)
    assert set(found) == {"quant-scheme-mismatch", "quant-pattern-refused"}
    assert any(_EXPONENTIAL in m for m in found["quant-scheme-mismatch"])
    refused = found["quant-pattern-refused"]  # config.json's list and recipe.yaml's
    assert [m.split(":")[0] for m in refused] == ["config.json quantization_config", "recipe.yaml"]
    assert all("names longer than 1,024 characters" in m for m in refused)
    assert all("1 modules they could decide were NOT checked" in m for m in refused)
    verdict = load_verdict(scanned)
    assert verdict.skipped and "quant-pattern-refused" in verdict.skipped


@pytest.mark.timeout(120)
def test_backreference_is_refused_with_a_finding(tmp_path: Path) -> None:
    """A pattern only a backtracking matcher runs (a backreference) is refused, in config.json
    and in recipe.yaml, and the modules it could ignore are not judged."""
    folder = _hostile(tmp_path, r"(a+)+\1$")
    found = [f for f in check(scan(folder), model=False) if f.code == "quant-pattern-refused"]
    assert {f.file for f in found} == {CONFIG_NAME, "recipe.yaml"}
    assert all("backreference" in f.message and "NOT checked" in f.message for f in found)


def test_a_hundred_thousand_empty_groups_end_in_a_finding(tmp_path: Path) -> None:
    """Config groups count as well as their entries: 100,000 groups without targets are not
    each matched against every module (groups x modules calls)."""
    folder = _copy("fp8-dynamic", tmp_path)
    config = json.loads((folder / CONFIG_NAME).read_text())
    groups = config["quantization_config"]["config_groups"]
    groups.update({f"empty_{i}": {"targets": []} for i in range(100_000)})
    (folder / CONFIG_NAME).write_text(json.dumps(config))
    found = _codes(folder)
    assert "check-budget-exceeded" in found and "config groups" in found["check-budget-exceeded"][0]
