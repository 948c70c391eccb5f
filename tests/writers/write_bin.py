"""Write PyTorch `.bin` checkpoints with the REAL writers: transformers 4.x
`save_pretrained(safe_serialization=False)` (single file and sharded with
`pytorch_model.bin.index.json`) and plain `torch.save`, healthy and damaged the way users find
them.

Runs in its own virtual environment, `build/writers-venv-tf4` (pins in
`tests/writers/constraints-tf4.txt`): transformers 5 writes safetensors only, so the `.bin`
layout needs a 4.x release, and 4.x cannot live beside the 5.x the other writers use.

No shim: transformers and torch run on the CPU as they are. Tiny random models (seed 0 before
each is built), float32, `max_shard_size="10KB"` for the sharded saves.

Cases (`tests/fixtures/writers/transformers4/` and `.../torch-save/`):
- transformers4/llama-single, llama-sharded, mixtral-single, mixtral-sharded: healthy.
- transformers4/sharded-shard-missing: a healthy sharded save, then one shard deleted (an
  interrupted download or upload).
- transformers4/sharded-index-dangling: a clean-up script removed one tensor from its shard
  (`torch.save` of the shard's dict without it) and left the index as it was.
- transformers4/mixtral-experts-lost: `save_pretrained(state_dict=...)` given a state dict that
  lost experts 2 and 3 of layer 1 (as an expert-parallel gather that kept local ranks only
  does); the index is consistent with the shards, the config still declares 4 experts.
- torch-save/state-dict: `torch.save(model.state_dict())` of a Llama with tied embeddings (the
  output head shares the embedding's storage) next to the config transformers writes.
- torch-save/storage-layouts: `torch.save` of a dict that covers every storage feature a
  reader meets: each dtype torch pickles (FloatStorage ... Float8_e4m3fnStorage), views with a
  storage offset, non-contiguous strides, two names on one storage, a 0-d and an empty
  tensor, an `nn.Parameter`.
- torch-save/legacy-non-zip: `torch.save(..., _use_new_zipfile_serialization=False)`, the
  pre-1.6 format (a pickle stream, no zip): a reader refuses it with one clear line.

The manifest records, per case, every tensor as the writer's own loader reads it back
(`torch.load(weights_only=True)`): dtype, shape, stride, storage offset, the storage key torch
gave it (`data/<key>` in the archive: keys are handed out "0", "1", ... in the order the
pickler first meets each storage, which is the dict's order), the byte offset of that record
in the file, and the sha256 of the tensor's values. Those are the facts a header-only reader
must reproduce, and what a `.bin` -> safetensors conversion must write bit for bit.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import zipfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

# The file-name table, from the project's source tree (the writers' environments do not
# install the project; importing it takes the standard library alone).
sys.path.insert(1, str(_common.REPO))

from inspector._internal.common.filenames import BIN_INDEX_NAME

SCRIPT = "write_bin.py"
SHARD = "10KB"
INDEX = BIN_INDEX_NAME
COMMON: dict[str, Any] = {
    "vocab_size": 64,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}


def _llama(**over: Any) -> Any:
    import torch
    import transformers

    config = transformers.LlamaConfig(**{**COMMON, "tie_word_embeddings": False, **over})
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def _mixtral() -> Any:
    import torch
    import transformers

    config = transformers.MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(config)


def _record_offsets(path: Path) -> dict[str, int]:
    """{record name: byte offset of its data in the file} from the zip's own headers (each
    local header is 30 bytes + name + extra field; torch pads the extra field so that every
    record's data starts on a 64-byte boundary)."""
    raw = path.read_bytes()
    out: dict[str, int] = {}
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            h = info.header_offset
            name_len, extra_len = struct.unpack("<HH", raw[h + 26 : h + 30])
            out[info.filename] = h + 30 + name_len + extra_len
    return out


def _bin_facts(path: Path) -> dict[str, Any]:
    """What a reader must find in one zip `.bin` file: its archive prefix, its records, and
    every tensor (see the module docstring)."""
    import torch

    with zipfile.ZipFile(path) as z:
        names = [i.filename for i in z.infolist()]
        sizes = {i.filename: i.file_size for i in z.infolist()}
    prefix = names[0].split("/", 1)[0]
    offsets = _record_offsets(path)
    state = torch.load(path, map_location="cpu", weights_only=True)
    keys: dict[int, str] = {}
    tensors: dict[str, Any] = {}
    for name, t in state.items():
        storage = t.untyped_storage()
        # keyed by the identity torch keys storages by (`_cdata`): views share one key
        key = keys.setdefault(storage._cdata, str(len(keys)))
        record = f"{prefix}/data/{key}"
        tensors[name] = {
            "dtype": str(t.dtype).removeprefix("torch."),
            "shape": list(t.shape),
            "stride": list(t.stride()),
            "storage_offset": t.storage_offset(),
            "storage_key": key,
            "storage_bytes": storage.nbytes(),
            "record_offset": offsets[record],
            "record_bytes": sizes[record],
            "requires_grad": t.requires_grad,
            "parameter": isinstance(t, torch.nn.Parameter),
            "sha256": _common.tensor_sha256(t),
        }
        # torch writes each storage whole: the record is exactly the storage's bytes.
        assert sizes[record] == storage.nbytes(), (path, name)
    assert len(keys) == sum(n.startswith(f"{prefix}/data/") for n in names), path
    return {"archive_prefix": prefix, "records": names, "tensors": tensors}


