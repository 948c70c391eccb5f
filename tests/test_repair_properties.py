"""Property: damage a healthy checkpoint at random; scan -> repair -> scan leaves no index
finding and no tensor byte changed. And a repair killed at a random moment leaves every file
whole (original or repaired), which the next run completes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from inspector import check, scan
from inspector._internal.cli.main import main
from inspector._internal.common.filenames import INDEX_NAME
from inspector._internal.execution import atomic
from inspector._internal.plans.repair import plan_repair

INDEX = INDEX_NAME
INDEX_CODES = {
    "index-unreadable",
    "index-missing-file",
    "index-dangling-tensor",
    "index-wrong-file",
    "unindexed-tensor",
    "unindexed-file",
    "total-size-mismatch",
    "total-parameters-mismatch",
}
DAMAGES = (
    "drop",
    "dangling",
    "wrong-file",
    "total-size",
    "total-params",
    "no-index",
    "stray",
    "missing-shard",
)


def _write_healthy(folder: Path, layers: int, shards: int, seed: int) -> None:
    """A tiny MoE split greedily into `shards` files, with the index transformers writes."""
    rng = np.random.default_rng(seed)
    names = []
    for layer in range(layers):
        names += [
            f"model.layers.{layer}.self_attn.q_proj.weight",
            f"model.layers.{layer}.mlp.gate.weight",
        ]
        names += [f"model.layers.{layer}.mlp.experts.{e}.up_proj.weight" for e in range(3)]
    per = -(-len(names) // shards)
    weight_map, total, params = {}, 0, 0
    folder.mkdir(parents=True)
    for i in range(shards):
        part = names[i * per : (i + 1) * per]
        if not part:
            break
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {n: rng.standard_normal((4, 2)).astype(np.float32) for n in part}
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
        total += sum(t.nbytes for t in tensors.values())
        params += sum(t.size for t in tensors.values())
    meta = {"total_size": total, "total_parameters": params}
    (folder / INDEX).write_text(json.dumps({"metadata": meta, "weight_map": weight_map}, indent=2))


def _damage(folder: Path, kind: str, pick: int) -> None:
    index = json.loads((folder / INDEX).read_text())
    wm = index["weight_map"]
    names = sorted(wm)
    name = names[pick % len(names)]
    files = sorted(set(wm.values()))
    if kind == "drop":
        del wm[name]
    elif kind == "dangling":
        wm["mtp.fc.weight"] = files[0]
    elif kind == "wrong-file" and len(files) > 1:
        wm[name] = next(f for f in files if f != wm[name])
    elif kind == "total-size":
        index["metadata"]["total_size"] += 4096
    elif kind == "total-params":
        index["metadata"]["total_parameters"] -= 7
    elif kind == "no-index":
        (folder / INDEX).unlink()
        return
    elif kind == "stray":
        save_file(
            {"mtp.layers.0.eh_proj.weight": np.ones((2, 2), np.float32)},
            str(folder / "extra.safetensors"),
        )
    elif kind == "missing-shard" and len(files) > 1:
        wm["lost.weight"] = "model-00099-of-00099.safetensors"
    (folder / INDEX).write_text(json.dumps(index))


def _digests(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.glob("*.safetensors")
    }


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    layers=st.integers(1, 4),
    shards=st.integers(1, 4),
    seed=st.integers(0, 2**16),
    damages=st.lists(
        st.tuples(st.sampled_from(DAMAGES), st.integers(0, 1000)), min_size=1, max_size=3
    ),
)
def test_scan_repair_scan_has_no_index_finding(
    tmp_path_factory, layers, shards, seed, damages
) -> None:
    folder = tmp_path_factory.mktemp("prop") / "ckpt"
    _write_healthy(folder, layers, shards, seed)
    for kind, pick in damages:
        if (folder / INDEX).exists():
            _damage(folder, kind, pick)
    before = _digests(folder)
    plan = plan_repair(scan(folder))
    assert not plan.refused
    plan.execute()
    after = check(scan(folder))
    assert not [f for f in after if f.code in INDEX_CODES], [f.message for f in after]
    assert _digests(folder) == before


def test_repair_killed_at_random_moments_never_leaves_a_mix(tmp_path: Path) -> None:
    """Kill `ckpt-inspect repair --yes` before each of its filesystem steps in turn.

    A kill at a moment of the wall clock mostly landed in the interpreter's start-up, before
    any write; the child below dies (`os._exit`, no clean-up, as SIGKILL) just before its
    N-th step (a replace, rename, link, unlink, mkdir or fsync), for every N the run has."""
    template = tmp_path / "template"
    _write_healthy(template, 40, 8, 1)
    _damage(template, "drop", 3)
    originals = (template / INDEX).read_bytes()
    steps = _repair_killed_before(_copy(template, tmp_path / "whole"), None)
    repaired = (tmp_path / "whole" / INDEX).read_bytes()
    assert repaired != originals and steps >= 4, steps  # the fix was written, step by step
    expected = sorted(p.name for p in template.iterdir())
    left_temps = []
    for step in range(steps):
        folder = _copy(template, tmp_path / f"run{step}")
        assert _repair_killed_before(folder, step) == step
        assert (folder / INDEX).read_bytes() in (originals, repaired)
        left_temps += [p.name for p in folder.iterdir() if ".tmp-" in p.name]
        # The user's recovery: finish the journal, remove the temp files the killed run left
        # (a lock left behind is free: the kernel dropped it with the process).
        assert main(["repair", "--recover", "--yes", str(folder)]) == 0
        assert (folder / INDEX).read_bytes() in (originals, repaired)
        assert _digests(folder) == _digests(template)
        # Exactly the checkpoint's files (and the backup folder once one was made): no temp
        # file, journal or lock left, whatever the step the run died before.
        assert sorted(p.name for p in folder.iterdir() if p.name != atomic.BACKUP_DIR) == expected
        backups = folder / atomic.BACKUP_DIR
        kept = [p for p in backups.rglob("*") if p.is_file()] if backups.exists() else []
        assert all(p.name == INDEX for p in kept), kept
    # Some steps did leave temp files (the index's, the journal's) for the recovery to remove.
    assert any(name.startswith(f".{INDEX}.tmp-") for name in left_temps), left_temps
    assert any(name.startswith(f".{atomic.JOURNAL}.tmp-") for name in left_temps), left_temps


# The filesystem calls a repair's writes go through (pathlib's and shutil's included).
_STEPS = ("replace", "rename", "link", "unlink", "mkdir", "fsync")
_KILLED = 137


def _repair_killed_before(folder: Path, kill_at: int | None) -> int:
    """Run the CLI's `repair --yes` in a forked child that dies before its `kill_at`-th
    filesystem step (or never); return how many steps it took."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 1
        try:
            os.close(read)
            taken = 0

            def counted(call: Callable[..., object]) -> Callable[..., object]:
                def step(*args: object, **kwargs: object) -> object:
                    nonlocal taken
                    if taken == kill_at:
                        os.write(write, str(taken).encode())
                        os._exit(_KILLED)
                    taken += 1
                    return call(*args, **kwargs)

                return step

            for name in _STEPS:
                setattr(os, name, counted(getattr(os, name)))
            quiet = os.open(os.devnull, os.O_WRONLY)
            os.dup2(quiet, 1)
            os.dup2(quiet, 2)
            status = main(["repair", "--yes", "--no-model", str(folder)])
            os.write(write, str(taken).encode())
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        steps = answer.read()
    _, wait = os.waitpid(pid, 0)
    expected = 0 if kill_at is None else _KILLED
    assert os.waitstatus_to_exitcode(wait) == expected, (kill_at, wait)
    return int(steps)


def _copy(src: Path, dest: Path) -> Path:
    # Real copies, not links: a repair that touched shard bytes must show up in the digests.
    shutil.copytree(src, dest)
    return dest
