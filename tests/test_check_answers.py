"""Issue 34, items 3 and 4, as a newcomer meets them on the demos: every count `check` prints
is explained and adds up, one layer numbering in scan, check and diff, and no silence where
something is wrong (a collapse that is not a finding says why, `--values` says what it read,
a reference without shards says so, a training checkpoint is re-saved by its job).

The CLI runs in this process (conftest's `cli`, without the model) on the session's
demo checkpoints."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from inspector._internal.common.filenames import INDEX_NAME
from inspector._internal.diagnosis.issues import group_problems
from inspector._internal.findings.finding import Finding, Severity
from inspector._internal.report.markdown import markdown_summary
from inspector._internal.scan.entry import scan

DRIFT = "modelopt-1422-sidecar-drift"
EP = "modelopt-1631-ep-collision"


def test_every_count_of_check_is_explained_and_adds_up(demo_checkpoints: Path, cli) -> None:
    out = cli("check", demo_checkpoints / DRIFT).stdout
    total, errors, warnings, info, issues = map(
        int,
        re.search(
            r"(\d+) findings \((\d+) errors, (\d+) warnings, (\d+) info\) in (\d+) issues", out
        ).groups(),  # type: ignore[union-attr]
    )
    assert (total, issues) == (44, 2) and errors + warnings + info == total
    # Each issue says which findings it explains; together, every finding once.
    explained = [int(n) for n in re.findall(r"explains (\d+) findings?:", out)]
    assert len(explained) == issues and sum(explained) == total
    # One line per code, saying what it counts: findings, tensors, and how they fold.
    rows = out.split("findings by code")[1].splitlines()[1:]
    counted = 0
    for row in filter(str.strip, rows):
        n = row.split()[2]
        counted += int(n)
        folded = re.search(r"on (\d+) tensors \((\d+) one by one, (\d+) folded into (\d+)\)", row)
        if folded:
            on, one_by_one, more, into = map(int, folded.groups())
            assert one_by_one + more == on and one_by_one + into == int(n), row
    assert counted == total
    assert "listed above" not in out
    # --verbose lists every finding, its code's remedy said once.
    verbose = cli("check", demo_checkpoints / DRIFT, "--verbose").stdout
    fix = "add it to the index (ckpt-inspect repair) or remove it"
    assert out.count(fix) == 0 and verbose.count(fix) == 1


def test_mtp_layers_have_one_numbering_in_scan_check_and_diff(demo_checkpoints: Path, cli) -> None:
    """The 1631 demo's `mtp.layers.0.*` are MTP layer 4 (after decoder layers 0-3) in every
    command; check said 'MTP layer 4' where diff said 'MTP layer 0'."""
    folder = demo_checkpoints / EP
    scanned = cli("scan", folder).stdout
    checked = cli("check", folder).stdout
    verbose = cli("check", folder, "--verbose").stdout
    diffed = cli("diff", demo_checkpoints / "healthy-modelopt-per-layer", folder).stdout
    for out in (scanned, checked, verbose, diffed):
        assert "MTP layer 4" in out and "MTP layer 0" not in out, out[-1500:]
    assert "layers 1-3 and MTP layer 4" in scanned
    assert "3 MoE layers (1-3) and MTP layer 4" in checked
    assert "layers 1-3: experts 8-63" in diffed and "MTP layer 4: experts 8-63" in diffed
    doc = json.loads(cli("check", folder, "--format", "json", "--full").stdout)
    mtp = [f for f in doc["findings"] if "MTP" in f["message"]]
    assert mtp and {f["layer"] for f in mtp} == {4}


def test_the_markdown_summary_says_how_many_experts_are_missing(demo_checkpoints: Path) -> None:
    scanned = scan(demo_checkpoints / EP)
    from inspector._internal.checks import check

    text = markdown_summary(scanned, check(scanned))
    assert "experts per MoE layer: 512" not in text
    assert "found 64 in layers 1-3 and MTP layer 4 (448 of 512 missing in each)" in text
    assert "characters cut" not in text and "more characters" not in text


def test_a_collapse_that_is_not_a_finding_says_why(demo_checkpoints: Path, cli) -> None:
    """automodel-2289-collapsed: all 173 tensors in one 78 kB file that the index names
    alone. transformers reads it like shards, so it is no finding; check says so instead of a
    bare 'no findings'."""
    run = cli("check", demo_checkpoints / "automodel-2289-collapsed")
    assert run.returncode == 0
    assert "all 173 tensors are in one file, model-00001-of-00001.safetensors" in run.stdout
    assert "not a finding under the 5.0 GB" in run.stdout and "mapping-collapsed" in run.stdout


def test_values_sample_says_what_it_read(demo_checkpoints: Path, cli) -> None:
    run = cli("check", demo_checkpoints / "healthy-hf-sharded", "--values", "sample")
    assert run.returncode == 0 and "no findings" in run.stdout
    assert "values: read 389 of 389 tensors, 52.4 kB of their 52.4 kB" in run.stdout
    assert "8 windows of 256 bytes a tensor, seed 0" in run.stdout


def test_diff_against_a_reference_without_shards_says_they_are_missing(
    demo_checkpoints: Path, tmp_path: Path, cli
) -> None:
    healthy = demo_checkpoints / "healthy-hf-sharded"
    for doc in healthy.glob("*.json"):
        shutil.copy(doc, tmp_path / doc.name)
    run = cli("diff", tmp_path, healthy, "--reference")
    assert run.returncode == 2 and "UNEXPECTED" not in run.stdout
    assert "holds no tensor" in run.stderr and "4 shard files that are not in the folder" in (
        run.stderr
    )


def test_a_training_checkpoint_is_re_saved_by_its_job_and_titled_whole(
    demo_checkpoints: Path, cli
) -> None:
    """The rerun drift of the 4448 demo: the fix is the training job's save, not an
    exporter, and the issue's title is its finding's first clause, whole (it was cut to
    '... has no ... (68 more characters)')."""
    out = cli("check", demo_checkpoints / "megatron-4448-rerun-drift").stdout
    assert "re-save the checkpoint from the training job" in out
    assert "exporter" not in out
    assert "more characters" not in out and "characters cut" not in out
    assert "but iter_0000100/.metadata has no rerun_state_machine_state/shard_* entries" in out


def test_a_title_too_long_for_a_line_is_its_file_and_what_the_code_means(
    demo_checkpoints: Path,
) -> None:
    scanned = scan(demo_checkpoints / "megatron-4448-rerun-drift")
    message = "iter_0000100/common.pt says " + "the state is odd, " * 40 + "; load with x"
    finding = Finding(
        "torch-dist-common-drift", Severity.ERROR, message, file="iter_0000100/common.pt"
    )
    (problem,) = group_problems(scanned, [finding])
    assert problem.title == ("iter_0000100/common.pt: common state and sharded metadata disagree")


def test_files_that_link_out_of_the_folder_are_one_issue_not_a_stale_index(
    demo_checkpoints: Path, tmp_path: Path, cli
) -> None:
    """Shards that are links to files outside the checkpoint are not read (file-unsafe); what
    the index maps to them is 'in no shard' for that reason alone. check said 'model-00001-
    of-00004.safetensors points at the wrong places' and 'rebuild model-00001-of-00004.
    safetensors from the shard headers' (a shard named as the index, and a rebuild that
    repair refuses), as a second issue."""
    outside, folder = tmp_path / "outside", tmp_path / "ckpt"
    shutil.copytree(demo_checkpoints / "healthy-hf-sharded", outside)
    folder.mkdir()
    for item in outside.iterdir():
        if item.suffix == ".safetensors":
            (folder / item.name).symlink_to(item)
        else:
            shutil.copy(item, folder / item.name)
    out = cli("check", folder).stdout
    assert "4 files not read: not a regular file inside the checkpoint folder" in out
    assert "explains 8 findings: file-unsafe x4, index-dangling-tensor x4" in out
    assert "points at the wrong places" not in out and "--only index" not in out


def test_a_stale_index_issue_names_the_index_not_the_shard(
    demo_checkpoints: Path, tmp_path: Path, cli
) -> None:
    """A dangling entry's finding names the shard the index points at; the issue named that
    shard as the file that 'points at the wrong places' and the one to rebuild."""
    folder = Path(shutil.copytree(demo_checkpoints / "healthy-hf-sharded", tmp_path / "ckpt"))
    index = folder / INDEX_NAME
    doc = json.loads(index.read_text())
    doc["weight_map"]["model.layers.0.ghost.weight"] = "model-00001-of-00004.safetensors"
    index.write_text(json.dumps(doc))
    out = cli("check", folder).stdout
    assert "model.safetensors.index.json points at the wrong places" in out
    assert "fix: rebuild model.safetensors.index.json from the shard headers" in out
