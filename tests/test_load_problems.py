"""The load check's findings as problems (`group_problems(..., verdict=...)`): a tiny DeepSeek-V3
saved by transformers, damaged the way exports go wrong. A tensor the loader cannot see
because of another cause (an index that leaves out its shard, a shard file that is gone,
experts never written) joins that cause's problem; the rest become load problems with what
fixes them. Every finding belongs to exactly one problem."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from hf_exports import resaved, tiny_deepseek_v3  # noqa: E402

from inspector._internal.checks import check  # noqa: E402
from inspector._internal.checks.model_load import check_load  # noqa: E402
from inspector._internal.common.filenames import INDEX_NAME  # noqa: E402
from inspector._internal.diagnosis.issues import Problem, group_problems  # noqa: E402
from inspector._internal.load.verdict import LoadVerdict, load_verdict  # noqa: E402
from inspector._internal.plans.repair import plan_repair, preview_repair  # noqa: E402
from inspector._internal.report.markdown import markdown_summary  # noqa: E402
from inspector._internal.scan.entry import scan  # noqa: E402

INDEX = INDEX_NAME


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_deepseek_v3(tmp_path_factory.mktemp("load-problems") / "base")


@pytest.fixture
def damaged(base: Path, tmp_path: Path) -> Callable[[Callable[[dict], dict]], Path]:
    def make(edit: Callable[[dict], dict]) -> Path:
        return resaved(base, tmp_path / "damaged", edit)

    return make


def _grouped(folder: Path) -> tuple[list, LoadVerdict, dict[str, Problem]]:
    scanned = scan(folder)
    verdict = load_verdict(scanned)
    findings = check(scanned, verdict=verdict)
    problems = group_problems(scanned, findings, verdict=verdict)
    claimed = [f for p in problems for f in p.findings]
    assert sorted(claimed, key=repr) == sorted(findings, key=repr)  # each exactly once
    return findings, verdict, {p.key: p for p in problems}


def test_healthy_export_has_no_load_problem(base: Path) -> None:
    findings, verdict, problems = _grouped(base)
    assert verdict.loads and verdict.mtp_skipped and findings == [] and problems == {}


def test_a_lost_head_is_restored_from_a_reference(damaged) -> None:
    folder = damaged(lambda s: {k: v for k, v in s.items() if not k.startswith("lm_head.")})
    _, verdict, problems = _grouped(folder)
    assert verdict.missing == ("lm_head.weight",)
    assert list(problems) == ["load-missing-tensors"]
    lost = problems["load-missing-tensors"]
    assert lost.title == (
        "DeepseekV3ForCausalLM expects 1 tensor the checkpoint does not hold (lm_head.weight)"
    )
    assert lost.severity == "error" and lost.codes == ("load-missing-tensor",)
    assert lost.action.kind == "restore" and not lost.repairable
    assert lost.action.command == f"ckpt-inspect repair {folder} --from REF"
    # config.json unties the head: setting tie_word_embeddings is the other way out.
    assert "tie_word_embeddings true" in lost.action.text
    assert lost.tensors == ()  # nothing in the checkpoint to show


def test_stray_and_reshaped_tensors_show_the_stored_tensors(damaged) -> None:
    stray = "model.layers.0.self_attn.extra_proj.weight"

    def edit(state: dict) -> dict:
        rows, cols = state["model.embed_tokens.weight"].shape
        return {
            **state,
            stray: torch.zeros(4, 4),
            "model.embed_tokens.weight": torch.zeros(rows + 8, cols),
        }

    _, _, problems = _grouped(damaged(edit))
    assert set(problems) == {"load-unexpected-tensors", "load-shape-mismatch"}
    extra, shape = problems["load-unexpected-tensors"], problems["load-shape-mismatch"]
    assert extra.severity == "warning" and extra.tensors == (stray,)
    assert extra.title == f"1 tensor DeepseekV3ForCausalLM would not load ({stray})"
    assert shape.severity == "error" and shape.tensors == ("model.embed_tokens.weight",)
    assert shape.title.startswith("1 tensor stored with another shape than DeepseekV3ForCausalLM")
    for problem in (extra, shape):
        assert problem.action.kind == "review"
        assert problem.action.command.endswith("--reference")
    assert extra.cells == ((0, None),)


def test_tensors_an_index_hides_join_the_index_problem_which_the_repair_fixes(
    base: Path, tmp_path: Path
) -> None:
    folder = Path(shutil.copytree(base, tmp_path / "hidden"))
    index = json.loads((folder / INDEX).read_text())
    hidden_file = "model-00002-of-00003.safetensors"
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != hidden_file}
    (folder / INDEX).write_text(json.dumps(index))
    findings, verdict, problems = _grouped(folder)
    # The loader reads only the shards the index names: the model misses what the hidden
    # shard holds, stacked experts included (stored as `...experts.*.down_proj.weight`).
    assert "model.layers.1.mlp.experts.down_proj" in verdict.missing
    assert list(problems) == ["index-misses-tensors"]
    index_problem = problems["index-misses-tensors"]
    assert "load-missing-tensor" in index_problem.codes
    assert "the load check reports them missing" in index_problem.impact
    # The preview re-checks the index as the plan writes it, with a verdict of its own.
    scanned = scan(folder)
    preview = preview_repair(
        plan_repair(scanned, only={"index"}), scanned, findings=findings, verdict=verdict
    )
    assert {f.code for f in preview.fixes} == {"unindexed-file", "load-missing-tensor"}
    assert preview.remains == () and preview.introduces == ()


def test_tensors_of_a_deleted_shard_join_its_problem(base: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(base, tmp_path / "gone"))
    (folder / "model-00002-of-00003.safetensors").unlink()
    _, verdict, problems = _grouped(folder)
    assert len(verdict.missing) > 10
    assert "load-missing-tensors" not in problems
    gone = problems["shard-files-missing"]
    assert "load-missing-tensor" in gone.codes and gone.action.kind == "restore"


def test_experts_never_written_explain_their_short_stacked_tensors(damaged) -> None:
    folder = damaged(lambda s: {k: v for k, v in s.items() if ".layers.1.mlp.experts.3." not in k})
    _, verdict, problems = _grouped(folder)
    # transformers stacks the three experts left: a shape mismatch, caused by the lost expert.
    assert {m.key for m in verdict.mismatched} == {
        "model.layers.1.mlp.experts.down_proj",
        "model.layers.1.mlp.experts.gate_up_proj",
    }
    assert list(problems) == ["experts-missing"]
    experts = problems["experts-missing"]
    assert set(experts.codes) == {"expert-missing", "load-shape-mismatch"}
    assert experts.title == "1 of 4 experts missing in 1 MoE layer (1)"
    assert experts.tensors == ()  # stacked model keys are not stored tensors


def test_titles_count_every_key_past_the_fold(base: Path) -> None:
    scanned = scan(base)
    keys = tuple(f"model.layers.2.mlp.extra.{i}.weight" for i in range(250))
    verdict = LoadVerdict(architecture="DeepseekV3ForCausalLM", missing=keys)
    findings = check_load(scanned, verdict)
    assert len(findings) < len(keys)  # listed up to the fold policy, then summarised
    (lost,) = group_problems(scanned, findings, verdict=verdict)
    assert lost.title.startswith("DeepseekV3ForCausalLM expects 250 tensors the checkpoint")
    assert lost.title.endswith("(model.layers.2.mlp.extra.*)")
    # Without the verdict only the listed findings count: it says so rather than guessing.
    (blind,) = group_problems(scanned, findings)
    listed = len(findings) - 1
    assert blind.title.startswith(f"DeepseekV3ForCausalLM expects more than {listed} tensors")
    assert set(blind.findings) == set(findings)


def test_markdown_lists_the_load_problem_with_its_fix(damaged) -> None:
    folder = damaged(lambda s: {k: v for k, v in s.items() if not k.startswith("lm_head.")})
    scanned = scan(folder)
    verdict = load_verdict(scanned)
    text = markdown_summary(scanned, check(scanned, verdict=verdict), verdict=verdict)
    assert "- will it load: **no**, as `DeepseekV3ForCausalLM`" in text
    assert "expects 1 tensor the checkpoint does not hold (lm_head.weight)" in text
    assert f"(`ckpt-inspect repair {folder} --from REF`)" in text
