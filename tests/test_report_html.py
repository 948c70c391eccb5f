"""The HTML report and the Markdown summary of a real (small, broken) MoE checkpoint."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import plotly.offline
import pytest
from huggingface_hub import split_state_dict_into_shards_factory
from inspector.widgets.plotlyjs import cartesian_bundle
from inspector.widgets.report import write_html_report
from safetensors.numpy import save_file
from transformers import Qwen3MoeConfig

from inspector._internal.checks import check
from inspector._internal.cli.main import main
from inspector._internal.common.filenames import INDEX_NAME
from inspector._internal.findings.finding import make_finding
from inspector._internal.report.markdown import markdown_summary
from inspector._internal.scan.entry import scan

LAYERS, EXPERTS = 4, 8
LOST_EXPERTS = {3: range(4, 8)}  # layer 3 kept experts 0-3 only
LOST_PART = (1, 2, "down_proj")  # layer 1, expert 2 has no down_proj


def write_moe_checkpoint(folder: Path) -> Path:
    """A Qwen3-MoE-shaped HF sharded checkpoint: config by transformers, shards split by
    huggingface_hub's splitter, written by safetensors; some experts were never saved."""
    folder.mkdir(parents=True, exist_ok=True)
    config = Qwen3MoeConfig(
        num_hidden_layers=LAYERS,
        num_experts=EXPERTS,
        hidden_size=16,
        moe_intermediate_size=8,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        vocab_size=32,
    )
    config.save_pretrained(folder)
    rng = np.random.default_rng(0)
    state: dict[str, np.ndarray] = {"model.embed_tokens.weight": rng.random((32, 16), np.float32)}
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}"
        state[f"{prefix}.self_attn.q_proj.weight"] = rng.random((16, 16), np.float32)
        state[f"{prefix}.mlp.gate.weight"] = rng.random((EXPERTS, 16), np.float32)
        for expert in range(EXPERTS):
            if expert in LOST_EXPERTS.get(layer, ()):
                continue
            for proj in ("gate_proj", "up_proj", "down_proj"):
                if (layer, expert, proj) == LOST_PART:
                    continue
                shape = (16, 8) if proj == "down_proj" else (8, 16)
                state[f"{prefix}.mlp.experts.{expert}.{proj}.weight"] = np.ones(shape, np.float16)
    state["lm_head.weight"] = rng.random((32, 16), np.float32)
    split = split_state_dict_into_shards_factory(
        state,
        get_storage_size=lambda a: a.nbytes,
        filename_pattern="model{suffix}.safetensors",
        max_shard_size="8KB",
    )
    for file, names in split.filename_to_tensors.items():
        save_file({n: state[n] for n in names}, folder / file, metadata={"format": "pt"})
    index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
    (folder / INDEX_NAME).write_text(json.dumps(index))
    return folder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_moe_checkpoint(tmp_path_factory.mktemp("moe") / "tiny-moe")


@pytest.fixture(scope="module")
def report(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory):
    scanned = scan(checkpoint)
    findings = check(scanned)
    # A hostile message: it must reach the page escaped, never as markup.
    findings.append(make_finding("trailing-bytes", "<script>alert(1)</script> & more", file="x<y>"))
    out = tmp_path_factory.mktemp("out") / "sub" / "report.html"
    return write_html_report(scanned, findings, out), findings


def test_checkpoint_has_the_planted_problems(checkpoint: Path):
    codes = {f.code: f for f in check(scan(checkpoint))}
    assert "expert-missing" in codes and codes["expert-missing"].layer == 3
    assert "expert-incomplete" in codes and codes["expert-incomplete"].expert == 2
    assert len(list(checkpoint.glob("model-*.safetensors"))) >= 3


def test_report_is_one_self_contained_file(report):
    path, _ = report
    assert path.is_file() and path.name == "report.html"
    assert not [p for p in path.parent.iterdir() if p != path], "no temp file may be left behind"
    text = path.read_text(encoding="utf-8")
    # plotly.js's cartesian bundle exactly once (its own code names URLs it never calls for
    # these charts); outside it, the page names no URL at all and loads nothing by reference.
    bundle = cartesian_bundle()
    assert text.count(bundle) == 1 and plotly.offline.get_plotlyjs() not in text
    assert path.stat().st_size < 2_000_000  # the whole of plotly.js made it 5 MB
    page = text.replace(bundle, "")
    assert not re.search(r"https?:|//[\w.-]+\.\w+/", page, re.I)
    assert not re.search(r"<script[^>]*\bsrc\s*=", page, re.I)
    assert "<link" not in page.lower() and "@import" not in page
    # findings, heatmap, sizes, bytes, parameters, and the parallel plans of "Will it serve?"
    assert page.count("Plotly.newPlot(") == 6


