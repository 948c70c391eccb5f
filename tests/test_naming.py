"""Tensor naming: every family of docs/formats.md ("Tensor names"), table-driven."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from work_count import calls

from inspector._internal.checkpoint.naming import KINDS, parse_name, parse_names


def _c(
    layer: int | None,
    expert: int | None,
    module: str,
    param: str,
    kind: str,
    family: str,
    flags: str = "",
) -> tuple:
    """Expected fields; flags: f = fused, m = mtp, s = stacked."""
    return (layer, expert, module, param, kind, family, "f" in flags, "m" in flags, "s" in flags)


# name -> expected fields
CASES = {
    # HF MoE: Qwen2/3-MoE, DeepSeek-V2/V3, Kimi, GLM-MoE
    "model.layers.3.mlp.experts.17.down_proj.weight": _c(
        3, 17, "mlp.experts.down_proj", "weight", "expert", "hf-moe"
    ),
    "model.layers.12.mlp.experts.255.gate_proj.weight_scale_inv": _c(
        12, 255, "mlp.experts.gate_proj", "weight_scale_inv", "expert", "hf-moe"
    ),
    "model.layers.1.mlp.experts.3.up_proj.weight_scale_2": _c(
        1, 3, "mlp.experts.up_proj", "weight_scale_2", "expert", "hf-moe"
    ),
    "model.layers.1.mlp.experts.3.up_proj.input_scale": _c(
        1, 3, "mlp.experts.up_proj", "input_scale", "expert", "hf-moe"
    ),
    "model.layers.4.mlp.gate.weight": _c(4, None, "mlp.gate", "weight", "router", "hf-moe"),
    "model.layers.4.mlp.gate.e_score_correction_bias": _c(
        4, None, "mlp.gate", "e_score_correction_bias", "router", "hf-moe"
    ),
    "model.layers.4.mlp.shared_experts.down_proj.weight": _c(
        4, None, "mlp.shared_experts.down_proj", "weight", "shared_expert", "hf-moe"
    ),
    "model.layers.4.mlp.shared_expert.up_proj.weight": _c(
        4, None, "mlp.shared_expert.up_proj", "weight", "shared_expert", "hf-moe"
    ),
    "model.layers.4.mlp.shared_expert_gate.weight": _c(
        4, None, "mlp.shared_expert_gate", "weight", "shared_expert", "hf-moe"
    ),
    "model.layers.0.mlp.gate_proj.weight": _c(
        0, None, "mlp.gate_proj", "weight", "dense_mlp", "hf"
    ),
    "model.layers.0.self_attn.q_proj.weight": _c(
        0, None, "self_attn.q_proj", "weight", "attention", "hf"
    ),
    "model.layers.0.self_attn.kv_a_layernorm.weight": _c(
        0, None, "self_attn.kv_a_layernorm", "weight", "attention", "hf"
    ),
    "model.layers.0.self_attn.k_proj.k_scale": _c(
        0, None, "self_attn.k_proj", "k_scale", "attention", "hf"
    ),
    "model.layers.0.self_attn.v_scale": _c(0, None, "self_attn", "v_scale", "attention", "hf"),
    "model.layers.2.self_attn.q_proj.weight_quantizer._amax": _c(
        2, None, "self_attn.q_proj", "weight_quantizer._amax", "attention", "hf"
    ),
    "model.layers.0.input_layernorm.weight": _c(0, None, "input_layernorm", "weight", "norm", "hf"),
    "model.embed_tokens.weight": _c(None, None, "model.embed_tokens", "weight", "embedding", "hf"),
    "model.norm.weight": _c(None, None, "model.norm", "weight", "norm", "hf"),
    "lm_head.weight": _c(None, None, "lm_head", "weight", "output_head", "hf"),
    # multimodal text model and a vision tower (whose blocks are not decoder layers)
    "model.language_model.layers.7.mlp.experts.2.up_proj.weight": _c(
        7, 2, "mlp.experts.up_proj", "weight", "expert", "hf-moe"
    ),
    "model.visual.blocks.3.mlp.fc1.weight": _c(
        None, None, "model.visual.blocks.3.mlp.fc1", "weight", "other", "vision"
    ),
    # Mixtral
    "model.layers.0.block_sparse_moe.experts.2.w3.weight": _c(
        0, 2, "block_sparse_moe.experts.w3", "weight", "expert", "mixtral"
    ),
    "model.layers.31.block_sparse_moe.gate.weight": _c(
        31, None, "block_sparse_moe.gate", "weight", "router", "mixtral"
    ),
    # Nemotron-H
    "backbone.layers.1.mixer.experts.5.up_proj.weight": _c(
        1, 5, "mixer.experts.up_proj", "weight", "expert", "nemotron-h"
    ),
    "backbone.layers.1.mixer.shared_experts.down_proj.weight": _c(
        1, None, "mixer.shared_experts.down_proj", "weight", "shared_expert", "nemotron-h"
    ),
    "backbone.layers.1.mixer.gate.e_score_correction_bias": _c(
        1, None, "mixer.gate", "e_score_correction_bias", "router", "nemotron-h"
    ),
    "backbone.layers.0.mixer.A_log": _c(0, None, "mixer", "A_log", "mamba", "nemotron-h"),
    "backbone.layers.0.mixer.D": _c(0, None, "mixer", "D", "mamba", "nemotron-h"),
    "backbone.layers.0.mixer.conv1d.bias": _c(
        0, None, "mixer.conv1d", "bias", "mamba", "nemotron-h"
    ),
    "backbone.layers.0.mixer.norm.weight": _c(
        0, None, "mixer.norm", "weight", "mamba", "nemotron-h"
    ),
    "backbone.layers.2.mixer.q_proj.weight": _c(
        2, None, "mixer.q_proj", "weight", "attention", "nemotron-h"
    ),
    "backbone.layers.3.mixer.up_proj.weight": _c(
        3, None, "mixer.up_proj", "weight", "dense_mlp", "nemotron-h"
    ),
    "backbone.layers.3.norm.weight": _c(3, None, "norm", "weight", "norm", "nemotron-h"),
    "backbone.embeddings.weight": _c(
        None, None, "backbone.embeddings", "weight", "embedding", "nemotron-h"
    ),
    "backbone.norm_f.weight": _c(None, None, "backbone.norm_f", "weight", "norm", "nemotron-h"),
    # Fused 3-D experts: GPT-OSS (with MXFP4 blocks/scales) and Llama 4
    "model.layers.5.mlp.experts.gate_up_proj": _c(
        5, None, "mlp.experts.gate_up_proj", "weight", "expert", "fused-experts", "f"
    ),
    "model.layers.5.mlp.experts.gate_up_proj_blocks": _c(
        5, None, "mlp.experts.gate_up_proj", "blocks", "expert", "fused-experts", "f"
    ),
    "model.layers.5.mlp.experts.down_proj_scales": _c(
        5, None, "mlp.experts.down_proj", "scales", "expert", "fused-experts", "f"
    ),
    "model.layers.5.mlp.experts.down_proj_bias": _c(
        5, None, "mlp.experts.down_proj", "bias", "expert", "fused-experts", "f"
    ),
    "model.layers.5.mlp.router.weight": _c(5, None, "mlp.router", "weight", "router", "hf-moe"),
    "model.layers.1.feed_forward.experts.gate_up_proj": _c(
        1, None, "feed_forward.experts.gate_up_proj", "weight", "expert", "fused-experts", "f"
    ),
    "model.layers.1.feed_forward.shared_expert.gate_proj.weight": _c(
        1, None, "feed_forward.shared_expert.gate_proj", "weight", "shared_expert", "hf-moe"
    ),
    # Megatron in memory: SequentialMLP and TEGroupedMLP
    "decoder.layers.4.mlp.experts.local_experts.12.linear_fc2.weight": _c(
        4, 12, "mlp.experts.local_experts.linear_fc2", "weight", "expert", "megatron"
    ),
    "decoder.layers.2.mlp.experts.linear_fc1.weight7": _c(
        2, 7, "mlp.experts.linear_fc1", "weight", "expert", "megatron"
    ),
    "decoder.layers.2.mlp.router.weight": _c(2, None, "mlp.router", "weight", "router", "megatron"),
    "decoder.layers.2.self_attention.linear_qkv.layer_norm_weight": _c(
        2, None, "self_attention.linear_qkv", "layer_norm_weight", "attention", "megatron"
    ),
    "decoder.layers.2.mlp.linear_fc1.weight": _c(
        2, None, "mlp.linear_fc1", "weight", "dense_mlp", "megatron"
    ),
    "decoder.layers.2.pre_mlp_layernorm.weight": _c(
        2, None, "pre_mlp_layernorm", "weight", "norm", "megatron"
    ),
    "decoder.layers.0.mixer.in_proj.weight": _c(
        0, None, "mixer.in_proj", "weight", "mamba", "megatron"
    ),
    "embedding.word_embeddings.weight": _c(
        None, None, "embedding.word_embeddings", "weight", "embedding", "megatron"
    ),
    "output_layer.weight": _c(None, None, "output_layer", "weight", "output_head", "megatron"),
    "decoder.final_layernorm.weight": _c(
        None, None, "decoder.final_layernorm", "weight", "norm", "megatron"
    ),
    # Megatron torch_dist: stacked layers, stacked experts
    "decoder.layers.self_attention.linear_qkv.weight": _c(
        None, None, "self_attention.linear_qkv", "weight", "attention", "megatron-stacked", "s"
    ),
    "decoder.layers.mlp.experts.experts.linear_fc1.weight": _c(
        None, None, "mlp.experts.experts.linear_fc1", "weight", "expert", "megatron-stacked", "fs"
    ),
    "decoder.layers.self_attention.core_attention._extra_state": _c(
        None,
        None,
        "self_attention.core_attention",
        "_extra_state",
        "attention",
        "megatron-stacked",
        "s",
    ),
    # MTP, three spellings (the DeepSeek one is only known to be MTP by the tables)
    "mtp.layers.0.transformer_layer.self_attention.core_attention._extra_state": _c(
        0, None, "self_attention.core_attention", "_extra_state", "attention", "mtp", "m"
    ),
    "mtp.layers.1.mtp_model_layer.mixer.experts.3.up_proj.weight": _c(
        1, 3, "mixer.experts.up_proj", "weight", "expert", "mtp", "m"
    ),
    "mtp.layers.0.enorm.weight": _c(0, None, "enorm", "weight", "mtp", "mtp", "m"),
    "mtp.layers.0.eh_proj.weight": _c(0, None, "eh_proj", "weight", "mtp", "mtp", "m"),
    "mtp.layers.0.final_layernorm.weight": _c(
        0, None, "final_layernorm", "weight", "mtp", "mtp", "m"
    ),
    "mtp.fc.weight": _c(None, None, "mtp.fc", "weight", "mtp", "mtp", "m"),
    "model.mtp.norm.weight": _c(None, None, "model.mtp.norm", "weight", "mtp", "mtp", "m"),
    "mtp.layers.0.mlp.experts.9.gate_proj.weight": _c(
        0, 9, "mlp.experts.gate_proj", "weight", "expert", "mtp", "m"
    ),
    "model.layers.61.enorm.weight": _c(61, None, "enorm", "weight", "mtp", "hf"),
    "model.layers.61.shared_head.head.weight": _c(
        61, None, "shared_head.head", "weight", "mtp", "hf"
    ),
    # Unknown schemes still get an obvious layer number
    "transformer.h.11.attn.c_attn.weight": _c(
        11, None, "attn.c_attn", "weight", "attention", "other"
    ),
    "encoder.layer.5.output.dense.weight": _c(5, None, "output.dense", "weight", "other", "other"),
    "net.blocks.2.ff.weight": _c(2, None, "ff", "weight", "other", "other"),
    # Numbers that are neither layer nor expert stay in the module
    "foo.7.bar.9.weight": _c(None, None, "foo.7.bar.9", "weight", "other", "other"),
    "weight": _c(None, None, "", "weight", "other", "other"),
}

FIELDS = ("layer", "expert", "module", "param", "kind", "family", "fused", "mtp", "stacked")


@pytest.mark.parametrize("name", list(CASES))
def test_parse_name(name: str) -> None:
    parsed = parse_name(name)
    assert tuple(getattr(parsed, f) for f in FIELDS) == CASES[name]
    assert parsed.kind in KINDS


def test_bulk_matches_single_and_keeps_order() -> None:
    names = list(CASES) * 3
    bulk = parse_names(names)
    assert len(bulk) == len(names)
    for i, name in enumerate(names):
        assert tuple(getattr(bulk.row(i), f) for f in FIELDS) == CASES[name], name


def test_numbers_cut_out_per_name_within_one_template() -> None:
    # One digit-masked group with different word digits (w1/w3) and different numbers.
    names = [f"model.layers.{layer}.block_sparse_moe.experts.{e}.w{w}.weight"
             for layer in (7, 3) for e in (5, 0, 9) for w in (3, 1)]  # fmt: skip
    columns = parse_names(names)
    got = [
        (int(columns.layer[i]), int(columns.expert[i]), str(columns.module[i]))
        for i in range(len(names))
    ]
    want = [
        (layer, e, f"block_sparse_moe.experts.w{w}")
        for layer in (7, 3)
        for e in (5, 0, 9)
        for w in (3, 1)
    ]
    assert got == want


def test_hostile_and_odd_names_do_not_crash() -> None:
    names = [
        "",
        "a#b.layers.3.mlp.up_proj.weight",
        "x\ny.layers.2.self_attn.q_proj.weight",
        "décodeur.layers.4.mlp.linear_fc2.weight",
        "model.layers.99999999999999999999.mlp.up_proj.weight",
        "model.layers.0123.mlp.up_proj.weight",
        "." * 50,
        "model.layers..mlp",
    ]
    columns = parse_names(names)
    assert len(columns) == len(names)
    layers = [columns.row(i).layer for i in range(len(names))]
    # '#' and newline are only masked for parsing; the layer is still found.
    assert layers[:4] == [None, 3, 2, 4]
    # A 20-digit component is not a layer number (it would overflow); leading zeros are fine.
    assert layers[4] is None and layers[5] == 123
    assert columns.row(4).module == "model.layers.99999999999999999999.mlp.up_proj"
    assert columns.row(2).kind == "attention"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 10**9 - 1),
            st.integers(0, 10**9 - 1),
            st.sampled_from(["w1", "w2", "w3"]),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_numbers_round_trip(triples: list[tuple[int, int, str]]) -> None:
    names = [f"model.layers.{a}.block_sparse_moe.experts.{b}.{w}.weight" for a, b, w in triples]
    columns = parse_names(names)
    assert columns.layer.tolist() == [a for a, _, _ in triples]
    assert columns.expert.tolist() == [b for _, b, _ in triples]
    assert [str(m) for m in columns.module] == [
        f"block_sparse_moe.experts.{w}" for _, _, w in triples
    ]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["model.layers.", "a.", "", "x#.", "\u00e9.", "b\n."]),
            st.integers(0, 120),
            st.sampled_from(
                ["weight", "weight_scale_2", "w1", "7", "l\u00e9af3", "#2", "x\ny", ""]
            ),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_leaves_are_each_names_last_component(parts: list[tuple[str, int, str]]) -> None:
    """`leaf` is taken once per group of names where it can be: it is always what splitting
    each name at its last dot gives, digits, `#`, newlines and non-ASCII included."""
    names = [f"{head}{number}.{leaf}" for head, number, leaf in parts]
    leaf = parse_names(names).leaf
    assert leaf.tolist() == [name.rpartition(".")[2] for name in names]
    assert len(set(leaf.values)) == len(leaf.values)


def test_empty_input() -> None:
    columns = parse_names([])
    assert len(columns) == 0 and len(columns.module) == 0


def _deepseek_names(experts: int) -> list[str]:
    names = [
        f"model.layers.{layer}.mlp.experts.{e}.{proj}.{param}"
        for layer in range(61)
        for e in range(experts)
        for proj in ("gate_proj", "up_proj", "down_proj")
        for param in ("weight", "weight_scale_inv")
    ]
    return names + [f"model.layers.{layer}.self_attn.q_proj.weight" for layer in range(61)]


def test_93k_names_parse_without_a_step_per_name() -> None:
    """Names are parsed template by template, in chunks of `naming._CHUNK`, not one by one:
    the calls made grow far slower than the names (a per-name Python path took about 3 s at
    300k names). Counted, not timed (tests/work_count.py); benchmarks/bench_scan.py times the
    scan, names included."""
    few, many = _deepseek_names(8), _deepseek_names(256)
    _, done_few = calls(lambda: parse_names(few))
    columns, done = calls(lambda: parse_names(many))
    assert len(many) > 90_000
    assert int(columns.layer[-1]) == 60 and int(columns.expert[-62]) == 255
    # Less than one call more per ten names more (about one per 80 here, a few hundred per
    # chunk); a step per name makes at least one per name.
    assert done - done_few < (len(many) - len(few)) / 10, (done, done_few)


def test_chunks_and_hostile_names_parse_like_single_names(monkeypatch) -> None:
    """Names are grouped chunk by chunk; chunk borders, non-ASCII names, `#`, newlines and
    non-string names must not change any result (compared with one name at a time)."""
    import inspector._internal.checkpoint.naming as naming

    names = [
        "model.layers.3.mlp.experts.17.down_proj.weight",
        "model.layers.3.mlp.experts.1\n7.w1.weight",
        "model.layers.#.self_attn.q_proj.weight",
        "model.layers.4.mlp.experts.2.down_proj.weight",
        "model.layers.é5.mlp.gate.weight",
        "decoder.layers.12.mlp.linear_fc2.weight",
        "model.layers.4.mlp.experts.9.w3.weight",
        "model.layers.7.mlp.experts.9.w1.weight",
    ]
    expected = [parse_name(x) for x in names]
    monkeypatch.setattr(naming, "_CHUNK", 3)
    columns = parse_names(names)
    assert [columns.row(i, x) for i, x in enumerate(names)] == expected
    assert names[1] == "model.layers.3.mlp.experts.1\n7.w1.weight"  # input left alone
    assert expected[0].expert == 17 and expected[6].module == "mlp.experts.w3"
    odd = parse_names([5, "model.layers.2.self_attn.o_proj.weight"])  # type: ignore[list-item]
    assert odd.row(0).param == "5" and odd.row(1).layer == 2
