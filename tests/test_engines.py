"""The serving engines' own verdict (issue 37): llama.cpp's tensor set for GGUF and its
converter's names, tied and draft heads, quantization x engine x GPU, and vLLM's own weight
loading compared with vLLM's real load on tiny models (those tests need the `[vllm]` extra
and are skipped without it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_cases import write_eagle3, write_llama_gguf

from inspector._internal.checks import check
from inspector._internal.cli.main import main
from inspector._internal.common.filenames import CONFIG_NAME
from inspector._internal.load.engine import EngineVerdict, vllm_available
from inspector._internal.scan.entry import scan
from inspector._internal.serve.engine import engine_check, verdict_findings
from inspector._internal.serve.fit import fit
from inspector._internal.serve.gpus import GPUS
from inspector._internal.serve.quant_support import QUANT_SUPPORT, quant_scheme

# -- vLLM: the engine alone against ours ---------------------------------------------------------

# case -> (what vLLM's real load does, the codes our verdict gives). Measured with vLLM 0.33.0;
# the closing table is this one.
EXPECTED = {
    "healthy": ("loads", set()),
    "moe-healthy": ("loads", set()),
    "fp8-healthy": ("loads", set()),
    "extra-tensor": (
        "ValueError: There is no module or parameter named",
        {"engine-weight-unmapped"},
    ),
    "wrong-shape": ("RuntimeError: start (0) + length (128) exceeds", {"engine-shape-mismatch"}),
    "fp8-renamed-scale": ("AttributeError", {"engine-load-failed"}),
    "drop-o_proj": ("loads", {"engine-weight-missing"}),
    "drop-lm_head": ("loads", {"engine-weight-missing"}),
    "drop-k_proj": ("loads", {"engine-weight-missing"}),
    "drop-expert": ("loads", {"engine-weight-missing"}),
    "rename-expert": ("loads", {"engine-weight-missing"}),
    "fp8-drop-scale": ("loads", {"engine-weight-missing"}),
    "fp8-drop-o_proj": ("loads", {"engine-weight-missing"}),
    "oversized": ("loads", {"engine-shape-mismatch"}),
    "small-expert": ("loads", {"engine-shape-mismatch"}),
}


def _codes(answer: dict) -> set[str]:
    verdict = EngineVerdict.from_answer(answer, tp=1)
    return {f.code for f in verdict_findings(verdict)}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_vllm_verdict_against_the_engine_alone(vllm_cases: dict[str, dict], case: str) -> None:
    engine, codes = EXPECTED[case]
    got = vllm_cases[case]
    assert got["engine"].startswith(engine), got["engine"]
    assert _codes(got["ours"]) == codes, got["ours"]
    if engine != "loads":  # the engine's own words, verbatim
        assert got["ours"]["error"] == got["engine"][: len(got["ours"]["error"])]


def test_vllm_names_what_it_skips(vllm_cases: dict[str, dict]) -> None:
    ours = {case: vllm_cases[case]["ours"] for case in EXPECTED}
    assert ours["drop-k_proj"]["missing_shards"] == [
        ["model.layers.0.self_attn.qkv_proj.weight", "k"]
    ]
    assert ours["drop-o_proj"]["missing"] == ["model.layers.0.self_attn.o_proj.weight"]
    lost = dict(map(tuple, ours["drop-expert"]["missing_shards"]))
    assert lost == {
        "model.layers.0.mlp.experts.routed_experts.w13_weight": "expert 1 w1, expert 1 w3",
        "model.layers.0.mlp.experts.routed_experts.w2_weight": "expert 1 w2",
    }
    ((name, received, expected, _),) = ours["small-expert"]["size_mismatched"]
    assert name.endswith("w2_weight") and (received, expected) == (7168, 8192)


def test_vllm_verdict_at_tp2(vllm_cases: dict[str, dict]) -> None:
    """TP 2 predicted in the one child: healthy models load, a dropped k_proj is still named
    (element counts are compared at TP 1 only)."""
    for case in ("healthy@tp2", "moe-healthy@tp2"):
        ours = vllm_cases[case]["ours"]
        assert ours["tp"] == 2 and ours["loads"] is True, ours
    lost = vllm_cases["drop-k_proj@tp2"]["ours"]
    assert lost["tp"] == 2 and lost["missing_shards"] == [
        ["model.layers.0.self_attn.qkv_proj.weight", "k"]
    ]


def test_check_engine_vllm_through_the_cli(
    vllm_cases: dict[str, dict], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI and --json over the child's recorded answer (the pipe itself served every
    case in `vllm_cases`; a second vLLM import here would double the tests' cost)."""
    import json

    from inspector._internal.load import engine

    case = vllm_cases["drop-k_proj"]
    monkeypatch.setattr(engine.ENGINE_PROCESS, "ask", lambda request: case["answer"])
    folder = case["folder"]
    assert main(["check", folder, "--engine", "vllm", "--no-model", "--verbose"]) == 1
    out = capsys.readouterr().out
    assert "engine check: vLLM 0.33.0 as LlamaForCausalLM (TP 1): starts, but" in out
    assert "error    engine-weight-missing  1 finding" in out and "qkv_proj.weight" in out
    assert main(["check", folder, "--engine", "vllm", "--no-model", "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["engine"]["verdict"]["missing_shards"] == [
        ["model.layers.0.self_attn.qkv_proj.weight", "k"]
    ]
    assert result["counts"]["by_code"] == {"engine-weight-missing": 1}


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("billion-layers", "num_hidden_layers is 1,000,000,000, over the 2,048 this check"),
        ("auto-map", "vLLM could not build the model"),
    ],
)
def test_hostile_configs_are_refused_before_vllm_builds(
    vllm_cases: dict[str, dict], case: str, words: str
) -> None:
    from vllm_cases import imported

    ours = vllm_cases[case]["ours"]
    assert ours["skipped"] is not None and words in ours["skipped"], ours
    assert not imported(Path(vllm_cases[case]["folder"]))


