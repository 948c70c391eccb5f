"""Write GGUF files with the REAL writer, `gguf.GGUFWriter` (the `gguf` package that llama.cpp
maintains), single and split, healthy and damaged the way users find them.

Runs in the main writers' environment (`build/writers-venv`). No shim: the package is numpy
only.

The model is a tiny Qwen3-MoE built by transformers (seed 0; hidden 32, 2 layers, 4 experts of
32, 2 query heads and 1 KV head of 16), converted the way llama.cpp's converter lays a MoE
out: tensor names from gguf's own tables (`gguf.TENSOR_NAMES` for `MODEL_ARCH.QWEN3MOE`), the
experts of a layer stacked into one `ffn_{gate,up,down}_exps` tensor, ggml dimensions innermost
first (a numpy `[E, rows, cols]` array is ne `[cols, rows, E]`). Quantized with `gguf.quants`
on the CPU into several ggml types: F32 (norms, router), F16, BF16, Q8_0, Q5_0, Q4_0, Q4_1 and
MXFP4. K-quants (Q4_K ...) cannot be written here: `gguf.quants` only dequantizes them (their
quantizers are llama.cpp's C code, `llama-quantize`); their block sizes are in
`gguf.GGML_QUANT_SIZES` all the same. The metadata is what llama.cpp reads for the
architecture (`qwen3moe.block_count`, `.expert_count`, `.expert_used_count`, lengths, heads),
plus a small GPT-2-style tokenizer (string and integer arrays).

Cases (`tests/fixtures/writers/gguf/`):
- single: one file, `tiny-qwen3moe-Q4_0.gguf`.
- split: `GGUFWriter(split_max_tensors=10)`: `tiny-qwen3moe-Q4_0-0000{1,2,3}-of-00003.gguf`,
  every part with `split.no` (0-based), `split.count` and `split.tensors.count`; the metadata
  is in the first part only.
- split-part-missing: the split with part 2 deleted (an interrupted download).
- split-tensor-count-mismatch: parts 1-2 of the split with part 3 of a second conversion that
  left out `output.weight` (tied head): the parts hold 26 tensors where part 1's
  `split.tensors.count` says 27.
- truncated-download: the single file cut at 60% of its size: the last tensors' data lies past
  the end of the file.
- expert-count-mismatch: a conversion whose metadata says 8 experts (`qwen3moe.expert_count`)
  for expert tensors that stack 4 (a merge tool writing the target config's count).

The manifest records, for every intact file, what `gguf.GGUFReader` (the package's reader)
finds: version, counts, alignment, data offset, every metadata key with its value type, and
every tensor's name, ggml type, ne, offset and byte size: the facts a header-only reader must
reproduce.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

WRITER = "gguf"
PACKAGE = "gguf"
SCRIPT = "write_gguf.py"
STEM = "tiny-qwen3moe-Q4_0"
LAYERS = 2
EXPERTS = 4
SPLIT_TENSORS = 10


def _model_state() -> tuple[dict[str, Any], Any]:
    import torch
    import transformers

    config = transformers.Qwen3MoeConfig(
        vocab_size=64, hidden_size=32, head_dim=16, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=LAYERS,
        num_experts=EXPERTS, num_experts_per_tok=2, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(config)
    return {n: t.detach().float().numpy() for n, t in model.state_dict().items()}, config


def _experts(state: dict[str, Any], layer: int, proj: str) -> Any:
    """[E, rows, cols] stack of one projection of every expert, whatever way transformers holds
    them (fused `gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I], or one tensor per expert)."""
    import numpy as np

    p = f"model.layers.{layer}.mlp.experts"
    if f"{p}.gate_up_proj" in state:
        fused = state[f"{p}.gate_up_proj"]
        half = fused.shape[1] // 2
        return {"gate": fused[:, :half], "up": fused[:, half:], "down": state[f"{p}.down_proj"]}[
            proj
        ]
    return np.stack([state[f"{p}.{e}.{proj}_proj.weight"] for e in range(EXPERTS)])


def _tensors(state: dict[str, Any], *, with_output: bool = True) -> list[tuple[str, Any, Any]]:
    """[(gguf name, float32 array, ggml type)] in llama.cpp's order."""
    from gguf import MODEL_TENSOR, TENSOR_NAMES
    from gguf import GGMLQuantizationType as Q

    def name(t: MODEL_TENSOR, bid: int | None = None) -> str:
        return TENSOR_NAMES[t].format(bid=bid) + ".weight"

    out = [(name(MODEL_TENSOR.TOKEN_EMBD), state["model.embed_tokens.weight"], Q.Q8_0)]
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        attn = Q.Q8_0 if i == 0 else Q.Q5_0
        out += [
            (name(MODEL_TENSOR.ATTN_NORM, i), state[f"{p}.input_layernorm.weight"], Q.F32),
            (name(MODEL_TENSOR.ATTN_Q, i), state[f"{p}.self_attn.q_proj.weight"], attn),
            (name(MODEL_TENSOR.ATTN_Q_NORM, i), state[f"{p}.self_attn.q_norm.weight"], Q.F32),
            (name(MODEL_TENSOR.ATTN_K, i), state[f"{p}.self_attn.k_proj.weight"], attn),
            (name(MODEL_TENSOR.ATTN_K_NORM, i), state[f"{p}.self_attn.k_norm.weight"], Q.F32),
            (name(MODEL_TENSOR.ATTN_V, i), state[f"{p}.self_attn.v_proj.weight"], attn),
            (
                name(MODEL_TENSOR.ATTN_OUT, i),
                state[f"{p}.self_attn.o_proj.weight"],
                Q.Q8_0 if i == 0 else Q.F16,
            ),
            (name(MODEL_TENSOR.FFN_NORM, i), state[f"{p}.post_attention_layernorm.weight"], Q.F32),
            (name(MODEL_TENSOR.FFN_GATE_INP, i), state[f"{p}.mlp.gate.weight"], Q.F32),
            (name(MODEL_TENSOR.FFN_GATE_EXP, i), _experts(state, i, "gate"), Q.Q4_0),
            (name(MODEL_TENSOR.FFN_DOWN_EXP, i), _experts(state, i, "down"),
             Q.MXFP4 if i == 0 else Q.Q4_1),
            (name(MODEL_TENSOR.FFN_UP_EXP, i), _experts(state, i, "up"), Q.Q4_0),
        ]  # fmt: skip
    out.append((name(MODEL_TENSOR.OUTPUT_NORM), state["model.norm.weight"], Q.F32))
    if with_output:
        out.append((name(MODEL_TENSOR.OUTPUT), state["lm_head.weight"], Q.BF16))
    return out


def _write(
    path: Path,
    state: dict[str, Any],
    config: Any,
    *,
    split_max_tensors: int = 0,
    expert_count: int = EXPERTS,
    with_output: bool = True,
) -> list[Path]:
    """One GGUFWriter run; returns the files written."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(path, "qwen3moe", split_max_tensors=split_max_tensors)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name("tiny qwen3moe")
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(128)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_expert_count(expert_count)
    writer.add_expert_used_count(config.num_experts_per_tok)
    vocab = [f"t{i}" for i in range(config.vocab_size)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(vocab)
    writer.add_token_types([gguf.TokenType.NORMAL] * len(vocab))
    writer.add_token_merges(["t 0", "t 1"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    for name, array, qtype in _tensors(state, with_output=with_output):
        data = gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), qtype)
        if data.dtype == np.uint8 or qtype == gguf.GGMLQuantizationType.BF16:
            writer.add_tensor(name, data, raw_dtype=qtype)
        else:
            writer.add_tensor(name, data)
    files = writer.format_shard_names(path)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return files


def _facts(path: Path) -> dict[str, Any]:
    """What gguf's own reader finds in one intact file."""
    import gguf

    reader = gguf.GGUFReader(path)
    kv: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        types = [t.name for t in field.types]
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            kv[key] = {"type": types, "length": len(field.data)}
        else:
            kv[key] = {"type": types, "value": field.contents()}
    return {
        "version": int(reader.fields["GGUF.version"].parts[0][0]),
        "tensor_count": len(reader.tensors),
        "kv_count": int(reader.fields["GGUF.kv_count"].parts[0][0]),
        "alignment": int(reader.alignment),
        "data_offset": int(reader.data_offset),
        "file_bytes": path.stat().st_size,
        "kv": kv,
        "tensors": [
            {
                "name": t.name,
                "ggml_type": t.tensor_type.name,
                "ne": [int(d) for d in t.shape],
                "offset": int(t.data_offset) - int(reader.data_offset),
                "n_elements": int(t.n_elements),
                "n_bytes": int(t.n_bytes),
            }
            for t in reader.tensors
        ],
    }


def _record(case: str, *, extra: dict[str, Any] | None = None, **case_args: Any) -> None:
    """The manifest entry of a GGUF case, with what gguf's reader finds in its intact files."""
    folder = _common.FIXTURES / WRITER / case
    skip = (extra or {}).get("not_intact", [])
    intact = {p.name: _facts(p) for p in sorted(folder.glob("*.gguf")) if p.name not in skip}
    elements = sum(t["n_elements"] for f in intact.values() for t in f["tensors"])
    facts = {"files": intact, "elements_in_intact_files": elements}
    _common.record_expected(
        WRITER, case, package=PACKAGE, script=SCRIPT, fmt="gguf",
        extra=facts | (extra or {}), **case_args,
    )  # fmt: skip


def main() -> None:
    import gguf

    state, config = _model_state()
    params = int(sum(a.size for a in state.values()))
    version = f"gguf {_common.version('gguf')}"

    dest = _common.case_dir(WRITER, "single")
    _write(dest / f"{STEM}.gguf", state, config)
    _record(
        "single",
        description=f"GGUFWriter, one file, types F32/F16/BF16/Q8_0/Q5_0/Q4_0/Q4_1/MXFP4, "
        f"{version}",
        expected=[],
        words="healthy: no error, no warning; the parameters are the tensors' element counts "
        "(ne products), whatever the ggml type",
        extra={"parameters": params},
    )

    dest = _common.case_dir(WRITER, "split")
    parts = _write(dest / f"{STEM}.gguf", state, config, split_max_tensors=SPLIT_TENSORS)
    _record(
        "split",
        description=f"GGUFWriter(split_max_tensors={SPLIT_TENSORS}): {len(parts)} parts, {version}",
        expected=[],
        words="healthy: every part present, split.count = 3 in each, split.no 0-2, and the "
        "parts' tensor counts (10 + 10 + 7) add up to split.tensors.count = 27",
        extra={"parameters": params, "parts": [p.name for p in parts]},
    )

    dest = _common.case_dir(WRITER, "split-part-missing")
    parts = _write(dest / f"{STEM}.gguf", state, config, split_max_tensors=SPLIT_TENSORS)
    parts[1].unlink()
    _record(
        "split-part-missing",
        description="the 3-part split with part 2 deleted",
        damage=f"{parts[1].name} deleted (an interrupted download)",
        expected=["gguf-split-missing"],
        words=f"{parts[1].name} is missing: split.count says 3 parts, 2 are present "
        "(gguf-split-missing); its 10 tensors are absent",
        extra={"parameters": params, "lost": parts[1].name},
    )

    dest = _common.case_dir(WRITER, "split-tensor-count-mismatch")
    parts = _write(dest / f"{STEM}.gguf", state, config, split_max_tensors=SPLIT_TENSORS)
    with tempfile.TemporaryDirectory() as tmp:
        other = _write(
            Path(tmp) / f"{STEM}.gguf",
            state,
            config,
            split_max_tensors=SPLIT_TENSORS,
            with_output=False,
        )
        shutil.copy2(other[2], parts[2])
    _record(
        "split-tensor-count-mismatch",
        description="parts 1-2 of the split with part 3 of a conversion without output.weight",
        damage=f"{parts[2].name} replaced by the same part of a second conversion that left out "
        "output.weight (a tied head): 6 tensors instead of 7, its split.tensors.count 26",
        expected=["gguf-split-tensor-count-mismatch"],
        words="part 1's split.tensors.count is 27, the parts hold 10 + 10 + 6 = 26 tensors "
        "(and part 3 says 26): gguf-split-tensor-count-mismatch. output.weight is absent, which "
        "llama.cpp accepts for this architecture (it falls back to token_embd): nothing else",
        extra={"parameters": params, "replaced": parts[2].name},
    )

    dest = _common.case_dir(WRITER, "truncated-download")
    (path,) = _write(dest / f"{STEM}.gguf", state, config)
    facts = _facts(path)
    full = path.stat().st_size
    cut = int(full * 0.6)
    with open(path, "r+b") as f:
        f.truncate(cut)
    beyond = [
        t["name"]
        for t in facts["tensors"]
        if facts["data_offset"] + t["offset"] + t["n_bytes"] > cut
    ]
    _record(
        "truncated-download",
        description="the single file cut at 60% of its size",
        damage=f"truncated from {full} to {cut} bytes (an interrupted download)",
        expected=["file-truncated"],
        words=f"the header and tensor infos are intact, but {len(beyond)} tensors' data run "
        f"past the end of the {cut}-byte file (file-truncated, naming them): "
        f"{', '.join(beyond)}",
        extra={
            "not_intact": [path.name],
            "before_truncation": facts,
            "truncated_to": cut,
            "tensors_past_end": beyond,
            "parameters": params,
        },
    )

    dest = _common.case_dir(WRITER, "expert-count-mismatch")
    _write(dest / f"{STEM}.gguf", state, config, expert_count=2 * EXPERTS)
    _record(
        "expert-count-mismatch",
        description="GGUFWriter with qwen3moe.expert_count = 8 for expert tensors of 4",
        damage="qwen3moe.expert_count written as 8 (a merge tool writing its target config's "
        "count); every ffn_*_exps tensor stacks 4 experts and ffn_gate_inp routes to 4",
        expected=["expert-missing"],
        words="both MoE layers hold experts 0-3 of the 8 the metadata declares "
        "(expert-missing); the router ffn_gate_inp [32, 4] agrees with the tensors",
        extra={"parameters": params},
    )
    del gguf


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
