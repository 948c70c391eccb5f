"""A name stored in several shards: "the" tensor is the copy transformers loads
(`inspector._internal.checkpoint.loaded`), for every reader that takes one copy.

One test loads for real: a tiny Llama written by `save_pretrained`, another copy of a tensor
planted each way below, read back with `from_pretrained`. It shows which copy transformers 5
keeps and that our function and our tensor reader take that copy. The other tests plant the
copies the same way (`plant`) in tiny tensors written by huggingface_hub, without a model, and
check each reader against the copy the real load keeps (`KEEPS`)."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_exports import tiny_llama
from safetensors.torch import load_file, save_file

from inspector._internal.checkpoint.loaded import (
    kept_copies,
    loaded_shards,
    stale_copies,
    tensor_data,
)
from inspector._internal.checks import check, check_layout
from inspector._internal.checks.deep import deep_check
from inspector._internal.checks.diff import diff_checkpoints
from inspector._internal.checks.values import value_table, values_check
from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME
from inspector._internal.integrity.manifest import parse_manifest
from inspector._internal.integrity.verify import verify, write_manifest
from inspector._internal.plans.repair import plan_index
from inspector._internal.plans.restore import plan_restore
from inspector._internal.scan.entry import scan

INDEX = INDEX_NAME
NEW = "model-zz.safetensors"

# How the other copy is planted, and whose copy transformers keeps: "new" (the planted one)
# or "old" (the one the writer stored). `test_a_real_load_keeps_the_copy_we_read` checks
# each against `from_pretrained`.
KEEPS = {
    # A file sorting last that the index names (for another tensor); the entry of the name
    # still points to the writer's shard.
    "named-later": "new",
    # A file sorting first; the entry of the name points to it.
    "pointed-earlier": "old",
    # The entry of the name points to the new file, spelled './model-zz.safetensors', which
    # sorts before 'model-...' (transformers sorts the spellings as written).
    "spelled-first": "old",
    # `model.safetensors` beside the index: transformers reads it alone.
    "single": "new",
    # A file the index never names: no loader reads it.
    "unnamed": "old",
}


def plant(good: Path, dest: Path, variant: str, name: str, value: float) -> tuple[Path, str]:
    """A copy of `good` holding another copy of `name`, filled with `value`, planted the
    `variant` way (safetensors' own writer); returns the folder and the file whose copy
    transformers keeps (`KEEPS`)."""
    shutil.copytree(good, dest)
    index = json.loads((dest / INDEX).read_text())
    weight_map = index["weight_map"]
    holder = weight_map[name]
    shape = load_file(str(good / holder))[name].shape
    planted = {name: torch.full(tuple(shape), value)}
    file = {"pointed-earlier": "a-copy.safetensors", "single": "model.safetensors"}.get(
        variant, NEW
    )
    if variant == "named-later":  # the file is named through another tensor, same bytes
        other = next(n for n, f in weight_map.items() if n != name)
        planted[other] = load_file(str(good / weight_map[other]))[other]
        weight_map[other] = file
    elif variant == "pointed-earlier":
        weight_map[name] = file
    elif variant == "spelled-first":
        weight_map[name] = f"./{file}"
    save_file(planted, str(dest / file), metadata={"format": "pt"})
    (dest / INDEX).write_text(json.dumps(index, indent=2))
    return dest, file if KEEPS[variant] == "new" else holder


# -- the real load ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny untied Llama as transformers' own `save_pretrained` writes it (two shards)."""
    folder = tiny_llama(tmp_path_factory.mktemp("llama") / "good")
    assert len(json.loads((folder / INDEX).read_text())["weight_map"]) > 2
    return folder


def test_a_real_load_keeps_the_copy_we_read(llama: Path, tmp_path: Path) -> None:
    """transformers 5's `from_pretrained` decides. Before: our tensor reader took the first
    copy in name order (pointed-earlier: 7.0 where transformers loads 1.0; named-later: 1.0
    where it loads 7.0), and the shards a loader reads were sorted as normalised names
    (spelled-first: the planted copy) and never `model.safetensors` alone (single)."""
    import transformers

    name = "model.norm.weight"
    original = load_file(str(llama / json.loads((llama / INDEX).read_text())["weight_map"][name]))
    for variant, keeps in KEEPS.items():
        folder, kept = plant(llama, tmp_path / variant, variant, name, 7.0)
        model = transformers.LlamaForCausalLM.from_pretrained(folder)
        loaded = model.state_dict()[name]
        expected = torch.full_like(loaded, 7.0) if keeps == "new" else original[name]
        assert torch.equal(loaded, expected), variant
        scanned = scan(folder)
        assert kept_copies(scanned)[name][0].file == kept, variant
        with tensor_data(scanned) as data:
            raw = data.tensor_bytes(name)
        assert raw is not None and bytes(raw) == expected.numpy().tobytes(), variant


def test_the_load_check_judges_the_copy_transformers_keeps(llama: Path, tmp_path: Path) -> None:
    """A later shard holds a copy of another shape. transformers refuses the load (size
    mismatch: it keeps that copy); before, the load check judged the first copy and found
    nothing."""
    import transformers

    name = "model.norm.weight"
    folder, kept = plant(llama, tmp_path / "shape", "named-later", name, 7.0)
    save_file(load_file(str(folder / NEW)) | {name: torch.full((17,), 7.0)}, str(folder / NEW))
    _, info = transformers.LlamaForCausalLM.from_pretrained(
        folder, ignore_mismatched_sizes=True, output_loading_info=True
    )
    assert {k[0] for k in info["mismatched_keys"]} == {name}
    (f,) = [f for f in check(scan(folder)) if f.code == "load-shape-mismatch"]
    assert f.tensor == name and f.file == kept == NEW


# -- tiny tensors, no model --------------------------------------------------------------------

X = "lm_head.weight"
ORIGINAL = np.arange(64, dtype=np.float32).reshape(8, 8)


@pytest.fixture
def good(write_state_dict: Callable[..., Path]) -> Path:
    """huggingface_hub's writer, two shards; `X` and another tensor in the first."""
    state = {
        X: torch.from_numpy(ORIGINAL.copy()),
        "model.embed_tokens.weight": torch.zeros(8, 8),
        "model.norm.weight": torch.ones(8, 24),
    }
    folder = write_state_dict(state, folder="good", max_shard_size=600)
    weight_map = json.loads((folder / INDEX).read_text())["weight_map"]
    assert len(set(weight_map.values())) == 2
    assert weight_map[X] == weight_map["model.embed_tokens.weight"]
    return folder


def _kept_values(variant: str, value: float = 7.0) -> np.ndarray:
    """What transformers loads for `X` from `plant(good, ..., variant, X, value)`."""
    return np.full((8, 8), value, np.float32) if KEEPS[variant] == "new" else ORIGINAL


@pytest.mark.parametrize("variant", list(KEEPS))
def test_check_says_which_copy_transformers_keeps(good: Path, tmp_path: Path, variant: str) -> None:
    """Before: "loaders use a-copy.safetensors, as model.safetensors.index.json says"
    (pointed-earlier, where transformers keeps the other copy) and "loaders use
    model-00001-of-00002.safetensors" (named-later, where it keeps the planted one)."""
    folder, kept = plant(good, tmp_path / "bad", variant, X, 7.0)
    findings = check_layout(scan(folder))
    (dup,) = [f for f in findings if f.code == "duplicate-tensor" and f.tensor == X]
    assert dup.tensor == X and dup.file != kept  # the finding sits on a copy not loaded
    if variant == "single":
        assert "transformers reads model.safetensors alone" in dup.message
        assert "and keeps its copy" in dup.message
    else:
        assert f"transformers keeps the copy in {kept}" in dup.message
    assert "may keep another" in dup.message
    assert "as model.safetensors.index.json says" not in dup.message


def test_a_single_file_beside_the_index_is_said_to_be_read_alone(
    good: Path, tmp_path: Path
) -> None:
    """Before: "loaders that follow the index will not read it"; transformers reads it alone."""
    folder, _ = plant(good, tmp_path / "bad", "single", X, 7.0)
    (f,) = [f for f in check_layout(scan(folder)) if f.code == "unindexed-file"]
    assert f.file == "model.safetensors"
    assert "transformers reads model.safetensors alone" in f.message
    assert "will not read it" not in f.message


@pytest.mark.parametrize("variant", list(KEEPS))
def test_tensor_data_and_diff_read_the_kept_copy(good: Path, tmp_path: Path, variant: str) -> None:
    """`TensorData` by name (diff --data, consolidation's and restore's verification) took
    the first copy by name: named-later compared the stale copy ("identical" where
    transformers loads 7.0), pointed-earlier the planted one (a difference where it loads
    the original)."""
    folder, _ = plant(good, tmp_path / "bad", variant, X, 7.0)
    expected = _kept_values(variant)
    with tensor_data(scan(folder)) as data:
        raw = data.tensor_bytes(X)
    assert raw is not None and bytes(raw) == expected.tobytes()
    result = diff_checkpoints(scan(good), scan(folder), data=True)
    changed = X in result.data_differs
    assert changed == (KEEPS[variant] == "new"), (variant, result)


def test_deep_names_the_copy_transformers_loads(good: Path, tmp_path: Path) -> None:
    """Before: "loaders keep whichever they read last"."""
    folder, kept = plant(good, tmp_path / "bad", "pointed-earlier", X, 7.0)
    (f,) = [f for f in deep_check(scan(folder)) if f.code == "duplicate-tensor-content"]
    assert f"transformers loads the copy in {kept}" in f.message


def test_values_are_the_kept_copy_s_not_a_mixture(good: Path, tmp_path: Path) -> None:
    """`check --values` added the statistics of every copy up: a NaN in a copy no loader
    keeps was reported on the tensor (in the file of its first copy), and a healthy stale
    copy diluted the kept one's. Now the row is the kept copy's, with its file."""
    folder, kept = plant(good, tmp_path / "stale-nan", "pointed-earlier", X, math.nan)
    assert stale_copies(scan(folder)) == {"a-copy.safetensors": {X}}
    for mode in ("sample", "full"):
        scanned = scan(folder)
        row = value_table(scanned, mode).set_index("name").loc[X]
        assert row["file"] == kept and row["nan"] == 0
        assert float(row["max"]) == 63.0
        assert not [f for f in values_check(scanned, mode) if f.tensor == X]
    folder, kept = plant(good, tmp_path / "kept-nan", "named-later", X, math.nan)
    (f,) = [f for f in values_check(scan(folder), "full") if f.code == "tensor-nonfinite"]
    assert f.tensor == X and f.file == kept == NEW and "64 NaN" in f.message


@pytest.mark.parametrize("variant", ["named-later", "pointed-earlier", "unnamed"])
def test_restore_copies_and_verifies_the_kept_copy(
    good: Path, tmp_path: Path, write_state_dict: Callable[..., Path], variant: str
) -> None:
    """`repair --from REF --verify-data` with a reference holding two copies of the lost
    tensor. Before: the copy came from the last file by name, read or not (unnamed: values
    no loader of the reference gets), and the verification hashed the first copy, so
    named-later, pointed-earlier and unnamed all stopped with "the copies of 1 tensor
    differ"."""
    reference, _ = plant(good, tmp_path / "ref", variant, X, 7.0)
    lost = write_state_dict(
        {"model.embed_tokens.weight": torch.zeros(8, 8), "model.norm.weight": torch.ones(8, 24)},
        folder="lost",
        max_shard_size=600,
    )
    plan = plan_restore(scan(lost), scan(reference), verify_data=True)
    assert plan.restored == (X,) and plan.refused == ()
    result = plan.execute(model=False)
    assert result.data_checked == 1
    restored = load_file(str(lost / plan.shard))[X].numpy()
    assert np.array_equal(restored, _kept_values(variant))


@pytest.mark.parametrize("variant", ["spelled-first", "single"])
def test_the_manifest_records_the_copy_transformers_keeps(
    good: Path, tmp_path: Path, variant: str
) -> None:
    """Before: the shards a loader reads were sorted as normalised names (spelled-first:
    the planted copy recorded) and never `model.safetensors` alone (single: the index's
    copy recorded, the one transformers never reads)."""
    folder, kept = plant(good, tmp_path / "bad", variant, X, 7.0)
    scanned = scan(folder)
    assert loaded_shards(scanned)[-1].file == kept
    manifest = parse_manifest(write_manifest(folder).read_bytes())
    assert manifest.tensors[X].file == kept
    result = verify(folder, level="tensor", against=str(good))
    assert not result.all_match
    # Every copy some loader may keep is compared: the planted one differs.
    files = {f.file for f in result.findings if f.code == "tensor-hash-mismatch"}
    assert files == {NEW if variant == "spelled-first" else "model.safetensors"}


def test_a_rebuilt_index_says_which_copy_transformers_will_load(good: Path, tmp_path: Path) -> None:
    """`repair --only index --duplicates first` keeps the first copy in the index, which
    does not change what transformers loads: said."""
    folder, kept = plant(good, tmp_path / "bad", "pointed-earlier", X, 7.0)
    plan = plan_index(scan(folder), duplicates="first")
    (note,) = [n for n in plan.notes if X in n]
    assert "the index keeps a-copy.safetensors" in note
    assert f"transformers loads the copy in {kept}" in note


# -- config.json names the weights ------------------------------------------------------------


def _named(llama: Path, dest: Path, value: object) -> Path:
    """`llama` with a manifest of its own weights, then a full copy of them filled with 0.5
    in `evil.safetensors` (and `sub/evil.safetensors`), and config.json's
    `transformers_weights` set to `value`."""
    shutil.copytree(llama, dest)
    write_manifest(dest)
    state: dict[str, torch.Tensor] = {}
    for file in sorted(dest.glob("model-*.safetensors")):
        state |= {k: torch.full_like(v, 0.5) for k, v in load_file(str(file)).items()}
    save_file(state, str(dest / "evil.safetensors"), metadata={"format": "pt"})
    (dest / "sub").mkdir()
    shutil.copy(dest / "evil.safetensors", dest / "sub" / "evil.safetensors")
    config = json.loads((dest / CONFIG_NAME).read_text())
    (dest / CONFIG_NAME).write_text(json.dumps(config | {"transformers_weights": value}))
    return dest


@pytest.mark.parametrize(
    ("value", "loads"),
    [
        ("evil.safetensors", "evil"),  # read alone, whatever the index says
        ("./evil.safetensors", "evil"),
        ("sub/evil.safetensors", "evil"),  # a file the scan does not read
        (INDEX, "good"),  # the index: its files, even beside a model.safetensors
        ("../evil.safetensors", None),  # transformers refuses each of these
        ("evil.bin", None),
        (5, None),
    ],
)
def test_weights_config_json_names_are_what_transformers_loads(
    llama: Path, tmp_path: Path, value: object, loads: str | None
) -> None:
    """transformers 5 reads the file config.json's `transformers_weights` names instead of
    model.safetensors or the index's files. Before, `verify --level tensor` compared the
    index's shards and said "all tensors match" while transformers loaded other values, and
    `check` said nothing."""
    import transformers

    folder = _named(llama, tmp_path / "ckpt", value)
    if value == INDEX:  # a model.safetensors beside the index, which it now does not win
        shutil.copy(folder / "evil.safetensors", folder / "model.safetensors")
    name = "model.layers.0.mlp.down_proj.weight"
    try:
        loaded = transformers.LlamaForCausalLM.from_pretrained(folder).state_dict()[name]
    except (ValueError, AttributeError):
        loaded = None
    assert (loaded is None) == (loads is None), value
    scanned = scan(folder)
    (finding,) = [f for f in check(scanned, model=False) if f.code == "weights-named-by-config"]
    result = verify(folder, level="tensor")
    if loads == "good":
        assert loaded is not None and not torch.all(loaded == 0.5)
        assert {s.file for s in loaded_shards(scanned)} == set(
            json.loads((folder / INDEX).read_text())["weight_map"].values()
        )
        assert result.ok, result.line()
        return
    assert not result.ok and "all tensors match" not in result.line(), result.line()
    if loads == "evil" and value != "sub/evil.safetensors":
        assert loaded is not None and torch.all(loaded == 0.5)
        assert [s.file for s in loaded_shards(scanned)] == ["evil.safetensors"]
        assert "transformers reads evil.safetensors and nothing else" in finding.message
    else:  # refused by transformers, or a file the scan did not read: no copy vouched for
        assert loaded_shards(scanned) == ()
        assert "no verdict here covers" in finding.message