@pytest.mark.parametrize("case", ["endless-link", "hub-backbone"])
def test_what_vllm_reads_is_the_private_copy(vllm_cases: dict[str, dict], case: str) -> None:
    """A link to an endless file beside config.json is never opened, a Hub repository
    named in config.json never fetched: a verdict (or a skip saying why), in bounded time."""
    verdict = vllm_cases[case]["ours"]
    assert verdict["seconds"] < 60
    assert verdict["skipped"] is None or "could not build" in verdict["skipped"], verdict


def _replay(monkeypatch: pytest.MonkeyPatch, case: dict) -> None:
    """The child's recorded answer for `case`, as the pipe gave it (no second vLLM import)."""
    from inspector._internal.load import engine

    monkeypatch.setattr(engine.ENGINE_PROCESS, "ask", lambda request: case["answer"])


def test_fit_engine_vllm(
    vllm_cases: dict[str, dict], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fit --engine vllm`: the engine's findings join every plan's; --json says the verdict."""
    import json

    case = vllm_cases["drop-o_proj"]
    _replay(monkeypatch, case)
    result = fit(scan(case["folder"]), tp=1, engine="vllm")
    (plan,) = result.plans
    assert not plan.feasible and "engine-weight-missing" in {f.code for f in plan.findings}
    assert result.to_dict()["engine"]["verdict"]["missing"] == [
        "model.layers.0.self_attn.o_proj.weight"
    ]
    assert main(["fit", case["folder"], "--engine", "vllm"]) == 1
    out = capsys.readouterr().out
    assert "engine check: vLLM 0.33.0 as LlamaForCausalLM (TP 1): starts, but 1 parameters" in out
    assert main(["fit", case["folder"], "--engine", "vllm", "--tp", "1", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["engine"]["verdict"]["loads"] is False


def test_serve_tab_runs_vllms_verdict_on_request(
    vllm_cases: dict[str, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Serve tab's button: inspector.engine_check in a thread, its findings escaped."""
    import ipywidgets as w

    from widgets.tabs.serve import ServePanel

    case = vllm_cases["drop-k_proj"]
    _replay(monkeypatch, case)
    panel = ServePanel(scan(case["folder"]), figure=lambda figure, css: w.HTML())
    panel.run_engine()
    assert panel.engine_thread is not None
    panel.engine_thread.join(timeout=60)
    assert "starts, but 1 fused parameters partly filled" in panel.engine_out.value
    assert "<b>engine-weight-missing</b>" in panel.engine_out.value
    assert not panel.engine_button.disabled


def test_fit_target_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    draft = write_eagle3(tmp_path / "draft", vocab=64)
    other = write_eagle3(tmp_path / "other", vocab=96)
    main(["fit", str(draft), "--tp", "1", "--target", str(other)])
    assert "draft-target-mismatch" in capsys.readouterr().out


def test_without_vllm_one_line_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    assert vllm_available() is not None
    write_eagle3(tmp_path)
    report = engine_check(scan(tmp_path), engine="vllm")
    assert report.findings == () and len(report.notes) == 1
    assert "[vllm]" in report.notes[0] and "not installed" in report.notes[0]
    # fit and the Serve tab say the same one line.
    assert fit(scan(tmp_path), tp=1, engine="vllm").engine == report
    from widgets.tabs.serve import engine_html

    assert engine_html(report).count("<li>") == 1


@pytest.mark.parametrize(
    "answer",
    [
        [],
        {"error": 3},
        {"error_kind": "weird", "error": "x"},
        {"missing": ["a"] * 201},
        {"missing": [1]},
        {"missing_count": -1},
        {"missing_shards": [["a"]]},
        {"size_mismatched": [["a", 1, 2, [-3]]]},
        {"seconds": "soon"},
        {"tp": True},
        {"version": "x" * 5000},
    ],
)
def test_the_childs_answer_is_checked_field_by_field(answer: object) -> None:
    """The child ran vLLM on an untrusted config: anything but what it writes is refused."""
    with pytest.raises(ValueError):
        EngineVerdict.from_answer(answer, tp=1)


# -- llama.cpp -----------------------------------------------------------------------------------


def test_gguf_missing_a_block_and_the_healthy_file(tmp_path: Path) -> None:
    write_llama_gguf(tmp_path / "ok")
    assert check(scan(tmp_path / "ok"), model=False) == []
    write_llama_gguf(tmp_path / "cut", block_count=4, blocks=(0, 1))
    (f,) = check(scan(tmp_path / "cut"), model=False)
    assert f.code == "gguf-tensor-missing" and "blocks 2-3" in f.message and f.layer == 2


def test_gguf_blocks_past_block_count(tmp_path: Path) -> None:
    write_llama_gguf(tmp_path, block_count=1, blocks=(0, 1))
    (f,) = check(scan(tmp_path), model=False)
    assert f.code == "gguf-tensor-unexpected" and "past llama.block_count 1" in f.message


def test_gguf_rope_freqs_where_config_json_scales_rope_as_llama3(tmp_path: Path) -> None:
    write_llama_gguf(tmp_path)
    config = {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    (tmp_path / CONFIG_NAME).write_text(__import__("json").dumps(config))
    codes = [f for f in check(scan(tmp_path), model=False) if f.code == "gguf-tensor-missing"]
    assert len(codes) == 1 and "rope_freqs" in codes[0].message
    write_llama_gguf(tmp_path / "with", extra=("rope_freqs.weight",))
    (tmp_path / "with" / CONFIG_NAME).write_text(__import__("json").dumps(config))
    assert check(scan(tmp_path / "with"), model=False) == []


@pytest.mark.parametrize(
    ("kv", "words"),
    [
        # hostile metadata: a block count no model has, of the wrong type, negative
        ({"block_count": 1 << 40}, None),
        ({"block_count": -3}, None),
        ({"block_count": "2"}, None),
    ],
)
def test_gguf_hostile_block_count_is_not_believed(
    tmp_path: Path, kv: dict, words: str | None
) -> None:
    import gguf
    import numpy as np

    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    value = kv["block_count"]
    if isinstance(value, str):
        writer.add_string("llama.block_count", value)
    elif value < 0:
        writer.add_int32("llama.block_count", value)
    else:
        writer.add_uint64("llama.block_count", value)
    writer.add_tensor("token_embd.weight", np.ones(8, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    found = [f.code for f in check(scan(tmp_path), model=False)]
    assert not [c for c in found if c.startswith("gguf-tensor")], found


def test_gguf_hostile_names_stay_linear(tmp_path: Path) -> None:
    """A 40-digit block number (ggml's names stop at 63 bytes) and names built to look like
    blocks: one pass."""
    names = ["blk." + "9" * 40 + ".attn_q.weight", "blk.0.blk.1.attn_q.weight", "blk..x"]
    write_llama_gguf(tmp_path, extra=names)
    (f,) = check(scan(tmp_path), model=False)
    assert f.code == "gguf-tensor-unexpected" and "3 tensors" in f.message
    assert len(f.message) < 2_000


# -- tied heads and drafts -----------------------------------------------------------------------


def test_tied_head_full_read(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    embed = torch.randn(64, 16)
    head = embed.clone()
    head[-1, -1] += 1  # one value, in the last window a sample might miss
    save_file(
        {"model.embed_tokens.weight": embed, "lm_head.weight": head},
        str(tmp_path / "model.safetensors"),
    )
    config = {"model_type": "llama", "tie_word_embeddings": True, "num_hidden_layers": 0}
    (tmp_path / CONFIG_NAME).write_text(__import__("json").dumps(config))
    full = [
        f
        for f in check(scan(tmp_path), model=False, values="full")
        if f.code == "tied-head-differs"
    ]
    assert len(full) == 1 and "content hashes differ" in full[0].message


def test_draft_against_its_target(tmp_path: Path) -> None:
    # A draft without a head borrows the target's: its draft vocabulary is the target's.
    draft = scan(write_eagle3(tmp_path / "draft", vocab=64, draft_vocab=64, head=False))
    good = scan(write_eagle3(tmp_path / "target", vocab=64, draft_vocab=64))
    bad = scan(write_eagle3(tmp_path / "other", vocab=96))
    codes = {f.code for p in fit(draft, tp=1, target=good).plans for f in p.findings}
    assert "draft-target-mismatch" not in codes
    (f,) = [
        f
        for f in fit(draft, tp=1, target=bad).plans[0].findings
        if f.code == "draft-target-mismatch"
    ]
    assert "vocabulary (vocab_size) is 64, the target's 96" in f.message


@pytest.mark.parametrize(
    ("d2t", "words"),
    [
        (torch.zeros(31, dtype=torch.int64), "31 entries, draft_vocab_size is 32"),
        (torch.zeros(32, 2, dtype=torch.int64), "not one integer per token"),
        (torch.zeros(32, dtype=torch.float32), "not one integer per token"),
        (torch.full((32,), -(1 << 62), dtype=torch.int64), "outside the 64-token vocabulary"),
        (torch.full((32,), 1 << 62, dtype=torch.int64), "outside the 64-token vocabulary"),
    ],
)
def test_hostile_d2t(tmp_path: Path, d2t: torch.Tensor, words: str) -> None:
    findings = check(scan(write_eagle3(tmp_path, d2t=d2t)), model=False)
    (f,) = [f for f in findings if f.code == "draft-mapping-invalid"]
    assert words in f.message


def test_huge_d2t_is_judged_by_its_shape(tmp_path: Path) -> None:
    """A header declaring a d2t of 2^40 entries: the shape is judged, nothing is read."""
    folder = write_eagle3(tmp_path)
    import json
    import struct

    from safetensors import safe_open  # noqa: F401 (the header is rewritten below)

    data = (folder / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header["d2t"]["shape"] = [1 << 40]
    text = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n :])
    findings = check(scan(folder), model=False)
    assert any(
        f.code == "draft-mapping-invalid" and "1,099,511,627,776 entries" in f.message
        for f in findings
    )


# -- quantization x engine x GPU -------------------------------------------------------------------


def test_every_row_has_its_source_and_the_catalogue_has_a_capability() -> None:
    assert all(row.source and row.native >= (row.fallback or 0) for row in QUANT_SUPPORT.values())
    assert all(float(g.compute_capability) >= 7.0 for g in GPUS.values())


@pytest.mark.parametrize(
    ("qc", "scheme"),
    [
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "FP8 W8A8"),
        ({"quant_method": "mxfp4"}, "MXFP4"),
        ({"quant_method": "gptq", "bits": 4}, "INT4 W4A16 (GPTQ / AWQ)"),
        ({"quant_method": "gptq", "bits": 8}, None),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "NVFP4"),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "g": {
                        "weights": {"num_bits": 8, "type": "int"},
                        "input_activations": {"num_bits": 8},
                    }
                },
            },
            "INT8 W8A8",
        ),
        ({"quant_method": "compressed-tensors", "config_groups": {"g": "hostile"}}, None),
        ({"quant_method": ["fp8"]}, None),
        (
            {
                "quant_method": "modelopt",
                "quant_algo": "MIXED_PRECISION",
                "quantized_layers": {"a": 3},
            },
            None,
        ),
    ],
)
def test_quant_scheme(qc: dict, scheme: str | None) -> None:
    assert quant_scheme({"quantization_config": qc}, None) == scheme


def test_the_makefile_installs_the_vllm_the_verdict_is_written_against() -> None:
    from inspector._internal.load.engine import VLLM_PIN

    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert f"VLLM_PIN ?= vllm=={VLLM_PIN}\n" in makefile
