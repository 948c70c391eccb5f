"""Every issue says its real fix, and following the fixes ends: the repair parts never send
the user round in a circle, `repair` (all parts) leaves nothing it could fix, and lost
tensors are offered back from a reference (`repair --from REF`, naming a candidate when one
is known) instead of "re-run the exporter"."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
from hf_exports import modelopt_export, tiny_deepseek_v3

from inspector._internal.checks import check
from inspector._internal.cli.main import main
from inspector._internal.common.filenames import CONFIG_NAME
from inspector._internal.diagnosis.issues import group_problems
from inspector._internal.plans.repair import plan_repair, scanned_after
from inspector._internal.plans.repair_all import ALL_PARTS, plan_all
from inspector._internal.scan.entry import scan

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "writers"


@pytest.fixture(scope="module")
def demos(tmp_path_factory: pytest.TempPathFactory, copy_demos) -> Path:
    target = tmp_path_factory.mktemp("advice-demos")
    copy_demos(target)
    return target


def _local_cases(demos: Path) -> list[Path]:
    golden = [p for p in GOLDEN.glob("*/*") if p.is_dir() and any(p.glob("*.safetensors"))]
    return sorted(p for p in demos.iterdir() if p.is_dir()) + sorted(golden)


def _fixable(state):
    problems = group_problems(state, check(state, model=False))
    return [p for p in problems if p.action.kind == "repair"]


def test_following_each_repair_advice_never_loops(demos: Path) -> None:
    """Each issue's repair, taken first, then whatever the checks advise next: no step is
    the one just done, none plans nothing, and the advice runs out. (Rebuilding the
    sidecars of seed 1422 alone left 21 sidecar-index-disagree findings advising the
    sidecars again.)"""
    walked = 0
    for case in _local_cases(demos):
        scanned = scan(case)
        for first in _fixable(scanned):
            state, done = scanned, []
            parts = first.action.parts
            for _ in range(len(ALL_PARTS) + 1):
                assert parts not in done, f"{case.name}: {parts} advised again after {done}"
                plan = plan_repair(state, only=set(parts))
                assert plan.writes, f"{case.name}: the advice {parts} plans nothing"
                state, done = scanned_after(plan, state), [*done, parts]
                walked += 1
                left = _fixable(state)
                if not left:
                    break
                parts = left[0].action.parts
            else:
                pytest.fail(f"{case.name}: the repair advice does not end: {done}")
    assert walked >= 3  # seed 1422 alone: index then sidecars, sidecars then index


def test_repair_all_leaves_nothing_that_repair_fixes(demos: Path) -> None:
    for case in _local_cases(demos):
        scanned = scan(case)
        plan = plan_all(scanned)
        if not hasattr(plan, "copy") and plan.writes:
            after = scanned_after(plan, scanned)
            assert _fixable(after) == [], case.name
        elif not plan.writes:
            assert _fixable(scanned) == [], case.name


def test_repair_defaults_to_all_parts_and_shows_what_is_left(
    demos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = Path(shutil.copytree(demos / "modelopt-1422-sidecar-drift", tmp_path / "c"))
    assert main(["check", str(folder)]) == 1
    out = capsys.readouterr().out
    assert f"at once: ckpt-inspect repair {folder}" in out
    assert main(["repair", str(folder), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "rewrite model.safetensors.index.json" in out
    assert "rewrite model-00004-of-00004.safetensors.json" in out
    assert "fixes 44 findings\n  nothing is left to fix" in out
    assert main(["repair", str(folder), "--only", "all", "--yes"]) == 0
    assert "re-check: no findings" in capsys.readouterr().out
    # One part alone says what is left, and its fix is the other part.
    again = Path(shutil.copytree(demos / "modelopt-1422-sidecar-drift", tmp_path / "d"))
    assert main(["repair", str(again), "--only", "sidecars", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"ckpt-inspect repair {again} --only index" in out
    assert "--only sidecars" not in out.split("preview", 1)[1]


def test_lost_experts_are_offered_back_from_the_reference_the_config_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An NVFP4 export that lost experts 1-2 of layer 2: the issue said "re-run the
    exporter" although `repair --from REF` restores them. Its fix now is that command,
    naming the model config.json's `_name_or_path` points at; run as printed, it restores
    every lost tensor and the checkpoint is clean."""
    original = tiny_deepseek_v3(tmp_path / "orig", layers=3)
    healthy = modelopt_export(original, tmp_path / "nvfp4", "NVFP4", experts_only=True)
    prefixes = ("model.layers.2.mlp.experts.1.", "model.layers.2.mlp.experts.2.")
    lost = modelopt_export(
        original,
        tmp_path / "export",
        "NVFP4",
        experts_only=True,
        edit=lambda s: {k: v for k, v in s.items() if not k.startswith(prefixes)},
    )
    config = json.loads((lost / CONFIG_NAME).read_text())
    config["_name_or_path"] = "nvfp4"  # beside the export, as a run folder keeps them
    (lost / CONFIG_NAME).write_text(json.dumps(config))
    scanned = scan(lost)
    (issue,) = [p for p in group_problems(scanned, check(scanned)) if p.key == "experts-missing"]
    assert issue.action.kind == "restore" and "re-run the exporter" not in issue.action.command
    assert issue.action.command == f"ckpt-inspect repair {lost} --from {healthy}"
    assert "a candidate: the model config.json names ('nvfp4'" in issue.action.text
    assert main(["check", str(lost)]) == 1
    assert issue.action.command in capsys.readouterr().out
    argv = shlex.split(issue.action.command)[1:]
    assert main([*argv, "--yes"]) == 0
    assert "re-check: no findings" in capsys.readouterr().out
    assert [f for f in check(scan(lost)) if f.severity != "info"] == []