def test_report_sections_and_heatmap_id(report):
    text = report[0].read_text(encoding="utf-8")
    for section in ("summary", "findings", "expert-heatmap", "shard-sizes", "bytes-per-layer"):
        assert f"<section id='{section}'>" in text
    assert re.search(r"""<section id='expert-heatmap'>.*?id="expert-heatmap-figure\"""", text, re.S)
    assert "tiny-moe" in text and "hf-sharded" in text


def test_findings_table_rows_are_escaped_and_grouped(report):
    path, findings = report
    text = path.read_text(encoding="utf-8")
    rows = re.findall(r"<tr class='finding sev-(\w+)' data-code='([\w-]+)'>", text)
    assert len(rows) == len(findings)
    assert sorted(code for _, code in rows) == sorted(f.code for f in findings)
    # Worst first: every error row before every warning row.
    severities = [s for s, _ in rows]
    assert severities == sorted(severities, key=["error", "warning", "info"].index)
    groups = re.findall(r"<tr class='group sev-\w+' data-code='([\w-]+)'>", text)
    assert len(groups) == len(set(groups)) == len({f.code for f in findings})
    assert "<script>alert(1)</script>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in text
    assert "x&lt;y&gt;" in text
    assert "layer 3: experts 4-7 missing" in text


def test_markdown_summary_counts_and_ranges(checkpoint: Path):
    scanned = scan(checkpoint)
    findings = check(scanned)
    more = [
        make_finding("expert-missing", f"layer {i}: experts 4-7 missing", layer=i)
        for i in (5, 6, 7)
    ]
    md = markdown_summary(scanned, findings + more)
    assert md.startswith("### Checkpoint inspection: `tiny-moe`")
    assert "- layout: `hf-sharded`" in md
    assert f"- layers: {LAYERS} decoder ({LAYERS} MoE)" in md
    errors = sum(f.severity == "error" for f in findings) + 3
    assert f"- findings: {errors} error" in md
    row = next(line for line in md.splitlines() if line.startswith("| error | `expert-missing`"))
    assert row.split(" | ")[2:4] == ["4", "3, 5-7"]
    # At most 3 examples per code, then a count of the rest.
    block = md.split("**expert-missing**: 4 findings, one per layer")[1].split("**")[0]
    assert block.count("\n- layer ") == 3 and "- ... 1 more finding" in block


def test_markdown_without_findings_is_short(checkpoint: Path):
    md = markdown_summary(scan(checkpoint), [])
    assert md.rstrip().endswith("No findings.")
    assert "| severity |" not in md and len(md.splitlines()) < 11
    assert "- not verified: no ckpt-inspect-manifest.json" in md


def test_markdown_escapes_table_pipes(checkpoint: Path):
    bad = make_finding("trailing-bytes", "x", file="a|b.safetensors")
    md = markdown_summary(scan(checkpoint), [bad])
    row = next(line for line in md.splitlines() if "`trailing-bytes`" in line)
    assert "a\\|b.safetensors" in row and row.count(" | ") == 5


