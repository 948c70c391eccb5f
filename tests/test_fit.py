"""`fit` on real models written as sparse checkpoints (`tests/sparse_checkpoints.py`: each
released config.json written by its transformers config class, every released tensor in the
shard headers): which parallel plans vLLM and SGLang start, and the bytes per GPU, each
expected figure computed here by hand from the model's shapes.

The rules each expectation rests on are the engines' (cited in `inspector._internal.serve`):
a block-FP8 MoE intermediate size per rank must be a multiple of 128 (`Fp8MoEMethod`), a
row-parallel input too (`validate_fp8_block_shape`), TP must divide the attention heads, KV
heads are replicated past TP = KV heads, the vocabulary is padded to 64 rows and split, MXFP4
experts are cut in whole 32-value blocks.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from sparse_checkpoints import NEMOTRON_PATTERN, write_model

from inspector import fit, scan
from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.cli.main import main
from inspector._internal.common.filenames import CONFIG_NAME
from inspector._internal.serve.fit import ACTIVATION_TOKENS, FIXED_OVERHEAD
from inspector._internal.serve.gpus import GIB, GPUS
from inspector.errors import InspectorError

GB = 10**9


class Models(dict):
    """The models of `tests/sparse_checkpoints.py`, each written and scanned on first use."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, name: str) -> ScannedCheckpoint:
        self[name] = scan(write_model(self.root / name, name))
        return self[name]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    return Models(tmp_path_factory.mktemp("serving"))


