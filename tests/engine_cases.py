"""Checkpoints for the serving-engine checks, written by the real writers: GGUF files by
gguf-py's GGUFWriter (llama.cpp's own), EAGLE-3 drafts and tied heads by safetensors'
`save_file`. Tests import it as `from engine_cases import ...` (pytest puts tests/ on the
path)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import save_file

from inspector._internal.common.filenames import CONFIG_NAME

__all__ = ["LLAMA_BLOCK", "write_eagle3", "write_llama_gguf"]

# What convert_hf_to_gguf.py writes for one Llama block (gguf-py names).
LLAMA_BLOCK = (
    "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
    "ffn_up", "ffn_down",
)  # fmt: skip


def write_llama_gguf(
    folder: Path,
    *,
    block_count: int = 2,
    blocks: Iterable[int] = (0, 1),
    extra: Iterable[str] = (),
) -> Path:
    """`folder/m.gguf`: a Llama GGUF declaring `block_count` blocks and holding `blocks`, plus
    tensors named `extra`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "m.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(block_count)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_head_count(2)
    tiny = np.ones(8, np.float32)
    names = ["token_embd.weight", "output_norm.weight", "output.weight"]
    names += [f"blk.{b}.{part}.weight" for b in blocks for part in LLAMA_BLOCK]
    for name in [*names, *extra]:
        writer.add_tensor(name, tiny)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_eagle3(
    folder: Path,
    *,
    hidden: int = 16,
    vocab: int = 64,
    draft_vocab: int = 32,
    d2t: torch.Tensor | None = None,
    t2d: torch.Tensor | None = None,
    head: bool = True,
) -> Path:
    """An EAGLE-3 draft as the trainers save it: `midlayer`, `fc`, `norm`, `lm_head` over the
    draft vocabulary, `d2t` (offsets) and `t2d` (a mask over the target vocabulary)."""
    folder.mkdir(parents=True, exist_ok=True)
    if d2t is None:
        # Draft token i is target token 2i: offset i.
        d2t = torch.arange(draft_vocab, dtype=torch.int64)
    if t2d is None:
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[torch.arange(draft_vocab) * 2 % vocab] = True
    state = {
        "fc.weight": torch.zeros(hidden, 3 * hidden, dtype=torch.bfloat16),
        "norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        "midlayer.self_attn.q_proj.weight": torch.zeros(hidden, 2 * hidden, dtype=torch.bfloat16),
        "midlayer.input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        "d2t": d2t,
        "t2d": t2d,
    }
    if head:
        state["lm_head.weight"] = torch.zeros(draft_vocab, hidden, dtype=torch.bfloat16)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "intermediate_size": 32,
    }
    (folder / CONFIG_NAME).write_text(json.dumps(config))
    return folder
