"""Every input of the fuzz corpus (`tests/fuzz/corpus/<target>/`: seeds and every crasher
the fuzzers ever found) replayed through its target: the properties of `tests/fuzz/targets.py`
hold, and no input takes long (in CPU seconds, this process's and its finished children's:
the sandbox target reads in a child, and a wall clock would measure the machine's load)."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest
from fuzz.run import NAMES, REPLAY_ONLY_WHEN_SHORT, SHORT_RUNS
from fuzz.targets import PREPARE, TARGETS

CORPUS = Path(__file__).parent / "fuzz" / "corpus"
CASES = sorted(
    (target, path)
    for target in TARGETS
    for path in (CORPUS / target).iterdir()
    if path.is_file() and not path.name.startswith(".")
)


def test_every_target_has_a_corpus() -> None:
    assert {target for target, _ in CASES} == set(TARGETS)


def test_the_fuzz_run_runs_every_target() -> None:
    """`make fuzz` and CI run the targets `run.py` names: a target missing there is only ever
    replayed from its corpus, never fuzzed."""
    assert sorted(NAMES) == sorted(TARGETS)
    # and the short run (CI's) gives each target it fuzzes a number of inputs
    assert set(SHORT_RUNS) == set(NAMES) - set(REPLAY_ONLY_WHEN_SHORT)


def test_a_fuzz_run_bounded_by_work_runs_that_many_cases() -> None:
    """`--runs N` (the CI's fuzz run, beside pytest) runs N inputs per target, its corpus
    included, however long they take: with the fixed seed, the same inputs each time. The
    hypothesis engine here (atheris hands N to libFuzzer as `-runs`, which counts the same)."""
    argv = ["--engine", "hypothesis", "--target", "header", "--runs", "25", "--seconds", "600"]
    run = subprocess.run(
        [sys.executable, str(CORPUS.parent / "run.py"), *argv],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "fuzz header: hypothesis, 25 cases in " in run.stdout
    assert "time cap" not in run.stdout


@pytest.mark.timeout(120)  # a target's one-time set-up (PREPARE) included
@pytest.mark.parametrize(("target", "path"), CASES, ids=[f"{t}/{p.name}" for t, p in CASES])
def test_corpus_input(target: str, path: Path) -> None:
    if target in PREPARE:
        PREPARE[target]()  # once per process: imports and a checkpoint, not timed
    start = _cpu_seconds()
    TARGETS[target](path.read_bytes())
    assert _cpu_seconds() - start < 10, "an input this small must not take seconds of CPU"


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