def _facts(folder: Path) -> dict[str, Any]:
    """`_bin_facts` of every zip `.bin` file of a case (a legacy file has none to give)."""
    return {p.name: _bin_facts(p) for p in sorted(folder.glob("*.bin")) if zipfile.is_zipfile(p)}


def _writer_state(folder: Path) -> dict[str, Any]:
    """{name: dtype, shape, sha256} of every tensor saved, the form the DCP cases use."""
    import torch

    state: dict[str, Any] = {}
    for path in sorted(folder.glob("*.bin")):
        state.update(torch.load(path, map_location="cpu", weights_only=True))
    return _common.state_dict_hashes(state)


def _save(model: Any, dest: Path, *, sharded: bool, **kwargs: Any) -> None:
    if sharded:
        kwargs["max_shard_size"] = SHARD
    model.save_pretrained(dest, safe_serialization=False, **kwargs)


def _record(
    writer: str, case: str, *, package: str, extra: dict[str, Any] | None = None, **case_args: Any
) -> None:
    """The manifest entry of a `.bin` case, with what its files hold."""
    folder = _common.FIXTURES / writer / case
    _common.record_expected(
        writer, case, package=package, script=SCRIPT, fmt="pytorch-bin",
        extra={"files": _facts(folder)} | (extra or {}), **case_args,
    )  # fmt: skip


def transformers_cases() -> None:
    import transformers

    tf = f"transformers {transformers.__version__}"
    for family, build in (("llama", _llama), ("mixtral", _mixtral)):
        model = build()
        params = sum(p.numel() for p in model.parameters())
        for layout in ("single", "sharded"):
            case = f"{family}-{layout}"
            dest = _common.case_dir("transformers4", case)
            _save(model, dest, sharded=layout == "sharded")
            _record(
                "transformers4",
                case,
                package="transformers",
                description=f"{type(model).__name__} save_pretrained(safe_serialization=False"
                + (f", max_shard_size={SHARD!r})" if layout == "sharded" else ")")
                + f", {tf}",
                expected=[],
                words="healthy: no error, no warning",
                extra={"parameters": params, "writer_state": _writer_state(dest)},
            )

    model = _llama()
    state = _writer_state_of(model)
    dest = _common.case_dir("transformers4", "sharded-shard-missing")
    _save(model, dest, sharded=True)
    index = json.loads((dest / INDEX).read_text())
    shards = sorted(set(index["weight_map"].values()))
    lost = shards[1]
    lost_tensors = sorted(n for n, f in index["weight_map"].items() if f == lost)
    (dest / lost).unlink()
    _record(
        "transformers4",
        "sharded-shard-missing",
        package="transformers",
        description=f"LlamaForCausalLM sharded .bin save, then {lost} deleted",
        damage=f"healthy save_pretrained(safe_serialization=False), then {lost} deleted",
        expected=["index-missing-file", "load-missing-tensor", "total-size-mismatch"],
        words=f"the index names {lost}, which is not on disk (index-missing-file); the model "
        f"then lacks {', '.join(lost_tensors)} (load-missing-tensor); metadata.total_size "
        "counts their bytes (total-size-mismatch). The same codes as the safetensors "
        "checkpoint of this model with the same damage gets today",
        extra={"lost_file": lost, "lost_tensors": lost_tensors, "writer_state": state},
    )

    import torch

    dest = _common.case_dir("transformers4", "sharded-index-dangling")
    _save(model, dest, sharded=True)
    index = json.loads((dest / INDEX).read_text())
    dropped = "model.layers.1.mlp.down_proj.weight"
    shard = dest / index["weight_map"][dropped]
    held = torch.load(shard, map_location="cpu", weights_only=True)
    del held[dropped]
    torch.save(held, shard)
    _record(
        "transformers4",
        "sharded-index-dangling",
        package="transformers",
        description="LlamaForCausalLM sharded .bin save whose index names a tensor no shard holds",
        damage=f"{dropped} removed from {shard.name} by torch.save of the shard's dict without "
        "it; the index was left as written",
        expected=["index-dangling-tensor", "load-missing-tensor", "total-size-mismatch"],
        words=f"the index maps {dropped} to {shard.name}, which does not hold it "
        "(index-dangling-tensor); the model lacks it (load-missing-tensor); "
        "metadata.total_size still counts its bytes (total-size-mismatch). The same codes as "
        "the safetensors checkpoint of this model with the same damage gets today",
        extra={"dropped": dropped, "writer_state": state},
    )

    model = _mixtral()
    full = model.state_dict()
    lost_experts = [
        n for n in full if n.startswith("model.layers.1.block_sparse_moe.experts.") and
        n.split(".")[5] in ("2", "3")
    ]  # fmt: skip
    kept = {n: t for n, t in full.items() if n not in lost_experts}
    dest = _common.case_dir("transformers4", "mixtral-experts-lost")
    _save(model, dest, sharded=True, state_dict=kept)
    _record(
        "transformers4",
        "mixtral-experts-lost",
        package="transformers",
        description="MixtralForCausalLM save_pretrained(state_dict=...) of a state dict without "
        "experts 2-3 of layer 1, sharded .bin",
        damage="experts 2 and 3 of layer 1 missing from the state dict given to save_pretrained "
        "(index and shards agree; config.json declares num_local_experts=4)",
        expected=["expert-missing", "load-shape-mismatch"],
        words="layer 1 holds experts 0-1 of the 4 the config and the router "
        "(block_sparse_moe.gate.weight [4, 16]) declare (expert-missing); transformers 5 "
        "stacks the experts it finds into a [2, ...] tensor where MixtralForCausalLM expects "
        "[4, ...] (load-shape-mismatch). The same codes as the safetensors checkpoint of this "
        "model with the same damage gets today",
        extra={"lost_tensors": sorted(lost_experts), "writer_state": _writer_state(dest)},
    )


