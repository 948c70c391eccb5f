"""Small hostile files cost bounded work and hundreds of MB at most: each test builds the input
and runs the real scan and check in a child process that reports the calls they made
(tests/work_count.py) and how far its peak resident memory grew.

- a 1.5 MB torch_dist `.metadata` whose tensors share one chunk list of 300,000 memo
  references (coverage used to add over up to 4M cells per chunk, once per tensor: 294 s
  for 4 tensors, about 50 min for 40);
- a valid 3 MB shard of 50,000 tensors `t0`..`t49999` (name parsing built a mask over
  every name per distinct in-word number: memory ran out at 200,000);
- DCP rank files naming a rank and an output each (ranks x outputs was walked).

The bounds are counts of calls and bytes of memory, neither of the clock, so that no load
can fail them (20 s of wall was missed at a load average of 12, and CPU seconds depend on the
machine); before, each took minutes or ran out of memory. Where two sizes are compared, 4
times the input makes fewer than 5 times the calls: linear work passes, a pass over pairs
(16 times) fails.
"""

from __future__ import annotations

import json
import pickle
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from forked import fork_server
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import TensorSpec, serialize_file
from safetensors.numpy import save_file
from work_count import calls

from inspector._internal.checkpoint import naming
from inspector._internal.checkpoint.naming import parse_name, parse_names
from inspector._internal.checks import coverage as cov
from inspector._internal.checks.dcp import _missing_rank_files
from inspector._internal.common.filenames import QUANT_CONFIG_NAME, SAFETENSORS_WEIGHTS_NAME

GROWN_BYTES = 400_000_000

# The scan and check of a folder in a child of `forked.fork_server`: it has read nothing else,
# as a fresh process after its imports, and its peak resident memory starts at its size.
_PROBE = f"import sys\nsys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
_PROBE += textwrap.dedent(
    """
    from work_count import calls
    from inspector._internal.checks import check
    from inspector._internal.scan.entry import scan

    def memory(field):  # this process's resident memory (VmRSS) or its peak (VmHWM), bytes
        lines = open("/proc/self/status").read().splitlines()
        return next(int(x.split()[1]) * 1024 for x in lines if x.startswith(field + ":"))

    def run(folder):
        before = memory("VmRSS")
        def scan_and_check():
            scanned = scan(folder)
            return scanned, check(scanned, model=False)

        (scanned, found), made = calls(scan_and_check)
        codes = sorted({f.code for f in found})
        return {
            "calls": made, "grown": memory("VmHWM") - before, "codes": codes,
            "tensors": len(scanned.tensors),
        }
    """
)


@pytest.fixture(scope="module")
def probe() -> Iterator[Callable[[Path], dict]]:
    """Scan and check a folder in a process that has read nothing else (`_PROBE`): the calls
    they made (tests/work_count.py), how far its peak resident memory grew past its size
    after the imports (Linux /proc; a large `.metadata`
    is unpickled in a child the kernel bounds, see SECURITY.md), the codes found, the number
    of tensors."""
    with fork_server(_PROBE) as call:
        yield lambda folder: call(str(folder))


# -- torch_dist chunks shared through the pickle memo ----------------------------------------


def shared_chunks_metadata(tensors: int, references: int = 300_000) -> bytes:
    """`.metadata` (torch's own DCP classes, pickled as `FileSystemWriter` does) whose
    `tensors` tensors of shape 4000 x 4000 share ONE chunk list: 995 small distinct chunks on
    the diagonal, which make a counter grid of about 4M cells, then the whole tensor as one
    chunk object referenced over and over (a few bytes per reference)."""
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        TensorProperties,
        TensorStorageMetadata,
    )

    small = [
        ChunkStorageMetadata(torch.Size([4 * i, 4 * i]), torch.Size([1, 1])) for i in range(995)
    ]
    whole = ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([4000, 4000]))
    chunks = small + [whole] * (references - len(small))
    properties = TensorProperties(dtype=torch.bfloat16)
    entries = {
        f"decoder.layers.{i}.mlp.linear_fc1.weight": TensorStorageMetadata(
            properties, torch.Size([4000, 4000]), chunks
        )
        for i in range(tensors)
    }
    return pickle.dumps(Metadata(state_dict_metadata=entries))