def run_cli(argv: list[str]) -> tuple[int, str]:
    """The CLI in this process: (exit code, stdout and stderr)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 2
    return code, out.getvalue()


def plans_of(result) -> dict[tuple[int, int], object]:
    return {(p.tp, p.ep): p for p in result.plans}


def codes(plan) -> list[str]:
    return [f.code for f in plan.findings]


def fp8(rows: int, cols: int) -> int:
    """Bytes of a block-FP8 linear: 1 byte a value, an F32 scale per 128 x 128 tile."""
    return rows * cols + math.ceil(rows / 128) * math.ceil(cols / 128) * 4


def bf16(rows: int, cols: int) -> int:
    return rows * cols * 2


# -- DeepSeek-V3 --------------------------------------------------------------------------------

H_DS, V_DS = 7168, 129280


def deepseek_layers(tp: int) -> tuple[int, int, int, int]:
    """(attention, dense MLP, MoE block, MTP extras) per GPU at TP `tp`, EP 1."""
    attention = (
        fp8(1536, H_DS)  # q_a_proj: vLLM builds it as ReplicatedLinear, whole on every rank
        + 1536 * 2
        + fp8(128 * 192, 1536) // tp  # q_b_proj, split by heads
        + fp8(576, H_DS)  # kv_a_proj_with_mqa: replicated too
        + 512 * 2
        + fp8(128 * 256, 512) // tp  # kv_b_proj
        + fp8(H_DS, 128 * 128) // tp  # o_proj, row-parallel
        + 2 * H_DS * 2  # the layer's two norms
    )
    dense = 3 * (fp8(18432, H_DS) // tp)
    # The router and its bias whole; 256 experts and the shared one split 8 ways.
    moe = 256 * H_DS * 2 + 256 * 4 + 257 * 3 * (fp8(2048, H_DS) // tp)
    vocab = V_DS // tp * H_DS * 2  # 129,280 rows: a multiple of 64, no padding
    mtp = vocab + 3 * H_DS * 2 + bf16(H_DS, 2 * H_DS) + vocab  # embed, 3 norms, eh_proj, head
    return attention, dense, moe, mtp


def test_deepseek_v3_matrix_and_bytes_per_gpu(models) -> None:
    result = fit(models["deepseek_v3"], gpu="H200")
    plans = plans_of(result)
    # 18,432 / 32 = 576 and 2,048 / 32 = 64 are not multiples of the 128 block (SGLang #3345);
    # every other plan of the matrix starts.
    assert {
        k
        for k, p in plans.items()
        if not any(f.severity == "error" and f.code.startswith("parallel") for f in p.findings)
    } == {(1, 1), (2, 1), (2, 2), (4, 1), (4, 4), (8, 1), (8, 8), (16, 1), (16, 16)}
    assert codes(plans[(32, 1)]) == ["parallel-block-misaligned"] * 3
    assert "576 per rank" in plans[(32, 1)].findings[0].message
    assert codes(plans[(32, 32)]) == ["parallel-block-misaligned"] * 2  # EP keeps experts whole
    attention, dense, moe, mtp = deepseek_layers(8)
    expected = 2 * (V_DS // 8 * H_DS * 2) + H_DS * 2 + 3 * (attention + dense)
    expected += 58 * (attention + moe) + (attention + moe + mtp)
    assert plans[(8, 1)].weights_bytes_per_rank == expected == 87_264_518_336
    # MLA: (512 + 64) x 2 bytes per layer on every rank, 61 layers and the MTP layer.
    assert plans[(8, 1)].kv_bytes_per_token_per_rank == 62 * 576 * 2
    # On 8 x H200 the whole 163,840-token context fits; on fewer GPUs the weights do not.
    assert plans[(8, 1)].feasible and plans[(8, 1)].max_context_tokens == 163_840
    assert codes(plans[(4, 4)]) == ["fit-weights-exceed-gpu"]


def test_deepseek_v3_pipeline_puts_the_mtp_layer_last(models) -> None:
    (plan,) = fit(models["deepseek_v3"], tp=8, pp=2).plans
    attention, dense, moe, mtp = deepseek_layers(8)
    vocab = V_DS // 8 * H_DS * 2
    # get_pp_indices: 61 layers over 2 stages is 31 + 30 (the remainder before the last).
    first = vocab + 3 * (attention + dense) + 28 * (attention + moe)
    last = 30 * (attention + moe) + (attention + moe + mtp) + vocab + H_DS * 2
    assert plan.stage_weights == (first, last)
    assert plan.kv is not None and [c.per_token for c in plan.kv] == [31 * 576 * 2] * 2
    assert codes(plan) == ["parallel-mtp-last-stage"]


# -- Qwen3-30B-A3B-FP8 ---------------------------------------------------------------------------


def test_qwen3_30b_a3b_fp8_needs_expert_parallelism_past_tp2(models) -> None:
    plans = plans_of(fit(models["qwen3_30b_a3b_fp8"]))
    # 768 / 4 = 192 and 768 / 8 = 96 are not multiples of 128 (Fp8MoEMethod: block_n); with
    # EP = TP each expert stays whole (768 = 6 x 128).
    assert {k for k, p in plans.items() if p.feasible} == {
        (1, 1),
        (2, 1),
        (2, 2),
        (4, 4),
        (8, 8),
        (16, 16),
        (32, 32),
    }
    assert "96 per rank" in plans[(8, 1)].findings[-1].message
    assert codes(plans[(8, 1)]) == ["parallel-kv-heads-replicated", "parallel-block-misaligned"]
    assert codes(plans[(8, 8)]) == ["parallel-kv-heads-replicated"]
    h = 2048
    vocab = 151936 // 8 * h * 2  # 2,374 x 64 rows
    attention = (
        fp8(4096, h) // 8  # q_proj
        + 2 * (fp8(512, h) // 4)  # k_proj, v_proj: 4 KV heads at TP 8, one whole head each
        + fp8(h, 4096) // 8  # o_proj
        + 2 * 128 * 2  # q_norm, k_norm
        + 2 * h * 2
    )
    experts = 128 // 8 * 3 * fp8(768, h)  # 16 whole experts per GPU
    expected = 2 * vocab + h * 2 + 48 * (attention + 128 * h * 2 + experts)
    assert plans[(8, 8)].weights_bytes_per_rank == expected
    # 4 KV heads: at TP 8 each rank caches one, 48 layers x 2 x 128 x 2 bytes.
    assert plans[(8, 8)].kv_bytes_per_token_per_rank == 48 * 2 * 1 * 128 * 2


# -- Llama-3-70B -----------------------------------------------------------------------------------

H_LL, V_LL, I_LL = 8192, 128256, 28672


def llama_layer(tp: int) -> int:
    kv_share = min(tp, 8)  # 8 KV heads: past TP 8 each rank holds one head
    return (
        2 * bf16(8192, H_LL) // tp  # q, o
        + 2 * bf16(1024, H_LL) // kv_share  # k, v
        + 3 * bf16(I_LL, H_LL) // tp
        + 2 * H_LL * 2
    )


def test_llama3_70b_bytes_kv_and_the_longest_context(models) -> None:
    plans = plans_of(fit(models["llama3_70b"], gpu="A100-80GB", context=131072))
    assert all(p.feasible or codes(p) for p in plans.values())
    vocab = V_LL // 8 * H_LL * 2
    assert plans[(8, 1)].weights_bytes_per_rank == 2 * vocab + H_LL * 2 + 80 * llama_layer(8)
    assert plans[(16, 1)].weights_bytes_per_rank == (
        2 * (V_LL // 16 * H_LL * 2) + H_LL * 2 + 80 * llama_layer(16)
    )
    assert codes(plans[(16, 1)])[0] == "parallel-kv-heads-replicated"
    assert plans[(8, 1)].kv_bytes_per_token_per_rank == 80 * 2 * 1 * 128 * 2
    assert plans[(16, 1)].kv_bytes_per_token_per_rank == 80 * 2 * 1 * 128 * 2
    # TP 2 on A100-80GB: what is left after weights and the estimate holds fewer than the
    # 131,072 tokens asked, 163,840 bytes each.
    tp2 = plans[(2, 1)]
    weights = 2 * (V_LL // 2 * H_LL * 2) + H_LL * 2 + 80 * llama_layer(2)
    budget = int(80 * GIB * 0.9)
    overhead = FIXED_OVERHEAD + ACTIVATION_TOKENS * (4 * H_LL + 2 * I_LL // 2) * 2
    longest = (budget - weights - overhead) // (80 * 2 * 4 * 128 * 2)
    assert tp2.weights_bytes_per_rank == weights
    assert tp2.max_context_tokens == longest and 0 < longest < 131072
    assert codes(tp2) == ["fit-context-exceeds-gpu"]
    assert f"--max-model-len {longest}" in tp2.findings[0].message
    assert codes(plans[(1, 1)]) == ["fit-weights-exceed-gpu"]


def test_llama3_70b_pipeline_stages_follow_get_pp_indices(models) -> None:
    (plan,) = fit(models["llama3_70b"], tp=8, pp=3).plans
    vocab = V_LL // 8 * H_LL * 2
    # 80 layers over 3 stages: 26 each and the 2 left over to the stages before the last.
    assert plan.stage_weights == (
        vocab + 27 * llama_layer(8),
        27 * llama_layer(8),
        26 * llama_layer(8) + H_LL * 2 + vocab,
    )


# -- gpt-oss-120b ----------------------------------------------------------------------------------


def test_gpt_oss_120b_mxfp4_blocks_and_sliding_window(models) -> None:
    result = fit(models["gpt_oss_120b"], gpu_memory=12, context=1_000_000)
    plans = plans_of(result)
    # MXFP4 never refuses a TP (both engines pad the last rank): only memory does.
    refused = {f.code for p in plans.values() for f in p.findings if f.severity == "error"}
    assert refused == {"fit-weights-exceed-gpu", "fit-context-exceeds-gpu"}
    assert codes(plans[(4, 1)]) == ["fit-weights-exceed-gpu"]
    h, vocab = 2880, 201088
    # 2,880 / 32 = 90 MXFP4 blocks over 8 ranks: the loaders cut ceil(90 / 8) = 12 blocks
    # per rank (the last holds 6), so the fullest GPU holds 12 / 90 of each expert tensor.
    experts = 128 * (5760 * 12 * 16 + 5760 * 12 + 768 * 2 + 2880 * 12 * 16 + 2880 * 12)
    experts += 128 * 2880 * 2  # down_proj_bias: whole on every rank
    attention = (
        bf16(4096, h) // 8
        + 4096 * 2 // 8  # q_proj and its bias
        + 2 * (bf16(512, h) // 8 + 512 * 2 // 8)  # k, v: 8 KV heads, one per rank
        + bf16(h, 4096) // 8
        + h * 2  # o_proj; its bias whole (added after the reduction)
        + 64 * 2 // 8  # sinks, one per head
    )
    layer = attention + bf16(128, h) + 128 * 2 + experts + 2 * h * 2
    tp8 = plans[(8, 1)]
    assert tp8.weights_bytes_per_rank == 2 * (vocab // 8 * h * 2) + h * 2 + 36 * layer
    # 18 full layers past the window; 18 sliding ones only within their 128 tokens.
    assert tp8.kv is not None and tp8.kv[0].per_token == 18 * 2 * 64 * 2
    assert tp8.kv[0].windows == ((128, 18 * 2 * 64 * 2),)
    free = int(12 * GIB * 0.9) - tp8.weights_bytes_per_rank - tp8.overhead_bytes
    assert tp8.max_context_tokens == (free - 128 * 4608) // 4608
    assert codes(tp8) == ["fit-context-exceeds-gpu"]


# -- Nemotron-Nano-9B-v2 --------------------------------------------------------------------------


def test_nemotron_h_hybrid_heads_groups_and_state(models) -> None:
    plans = plans_of(fit(models["nemotron_nano_9b_v2"]))
    assert {k for k, p in plans.items() if p.feasible} == {(1, 1), (2, 1), (4, 1), (8, 1)}
    # 40 attention heads and 8 Mamba groups: TP 16 divides neither (MambaMixer2).
    messages = [f.message for f in plans[(16, 1)].findings]
    assert any("40 attention heads" in m for m in messages)
    assert any("8 Mamba groups" in m for m in messages)
    h = 4480
    mamba = (
        h * 2
        + bf16(2 * 10240 + 2 * 8 * 128 + 128, h) // 8
        + (12288 * 4 * 2 + 12288 * 2) // 8
        + 3 * 128 * 4 // 8
        + 10240 * 2 // 8
        + bf16(h, 10240) // 8
    )
    mlp = h * 2 + 2 * bf16(15680, h) // 8
    attention = h * 2 + 2 * bf16(5120, h) // 8 + 2 * bf16(1024, h) // 8
    blocks = {"M": mamba, "-": mlp, "*": attention}
    expected = 2 * (131072 // 8 * h * 2) + h * 2 + sum(blocks[b] for b in NEMOTRON_PATTERN)
    tp8 = plans[(8, 1)]
    assert tp8.weights_bytes_per_rank == expected
    # 4 attention layers cache KV; 27 Mamba layers hold a state per sequence: the
    # convolution window (3 x (10,240 / 8 + 2 x 1 x 128) x 2 bytes) and the SSM state
    # (128 / 8 x 80 x 128 in float32, mamba_ssm_cache_dtype).
    assert tp8.kv is not None and tp8.kv[0].per_token == 4 * 2 * 1 * 128 * 2
    assert tp8.kv[0].state == 27 * (3 * (1280 + 256) * 2 + 16 * 80 * 128 * 4)


# -- the CLI and its JSON contract ----------------------------------------------------------------


def test_fit_json_is_the_contract_and_the_exit_code_says_if_a_plan_serves(models) -> None:
    folder = str(models["qwen3_30b_a3b_fp8"].path)
    code, out = run_cli(["fit", folder, "--tp", "8", "--gpu", "h100-80gb", "--json"])
    assert code == 1  # TP 8 without EP: the FP8 block refuses it
    data = json.loads(out)
    assert list(data) == ["plans"]
    (plan,) = data["plans"]
    assert list(plan) == [
        "tp",
        "ep",
        "pp",
        "feasible",
        "findings",
        "weights_bytes_per_rank",
        "kv_bytes_per_token_per_rank",
        "max_context_tokens",
        "gpu",
    ]
    assert plan["gpu"] == "H100-80GB" and plan["feasible"] is False
    assert {f["code"] for f in plan["findings"]} == {
        "parallel-kv-heads-replicated",
        "parallel-block-misaligned",
    }
    assert all(list(f) == ["code", "message"] for f in plan["findings"])
    code, out = run_cli(["fit", folder, "--tp", "8", "--ep", "8", "--gpu", "H100-80GB"])
    assert code == 0 and "TP 8 x EP 8 x PP 1" in out and "yes" in out


def test_fit_options_the_engines_cannot_take_are_one_line(models) -> None:
    folder = str(models["llama3_70b"].path)
    code, out = run_cli(["fit", folder, "--tp", "8", "--ep", "3"])
    assert code == 2 and "ep 3 must divide tp 8" in out and "Traceback" not in out
    code, out = run_cli(["fit", folder, "--gpu", "TPU-v9"])
    assert code == 2 and "not a known GPU" in out
    with pytest.raises(InspectorError, match="kv_dtype"):
        fit(models["llama3_70b"], kv_dtype="int3")
    with pytest.raises(InspectorError, match="tp"):
        fit(models["llama3_70b"], tp=0)


def test_the_catalogue_cites_every_figure() -> None:
    assert {"A100-80GB", "H100-80GB", "H200", "B200", "L40S"} <= set(GPUS)
    for gpu in GPUS.values():
        assert gpu.source.startswith("https://") and gpu.memory_gib > 0
        assert gpu.compute_capability.replace(".", "").isdigit()


def test_the_table_the_report_and_the_dashboard_draw(models) -> None:
    frame = fit(models["gpt_oss_120b"], gpu="H100-80GB").frame()
    assert list(frame.columns[:6]) == ["plan", "tp", "ep", "pp", "gpus", "feasible"]
    assert len(frame) == 11 and frame["budget_bytes"].iat[0] == int(80 * GIB * 0.9)


# -- the report, the Markdown summary and the dashboard's Serve tab ---------------------------


def test_the_html_report_and_the_markdown_summary_say_whether_it_serves(models) -> None:
    pytest.importorskip("plotly")
    from inspector.widgets.report import render_html_report

    from inspector._internal.report.markdown import markdown_summary

    scanned = models["qwen3_30b_a3b_fp8"]
    page = render_html_report(scanned, [], figures="cdn")
    section = page.split("<section id='serving'>", 1)[1].split("</section>", 1)[0]
    assert "Will it serve?" in section and "serving-plans-figure" in section
    assert "TP 8 x EP 8 x PP 1" in section and "parallel-block-misaligned" in section
    summary = markdown_summary(scanned, [], serving=fit(scanned, gpu="H100-80GB"))
    assert "**Will it serve?** 11 parallel plans on H100-80GB" in summary
    assert "| TP 8 x EP 1 x PP 1 | 8 | no |" in summary
    assert "- `parallel-block-misaligned`, e.g.: the MoE intermediate size 768" in summary


@pytest.mark.usefixtures("dashboards_closed")
def test_the_serve_tab_calls_fit_and_follows_the_gpu_picked(demo_checkpoints) -> None:
    pytest.importorskip("ipywidgets")
    from inspector.widgets import Dashboard

    dash = Dashboard(
        demo_checkpoints / "healthy-hf-sharded", model=False, progress=False, snapshot=False
    )
    panel = dash.select("Serve")
    assert "parallel plans that serve (pick a GPU" in panel.status.value
    assert "TP 2 x EP 2 x PP 1" in panel.table.value
    assert "ckpt-serve" in panel.plot.children[0]._dom_classes
    panel.gpu.value = "H100-80GB"
    assert "on H100-80GB: 2 of 11" in panel.status.value
    assert panel.result is not None and panel.result.gpu == "H100-80GB"
    panel.kv_dtype.value = "fp8"
    assert panel.result.kv_dtype == "fp8"


# -- hostile config.json: a finding, never a traceback ---------------------------------------------

HOSTILE = {
    "zero heads": {"num_attention_heads": 0},
    "negative KV heads": {"num_key_value_heads": -4},
    "10^18 layers": {"num_hidden_layers": 10**18},
    # before: an internal error sizing an array of -3 layers (and -2^70: an OverflowError)
    "negative layers": {"num_hidden_layers": -3},
    "-2^70 layers": {"num_hidden_layers": -(2**70)},
    "a string size": {"hidden_size": "4096", "head_dim": "64"},
    "a bool head size": {"head_dim": True},
    "a float size": {"intermediate_size": 1.5, "max_position_embeddings": 1e300},
    "huge heads": {"num_attention_heads": 2**70, "num_key_value_heads": 2**70},
    "window past any model": {"sliding_window": 10**30, "layer_types": ["sliding_attention"] * 2},
    "nested layer types": {"layer_types": [["full_attention"], {"a": 1}]},
    "MLA without rope": {"kv_lora_rank": 512, "qk_rope_head_dim": "64"},
    "half a Mamba": {"mamba_num_heads": 8},
    "Mamba groups zero": {
        "mamba_num_heads": 8,
        "mamba_head_dim": 4,
        "ssm_state_size": 4,
        "n_groups": 0,
        "conv_kernel": 4,
    },
    "a 20M-block pattern": {"hybrid_override_pattern": "M*" * 10_000_000},
    "FP8 block of zero": {
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [0, 128]}
    },
    "config groups not a mapping": {
        "quantization_config": {"quant_method": "compressed-tensors", "config_groups": [1, 2]}
    },
    "experts past any model": {"num_local_experts": 10**9},
    "text config a string": {"text_config": "x", "vocab_size": -1},
}


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two Llama-named layers written by safetensors' own writer, and their config."""
    from safetensors.numpy import save_file

    folder = tmp_path_factory.mktemp("small")
    state = {"model.embed_tokens.weight": np.zeros((64, 16), np.float16)}
    for layer in range(2):
        p = f"model.layers.{layer}"
        for proj, rows in (("q_proj", 16), ("k_proj", 8), ("v_proj", 8), ("o_proj", 16)):
            state[f"{p}.self_attn.{proj}.weight"] = np.zeros((rows, 16), np.float16)
        state[f"{p}.mlp.down_proj.weight"] = np.zeros((16, 32), np.float16)
    save_file(state, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("edit", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_hostile_config_is_a_finding_never_a_traceback(small: Path, tmp_path: Path, edit) -> None:
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "model.safetensors").symlink_to(small / "model.safetensors")
    config = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 16,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 64,
        "max_position_embeddings": 4096,
    }
    (folder / CONFIG_NAME).write_text(json.dumps({**config, **edit}))
    scanned = scan(folder)
    for options in ({}, {"tp": 4, "pp": 2, "gpu_memory": 80, "context": 2**40}):
        result = fit(scanned, **options)
        json.dumps(result.to_dict())  # the JSON contract holds whatever the config says
        result.frame()
        for plan in result.plans:
            for f in plan.findings:
                assert f.message.isprintable() and len(f.message) <= 2_000
    found = {f.code for p in fit(scanned).plans for f in p.findings}
    # What the engines would not read either is left out without a word: an expert count
    # past any real model's (the structure checks say it), a config_groups that is no mapping.
    silent = edit in (HOSTILE["experts past any model"], HOSTILE["config groups not a mapping"])
    assert ("fit-config-invalid" in found) != silent, found