def _writer_state_of(model: Any) -> dict[str, Any]:
    """The hashes of what `save_pretrained` writes for `model` (written once to a scratch
    folder and read back), for cases whose damage removes part of it."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=False)
        return _writer_state(Path(tmp))


def torch_save_cases() -> None:
    import torch

    model = _llama(tie_word_embeddings=True)
    dest = _common.case_dir("torch-save", "state-dict")
    torch.save(model.state_dict(), dest / "pytorch_model.bin")
    model.config.save_pretrained(dest)
    _record(
        "torch-save",
        "state-dict",
        package="torch",
        description="torch.save(model.state_dict()) of a LlamaForCausalLM with tied embeddings, "
        "config.json from config.save_pretrained",
        expected=[],
        words="healthy: lm_head.weight and model.embed_tokens.weight share storage key 0; the "
        "state dict is an OrderedDict carrying its `_metadata` (version per module)",
        extra={"parameters": sum(p.numel() for p in model.parameters())},
    )

    gen = torch.Generator().manual_seed(0)
    base = torch.randn(6, 8, generator=gen)
    shared = torch.randn(40, generator=gen)
    layouts: dict[str, Any] = {
        "float32": base.clone(),
        "float64": torch.randn(3, 4, generator=gen, dtype=torch.float64),
        "float16": base.to(torch.float16),
        "bfloat16": base.to(torch.bfloat16),
        "float8_e4m3fn": base.to(torch.float8_e4m3fn),
        "float8_e5m2": base.to(torch.float8_e5m2),
        "int64": torch.arange(12, dtype=torch.int64).reshape(3, 4),
        "int32": torch.arange(12, dtype=torch.int32),
        "int16": torch.arange(12, dtype=torch.int16),
        "int8": torch.arange(-6, 6, dtype=torch.int8),
        "uint8": torch.arange(12, dtype=torch.uint8),
        "bool": torch.arange(12) % 3 == 0,
        "complex64": torch.randn(4, generator=gen, dtype=torch.complex64),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 8),
        "transposed": base.t(),
        "shared.head": shared[:16].view(4, 4),
        "shared.tail": shared[24:].view(2, 8),
        "strided": shared[::5],
        "parameter": torch.nn.Parameter(torch.randn(2, 3, generator=gen)),
    }
    dest = _common.case_dir("torch-save", "storage-layouts")
    torch.save(layouts, dest / "pytorch_model.bin")
    _record(
        "torch-save",
        "storage-layouts",
        package="torch",
        description="torch.save of a dict covering every storage type, offsets, strides, shared "
        "storages, 0-d, empty and nn.Parameter tensors",
        expected=[],
        words="healthy: every tensor read with its dtype, shape, stride and storage offset "
        "as recorded under files; shared.head, shared.tail and strided share one storage",
    )

    model = _llama()
    dest = _common.case_dir("torch-save", "legacy-non-zip")
    torch.save(model.state_dict(), dest / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    model.config.save_pretrained(dest)
    _record(
        "torch-save",
        "legacy-non-zip",
        package="torch",
        description="torch.save(model.state_dict(), _use_new_zipfile_serialization=False): the "
        "pre-1.6 pickle-stream format, config.json beside it",
        damage="legacy (non-zip) serialization chosen by the writer",
        expected=["bin-legacy-format"],
        words="refused with one line naming the file and how to convert it (bin-legacy-format); "
        "nothing else is reported for a file that was not read (no load-missing-tensor per "
        "tensor)",
        extra={"first_bytes_hex": (dest / "pytorch_model.bin").read_bytes()[:32].hex()},
    )


def main() -> None:
    transformers_cases()
    torch_save_cases()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