@pytest.mark.parametrize("tensors", [4, 40])
def test_tensors_sharing_one_chunk_list_of_300000_references(
    tmp_path: Path, tensors: int, probe: Callable[[Path], dict]
) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    data = shared_chunks_metadata(tensors)
    assert len(data) < 2_000_000
    (folder / ".metadata").write_bytes(data)
    result = probe(folder)
    # One pass over the shared list (its 300,000 references), not one per tensor.
    assert result["calls"] < 2 * 300_000, result
    assert result["grown"] < GROWN_BYTES, result
    # The chunks overlap (the whole tensor is listed many times): found, not hidden.
    assert "torch-dist-chunk-overlap" in result["codes"], result


def test_coverage_of_a_shared_list_is_computed_once_and_near_linear() -> None:
    small = [((4 * i, 4 * i), (1, 1)) for i in range(995)]
    chunks = small + [((0, 0), (4000, 4000))] * 299_005
    result = cov.coverage((4000, 4000), chunks)
    assert result.exact and result.covered == 16_000_000
    assert result.overlap == (0, 995) and result.multiple == 16_000_000


def test_chunks_past_the_budget_end_in_a_finding_when_their_volume_matches() -> None:
    """Irregular chunks past the counter grid's budget are judged by volume; an equal volume
    is not a proof: `verified` is False, which the checks report (check-budget-exceeded)."""
    from inspector._internal.checks.torch_dist import chunk_coverage

    # 2,100 strips of 2 rows, each cut at another column: over 4M grid points. Widening
    # the first strip's left chunk and narrowing another strip's right one makes an overlap
    # and a hole of 2 elements each: the volume still matches.
    chunks = []
    for i in range(2100):
        cut = i + 1
        chunks += [((2 * i, 0), (2, cut)), ((2 * i, cut), (2, 4200 - cut))]
    chunks[0] = ((0, 0), (2, 2))
    chunks[11] = ((10, 6), (2, 4200 - 6 - 1))
    result = cov.coverage((4200, 4200), chunks)
    assert not result.exact and not result.verified and result.volume == result.total
    code, what = chunk_coverage((4200, 4200), chunks) or (None, "")
    assert code == "check-budget-exceeded" and "budget" in what


# -- 50,000 names with numbers inside words -----------------------------------------------