def test_cli_report_writes_html_and_prints_markdown(checkpoint: Path, tmp_path: Path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(checkpoint), "-o", str(out)]) == 0
    assert 'id="expert-heatmap-figure"' in out.read_text(encoding="utf-8")
    assert f"wrote {out}" in capsys.readouterr().out
    assert main(["report", str(checkpoint), "--markdown"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("### Checkpoint inspection") and "`expert-missing`" in printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]


def test_report_and_markdown_list_problems_with_their_fix(report, checkpoint: Path):
    text = report[0].read_text(encoding="utf-8")
    problems = re.findall(r"<tr class='problem sev-(\w+)' data-problem='([\w-]+)'>", text)
    assert ("error", "experts-missing") in problems
    section = text.split("<section id='problems'>", 1)[1].split("</section>", 1)[0]
    assert "re-export from the training checkpoint" in section
    # Names wrap at their separators, not in the middle of a word.
    assert "model-<wbr>00004-<wbr>of-<wbr>00004.<wbr>safetensors" in text
    assert "word-break: break-all" not in text
    md = markdown_summary(scan(checkpoint), check(scan(checkpoint)))
    assert "**Issues** (findings grouped by root cause, each with its fix)" in md
    assert re.search(r"- \*\*error\*\*: .*experts missing.*Fix: copy them back.*--from REF", md)


def test_report_says_whether_it_loads_with_the_names_escaped(checkpoint: Path, tmp_path: Path):
    from inspector._internal.load.verdict import LoadVerdict, load_verdict

    scanned = scan(checkpoint)
    verdict = load_verdict(scanned)  # the config names no class: the check says why not
    text = write_html_report(
        scanned, check(scanned, verdict=verdict), tmp_path / "r.html", verdict=verdict
    ).read_text()
    load = text[text.index("<section id='load'>") : text.index("<section id='problems'>")]
    assert "data-loads='unknown'" in load and "not checked" in load
    assert "config.json names no architecture" in load
    # A config can name any architecture: what the verdict says is escaped.
    hostile = LoadVerdict(architecture="<img src=x onerror=alert(1)>", missing=("<b>x</b>",))
    text = write_html_report(scanned, [], tmp_path / "h.html", verdict=hostile).read_text()
    assert "<img src=x" not in text and "&lt;img src=x onerror=alert(1)&gt;" in text
    assert "<b>x</b>" not in text and "&lt;b&gt;x&lt;/b&gt;" in text
    # Without a verdict the report makes no claim about loading.
    bare = write_html_report(scanned, [], tmp_path / "b.html").read_text()
    assert "<section id='load'>" not in bare


def test_expert_missing_rows_name_the_missing_experts(report):
    """The experts column of a layer that lost several experts says which, from the same
    experts table the finding was made from."""
    text = report[0].read_text(encoding="utf-8")
    row = re.search(r"<tr class='finding sev-error' data-code='expert-missing'>(.*?)</tr>", text)
    assert row is not None
    assert re.search(r"<td>3</td><td class='experts'>4-7</td>$", row.group(1)), row.group(1)
    incomplete = re.search(
        r"<tr class='finding sev-error' data-code='expert-incomplete'>(.*?)</tr>", text
    )
    assert incomplete is not None and "<td class='experts'>2</td>" in incomplete.group(1)


def test_file_names_wrap_between_words_not_inside_them(report):
    text = report[0].read_text(encoding="utf-8")
    rule = re.search(r"td\.name \{([^}]*)\}", text)
    assert rule is not None and "anywhere" not in rule.group(1) and "break-all" not in rule.group(1)
    # Wrap points after the separators of every shard name the table shows.
    assert re.search(r"model-<wbr>\d{5}-<wbr>of-<wbr>\d{5}\.<wbr>safetensors", text)


@pytest.mark.parametrize("figures", ["cdn", "png"])
def test_light_reports_are_small_enough_to_attach(
    demo_checkpoints: Path, tmp_path: Path, figures: str
):
    """Every demo checkpoint's light report is under 500 kB (the full one is about 1.5 MB):
    `--light` loads plotly.js from its CDN and says so; `--figures png` draws PNG images."""
    bundle = cartesian_bundle()
    demos = sorted(p for p in demo_checkpoints.iterdir() if (p / "README.txt").is_file())
    assert len(demos) >= 8
    for demo in demos[:: 1 if figures == "cdn" else 4]:  # PNGs need a browser: a few
        out = tmp_path / f"{demo.name}.html"
        flag = ["--light"] if figures == "cdn" else ["--figures", "png"]
        assert main(["report", str(demo), "-o", str(out), "--no-model", *flag]) == 0
        text = out.read_text(encoding="utf-8")
        assert out.stat().st_size < 500_000, (demo.name, out.stat().st_size)
        assert bundle not in text and plotly.offline.get_plotlyjs() not in text
        assert "id='figures-note'" in text
        if figures == "cdn":
            version = plotly.offline.get_plotlyjs_version()
            tag = re.search(r"<script charset='utf-8' src='([^']+)' integrity='([^']+)'", text)
            assert (
                tag is not None and tag.group(1) == f"https://cdn.plot.ly/plotly-{version}.min.js"
            )
            assert tag.group(2).startswith("sha384-")
            assert "need internet access" in text and text.count("Plotly.newPlot(") >= 4
        else:
            assert "<script" not in text and "Plotly.newPlot(" not in text
            assert text.count("src='data:image/png;base64,") >= 4


def test_full_report_stays_the_offline_default(checkpoint: Path, tmp_path: Path):
    from inspector.widgets.report import render_html_report

    scanned = scan(checkpoint)
    text = render_html_report(scanned, check(scanned))
    assert cartesian_bundle() in text and "figures-note" not in text
    with pytest.raises(ValueError, match="figures='svg'"):
        render_html_report(scanned, [], figures="svg")  # type: ignore[arg-type]
