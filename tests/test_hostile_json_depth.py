"""JSON nested deeper than any writer nests, in every JSON file a checkpoint holds.

Before, a value nested past Python's recursion limit made the decoder raise RecursionError
(a traceback from `scan`), and a config nested 300 levels deep broke the load check when it
serialised the config. Now every JSON file and JSON string is decoded by one function with a
nesting budget (`inspector._internal.layouts._common.decode_json`, `MAX_JSON_DEPTH` levels): past
it, the file gets its usual "unreadable" finding naming the limit, and nothing else breaks.
The checkpoints are written by the real writers (huggingface_hub, the Model-Optimizer
layout writer, Megatron's torch_dist demo writer), then one JSON file is given a deep value.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from modelopt_writer import (
    INDEX,
    load_json,
    save_json,
    shard_name,
    tiny_layer_state_dicts,
    write_modelopt_export,
)
from test_codes_coverage import moe_config, moe_model, write_hf

from inspector._internal.checks import check
from inspector._internal.common.filenames import CONFIG_NAME, QUANT_CONFIG_NAME
from inspector._internal.demo.torch_dist import write_torch_dist_demo
from inspector._internal.findings.finding import Finding
from inspector._internal.layouts._common import MAX_JSON_DEPTH, decode_json
from inspector._internal.load.verdict import load_verdict
from inspector._internal.scan.entry import scan

ITER = "iter_0000100"
# Past the budget but within what the decoder can recurse, and far past Python's limit.
TOO_DEEP = (MAX_JSON_DEPTH + 1, 300, 100_000)
LIMIT_TEXT = f"more than {MAX_JSON_DEPTH} levels deep"


def nested(depth: int) -> str:
    """JSON text nested `depth` levels deep: a list, an object, a list... around a 1."""
    opens = ("[" if i % 2 == 0 else '{"a": ' for i in range(depth))
    closes = ("]" if i % 2 == 0 else "}" for i in reversed(range(depth)))
    return "".join(opens) + "1" + "".join(closes)


def depth_of(value: object) -> int:
    if not isinstance(value, dict | list):
        return 0
    members = value.values() if isinstance(value, dict) else value
    return 1 + max(map(depth_of, members), default=0)


def with_deep_value(path: Path, depth: int, place: Callable[[dict], dict]) -> None:
    """Rewrite the JSON file at `path` with a `depth`-deep value where `place` puts the
    marker (the rest of the file as the writer wrote it)."""
    doc = load_json(path)
    place(doc)["deep"] = "__DEEP__"
    path.write_text(json.dumps(doc, indent=2).replace('"__DEEP__"', nested(depth)))


def test_nested_builds_the_depth_it_says() -> None:
    for depth in (1, 2, 3, 7, 8, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1):
        assert depth_of(json.loads(nested(depth))) == depth
        value, problem = decode_json(nested(depth))
        if depth <= MAX_JSON_DEPTH:
            assert problem is None and depth_of(value) == depth
        else:
            assert value is None and problem is not None and LIMIT_TEXT in problem


def findings_of(folder: Path, code: str) -> list[Finding]:
    return [f for f in check(scan(folder)) if f.code == code]


@pytest.fixture
def hf(tmp_path: Path) -> Path:
    return write_hf(tmp_path / "hf", moe_model(), config=moe_config(), shard=2000)


@pytest.mark.parametrize("depth", TOO_DEEP)
@pytest.mark.parametrize(
    ("file", "code", "place"),
    [
        (INDEX, "index-unreadable", lambda d: d["metadata"]),
        (CONFIG_NAME, "config-unreadable", lambda d: d),
    ],
)
def test_hf_files_nested_too_deep(
    hf: Path, file: str, code: str, place: Callable[[dict], dict], depth: int
) -> None:
    with_deep_value(hf / file, depth, place)
    found = findings_of(hf, code)
    assert len(found) == 1 and found[0].file == file
    assert LIMIT_TEXT in found[0].message
    if file == CONFIG_NAME:  # the load check says why it did not run, nothing more
        verdict = load_verdict(scan(hf))
        assert verdict.skipped is not None and "cannot be read" in verdict.skipped


def test_a_deep_but_readable_config_is_read(hf: Path) -> None:
    """Within the budget the file is read as it is; the load check bounds itself
    (tests/test_hostile_load_check.py)."""
    with_deep_value(hf / CONFIG_NAME, MAX_JSON_DEPTH - 1, lambda d: d)  # inside the top
    scanned = scan(hf)
    assert scanned.read_findings == [] and scanned.config is not None
    assert not [f for f in check(scanned, model=False) if f.code == "config-unreadable"]


@pytest.mark.parametrize("depth", TOO_DEEP)
def test_quant_config_nested_too_deep(hf: Path, depth: int) -> None:
    save_json(hf / QUANT_CONFIG_NAME, {"quantization": {"quant_algo": "FP8"}})
    with_deep_value(hf / QUANT_CONFIG_NAME, depth, lambda d: d["quantization"])
    found = findings_of(hf, "quant-config-unreadable")
    assert len(found) == 1 and LIMIT_TEXT in found[0].message


@pytest.mark.parametrize("depth", TOO_DEEP)
def test_sidecar_nested_too_deep(tmp_path: Path, depth: int) -> None:
    folder = write_modelopt_export(tmp_path / "export", tiny_layer_state_dicts(3))
    sidecar = f"{shard_name(3, 3)}.json"
    with_deep_value(folder / sidecar, depth, lambda d: d["metadata"])
    found = findings_of(folder, "sidecar-unreadable")
    assert len(found) == 1 and found[0].file == sidecar and LIMIT_TEXT in found[0].message


@pytest.mark.parametrize("depth", TOO_DEEP)
def test_torch_dist_metadata_json_nested_too_deep(tmp_path: Path, depth: int) -> None:
    folder = write_torch_dist_demo(tmp_path / "megatron")
    with_deep_value(folder / ITER / "metadata.json", depth, lambda d: d)
    scanned = scan(folder)
    assert [p.code for p in scanned.read_findings] == ["torch-dist-metadata-json"]
    assert LIMIT_TEXT in scanned.read_findings[0].message