def test_50000_names_with_numbers_inside_words(
    tmp_path: Path, probe: Callable[[Path], dict]
) -> None:
    """Masks over every name per distinct number would hold 2.5 GB here (a name by a
    number each), past GROWN_BYTES; a step per pair of names, 2.5 billion calls."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    # safetensors' own serializer, given what `safetensors.numpy.save_file` hands it (its
    # `_flatten`: one `TensorSpec` per array) for 50,000 one-byte uint8 tensors, here slices
    # of one zeroed buffer: the same file, without numpy's per-array `dtype.name` and
    # `ctypes` lookups.
    n = 50_000
    zeros = np.zeros(n, np.uint8)
    start = zeros.ctypes.data
    specs = {
        f"t{i}": TensorSpec(dtype="uint8", shape=(1,), data_ptr=start + i, data_len=1)
        for i in range(n)
    }
    serialize_file(specs, str(folder / SAFETENSORS_WEIGHTS_NAME), metadata={"format": "pt"})
    result = probe(folder)
    assert result["tensors"] == n
    # About 9 calls per name (the header's entries, the checks' columns): linear.
    assert result["calls"] < 20 * n, result
    assert result["grown"] < GROWN_BYTES, result


def test_a_name_of_a_million_numbers_is_one_template() -> None:
    name = "a." + ".".join(["1"] * 1_000_000) + ".weight"
    parsed = parse_names([name, "model.layers.3.mlp.w1.weight"])
    assert parsed.row(0).layer is None and parsed.row(1).layer == 3


_WORDS = st.sampled_from(
    ["w", "fc", "linear_fc", "q", "norm", "expert_", "layer", "t", "mlp.w", "self_attn.q", "ln_"]
)


@settings(max_examples=25, deadline=None)
@given(
    prefix=st.sampled_from(["model.layers.#.", "decoder.layers.#.", "mtp.layers.#.", "", "x#."]),
    word=_WORDS,
    tail=st.sampled_from([".weight", "_proj.weight", ".bias", "", "_quantizer._amax"]),
    count=st.integers(1, 120),
)
def test_many_templates_in_one_group_parse_as_each_name_alone(
    prefix: str, word: str, tail: str, count: int
) -> None:
    """The one-pass analysis of a group of templates that differ in digits inside words
    (`_fill_variants`) gives what each name parsed alone gives."""
    names = [prefix.replace("#", str(i % 7)) + f"{word}{10 + i}{tail}" for i in range(count)]
    many = parse_names(names)
    for i, name in enumerate(names):
        assert many.row(i, name) == parse_name(name)


def test_kind_rules_in_one_pass_agree_with_each_path() -> None:
    paths = ["mlp.w1", "self_attn.q_proj", "x.norm7", "t12", "mixer.A_log", "a.ln_3", "experts"]
    assert naming._kinds(paths) == [naming._kind(p) for p in paths]


# -- DCP rank files ------------------------------------------------------------------------


def test_rank_files_on_a_diagonal_cost_linear_work() -> None:
    """10,000 rank files, each rank writing only its own output: every output lacks 9,999
    ranks' files. The findings stay few, and the work linear (fewer than 5 times the calls
    for 4 times the files)."""

    def missing(n: int) -> tuple[list, int]:
        shards = [
            SimpleNamespace(
                file=f"shard-{r:05d}-model-{r:05d}-of-{n:05d}.safetensors", readable=True
            )
            for r in range(1, n + 1)
        ]
        return calls(lambda: _missing_rank_files(shards))  # type: ignore[arg-type]

    (_, quarter), (found, done) = missing(2_500), missing(10_000)
    assert done < 5 * quarter, (done, quarter)
    assert 1 < len(found) <= 22
    assert "9,980 more output files" in found[-1].message


# -- other rules over untrusted structure ---------------------------------------------------


def test_diff_against_a_reference_with_4000_expert_modules(tmp_path: Path) -> None:
    """Experts fused in B of 4,000 distinct `...experts` modules in A: one pass over the
    names (each fused name used to be compared with every expert module, 16 million calls
    here): fewer than 5 times the calls of 1,000."""
    from inspector._internal.checks.diff import diff_checkpoints
    from inspector._internal.scan.entry import scan

    def diffed(n: int) -> tuple[object, int]:
        a, b = tmp_path / f"a{n}", tmp_path / f"b{n}"
        a.mkdir()
        b.mkdir()
        one = np.zeros((1,), np.float32)
        save_file({f"m{i}.experts.0.w": one for i in range(n)}, str(a / SAFETENSORS_WEIGHTS_NAME))
        save_file({f"m{i}.experts.w": one for i in range(n)}, str(b / SAFETENSORS_WEIGHTS_NAME))
        scanned_a, scanned_b = scan(a), scan(b)
        return calls(lambda: diff_checkpoints(scanned_a, scanned_b, reference=True))

    (_, quarter), (result, done) = diffed(1_000), diffed(4_000)
    assert done < 5 * quarter, (done, quarter)
    kinds = {c.kind: len(c.names) for c in result.reference or ()}  # type: ignore[attr-defined]
    assert kinds == {"experts-fused": 4_000}


def test_an_expert_numbered_999999999_is_reported_in_ranges(tmp_path: Path) -> None:
    """A MoE checkpoint (safetensors' `save_file`) whose one expert tensor is numbered
    999,999,999: its siblings then expect a billion experts per layer, and the missing ones
    are folded from the ids present. Before, `expert-missing` built the set of every
    expected id: `check` ran out of memory (a billion ints, about 40 GB; here the child's
    address space is held to 3 GB so that it fails instead of exhausting the machine)."""
    import resource
    import subprocess
    import sys

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    tensor = np.zeros((2, 2), np.float32)
    names = [
        f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight"
        for layer in (0, 1)
        for expert in (0, 1, 2, 3)
        for proj in ("gate_proj", "up_proj", "down_proj")
    ]
    names[-1] = "model.layers.1.mlp.experts.999999999.down_proj.weight"
    save_file(dict.fromkeys(names, tensor), str(tmp_path / SAFETENSORS_WEIGHTS_NAME))
    argv = [sys.executable, "-m", "inspector", "check", str(tmp_path), "--no-model", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, preexec_fn=limited, timeout=300)
    assert done.returncode == 1, done.stderr
    missing = [f for f in json.loads(done.stdout)["findings"] if f["code"] == "expert-missing"]
    assert [f["layer"] for f in missing] == [0, 1]
    assert "experts 4-999999999 missing (999999996 of 1000000000;" in missing[0]["message"]
    assert "experts 4-999999998 missing (999999995 of 1000000000;" in missing[1]["message"]


def test_thousands_of_wildcard_exclusions_end_in_a_finding(tmp_path: Path) -> None:
    """`exclude_modules` with 5,000 wildcard patterns against 2,000 quantized modules: not
    matched pattern by pattern (10M fnmatch calls, each recompiling past fnmatch's cache);
    over the budget the check says what it did not check, and the repair refuses."""
    from inspector._internal.checkpoint.quant_config import exclude_matcher, exclude_patterns
    from inspector._internal.checks import check
    from inspector._internal.plans.repair import plan_repair
    from inspector._internal.scan.entry import scan

    folder = tmp_path / "q"
    folder.mkdir()
    weights = {
        f"model.layers.{i}.mlp.up_proj.weight": np.zeros((1,), np.uint8) for i in range(2000)
    }
    scales = {
        f"model.layers.{i}.mlp.up_proj.weight_scale": np.ones((1,), np.float32) for i in range(2000)
    }
    save_file({**weights, **scales}, str(folder / SAFETENSORS_WEIGHTS_NAME))
    doc = {
        "quantization": {
            "quant_algo": "MIXED_PRECISION",
            "quantized_layers": {},
            "exclude_modules": [f"model.layers.{i}.*.gate*" for i in range(5000)],
        }
    }
    (folder / QUANT_CONFIG_NAME).write_text(json.dumps(doc))
    scanned = scan(folder)
    found = [f for f in check(scanned, model=False) if f.code == "check-budget-exceeded"]
    assert len(found) == 1 and "NOT checked" in found[0].message
    plan = plan_repair(scanned, only={"quant-config"})
    assert not plan.writes and "wildcard" in plan.refused[0]
    # Within the budget, exact names and globs exclude as before (the module, or its weight).
    section = {"exclude_modules": ["model.layers.0.mlp.up_proj", "model.layers.1?.*.weight"]}
    excluded = exclude_matcher(exclude_patterns(section))
    assert excluded is not None
    assert excluded("model.layers.0.mlp.up_proj") and excluded("model.layers.12.mlp.up_proj")
    assert not excluded("model.layers.2.mlp.up_proj") and not excluded("model.layers.100.mlp")


@given(st.lists(st.integers(0, 5_000), max_size=300), st.integers(1, 97))
def test_codes_grouped_by_first_without_a_step_per_code(codes: list[int], width: int) -> None:
    """The structure rule's grouping of (layer, expert) codes, done with one Python step per
    layer instead of one per expert, is the per-code loop it replaced."""
    from collections import defaultdict

    from inspector._internal.checks.structure import _by_first

    expected: dict[int, list[int]] = defaultdict(list)
    for code in sorted(set(codes)):
        expected[code // width].append(code % width)
    got = _by_first(np.asarray(codes, dtype=np.int64), width)
    assert list(got.items()) == list(expected.items())
    assert got[-1] == []  # still a defaultdict, as callers read it
