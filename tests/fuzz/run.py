"""Run the fuzz targets of `targets.py`: coverage-guided with atheris (libFuzzer) where it is
installed, otherwise with hypothesis (random and shrinking, not coverage-guided).

    python tests/fuzz/run.py --short --seconds 2400    # CI: SHORT_RUNS inputs per target
    python tests/fuzz/run.py --seconds 60              # all targets, time split evenly
    python tests/fuzz/run.py --target pickle --seconds 600 --keep   # a longer hunt

Each target starts from its corpus, `tests/fuzz/corpus/<target>/` (seeds and every crasher
ever found, replayed by `tests/test_fuzz_corpus.py`). A crash, a hang (an input over
`--timeout` seconds) or memory over `--rss-mb` fails the run; the input is written to
`build/fuzz/<target>/` and its path printed: add it to the corpus with the fix. `--keep`
also keeps the new corpus entries libFuzzer found there. The last line per target says how
many cases ran, in how many seconds and CPU seconds, crashes, hangs, and the peak RSS.

`--short` and `--runs N` bound each target by work, a number of inputs (its corpus included),
with `--seconds` only a cap: with the seed fixed, the same code then runs the same inputs
however busy the machine is, where a time budget runs fewer when the run shares the CPU.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CORPUS = HERE / "corpus"
NAMES = (
    "header",
    "index_json",
    "pickle",
    "pickle_sandbox",
    "load_config",
    "remote_answer",
    "manifest",
    "load_answer",
    "engine_answer",
    "verdict_entry",
    "torch_bin",
    "bin_pickle",
    "gguf",
    "quant_patterns",
    "gguf_metadata",
    "fit_config",
)
# Seconds one input may take, where a target needs more than --timeout: the load check
# builds models of up to 2,048 layers.
TIMEOUTS = {"load_config": 40}
# Targets `--short` leaves out: within a short run's share they (nearly) only replay their
# corpus, which tests/test_fuzz_corpus.py replays too. Measured 29 Nov 2026 with `--seconds 30`
# (2 s each): pickle_sandbox starts a sandboxed child per input (about 5 inputs a second),
# replays its 21 corpus inputs in 5 s and runs no new case; load_config builds two models per
# input, so its 12 inputs took 12-20 s to replay on a quiet machine and 50 s in a fresh
# clone's CI (transformers' modules compiled on first import), the longest job of the phase,
# for 2 s of new cases that the fixed seed makes the same ones each run. `make fuzz` runs
# every target.
REPLAY_ONLY_WHEN_SHORT = ("pickle_sandbox", "load_config")
# Inputs per target in a short run (its corpus included; libFuzzer's -runs): the smallest
# count whose edges (libFuzzer's `cov`) reached those of the 2-second run CI made before,
# rounded up. Measured 29 Nov 2026, the seed fixed, over 10 CPU-s per target: the count where
# the 2 s run's edges were reached -> its CPU-s after set-up, and what 10 s reached:
#   header 7,428 -> 1.6 (248 edges; 257 in 10 s)  index_json 63 -> 0.1 (271; 273)
#   pickle 53 -> 1.8 (421; 439)                  remote_answer 17 -> 0.2 (463; 474 in 4 s)
#   manifest 113 -> 0.5 (464; 475)               load_answer 25,300 -> 0.4 (42; 42)
#   engine_answer 9,369 -> 0.3 (37; 37)          verdict_entry 1,724 -> 1.2 (147; 148)
#   torch_bin 96 -> 1.5 (493; 521)               bin_pickle 165 -> 1.9 (516; 521)
#   gguf 82 -> 0.0 (45; 45)                      quant_patterns 24 -> 1.3 (945; 950)
#   gguf_metadata 243 -> 0.0 (44; 44)            fit_config 29 -> 1.2 (706; 707)
# (remote_answer waits on its deadlines, about 3 inputs a second: a 2 s run did not finish
# replaying its 16-input corpus, 463 edges when it had.) The targets' speeds differ a
# thousandfold (one count for all would be minutes for the slow ones), so each has its own;
# re-measure when a target changes (`--runs N` and the `edges` of each summary line).
# `make fuzz` stays bounded by time: the longer hunt.
SHORT_RUNS = {
    "header": 8000,
    "index_json": 100,
    "pickle": 60,
    "remote_answer": 20,
    "manifest": 150,
    "load_answer": 30000,
    "engine_answer": 10000,
    "verdict_entry": 2000,
    "torch_bin": 100,
    "bin_pickle": 200,
    "gguf": 100,
    "quant_patterns": 30,
    "gguf_metadata": 300,
    "fit_config": 30,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=NAMES, action="append")
    parser.add_argument("--seconds", type=float, default=60.0, help="total, split over targets")
    parser.add_argument(
        "--runs",
        type=int,
        help="inputs per target, its corpus included; --seconds is then only a cap",
    )
    parser.add_argument("--timeout", type=int, default=10, help="seconds one input may take")
    parser.add_argument("--rss-mb", type=int, default=2048, help="memory limit of the run")
    parser.add_argument("--seed", type=int, default=1, help="fixed for reproducible CI runs")
    parser.add_argument("--keep", action="store_true", help="keep new corpus entries")
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="atheris targets run at once (each is its own process, forked once the package "
        "is instrumented)",
    )
    parser.add_argument("--engine", choices=("auto", "atheris", "hypothesis"), default="auto")
    parser.add_argument(
        "--short",
        action="store_true",
        help=f"SHORT_RUNS inputs per target, --seconds only a cap; leave out "
        f"{', '.join(REPLAY_ONLY_WHEN_SHORT)} (only a corpus replay in a short run)",
    )
    parser.add_argument("--fork-server", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fork_server:
        return _fork_server(args.fork_server)
    engine = args.engine
    if engine == "auto":
        engine = "atheris" if _has_atheris() else "hypothesis"
    targets = args.target or [n for n in NAMES if not (args.short and n in REPLAY_ONLY_WHEN_SHORT)]
    per = args.seconds / len(targets)
    # Inputs per target: --runs for all, or SHORT_RUNS in a short run; else bounded by time.
    args.runs_of = {n: args.runs or (SHORT_RUNS.get(n) if args.short else None) for n in targets}
    if engine == "atheris":  # a process per target, side by side, each for its share
        results = _atheris_all(targets, per, args)
    else:  # hypothesis runs in this process: one target at a time
        results = [_hypothesis(name, per, args) for name in targets]
    return 0 if all(results) else 1


def _has_atheris() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def _out_dir(name: str) -> Path:
    out = REPO / "build" / "fuzz" / name
    out.mkdir(parents=True, exist_ok=True)
    return out


# -- atheris (libFuzzer) ------------------------------------------------------------------
#
# Instrumenting the package for coverage takes about 10 s of CPU, against 1 s for a plain
# import: done once per target, it was most of a short CI run (10 targets). So one process
# (`--fork-server`) instruments it once and forks a child per target, `--jobs` at a time;
# each child fuzzes one target with libFuzzer, its output in a log of its own.


def _atheris_all(names: list[str], seconds: float, args: argparse.Namespace) -> list[bool]:
    with tempfile.TemporaryDirectory(prefix="fuzz-") as scratch:
        plan = []
        for name in names:
            out = _out_dir(name)
            # New corpus entries go to a scratch folder first (libFuzzer writes into the
            # first corpus folder); the committed corpus is only read.
            work = out / "corpus" if args.keep else Path(scratch) / name
            work.mkdir(parents=True, exist_ok=True)
            argv = [
                str(work),
                str(CORPUS / name),
                *([f"-runs={args.runs_of[name]}"] if args.runs_of[name] else []),
                f"-max_total_time={max(1, int(seconds))}",
                f"-timeout={max(args.timeout, TIMEOUTS.get(name, 0))}",
                f"-rss_limit_mb={args.rss_mb}",
                f"-seed={args.seed}",
                "-max_len=65536",
                f"-artifact_prefix={out}/",
                "-print_final_stats=1",
            ]
            plan.append({"name": name, "argv": argv, "log": str(Path(scratch) / f"{name}.log")})
        spec = json.dumps({"jobs": max(1, args.jobs), "plan": plan})
        cmd = [sys.executable, str(Path(__file__).resolve()), "--fork-server", spec]
        server = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        ended = {}
        for line in server.stdout.splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                ended[record["name"]] = record
            else:
                print(line)
        results = []
        for item in plan:
            record = ended.get(item["name"])
            log_path = Path(item["log"])
            log = log_path.read_text(errors="replace") if log_path.is_file() else ""
            if record is None:  # the server itself failed before this target ended
                print(f"fuzz {item['name']}: FAILED, the fork server exited {server.returncode}")
                print(server.stderr[-6000:], file=sys.stderr)
                results.append(False)
                continue
            results.append(_summary(item["name"], log, record, args.runs_of[item["name"]]))
    return results


def _summary(name: str, log: str, record: dict, wanted: int | None) -> bool:
    """Print what one target's libFuzzer run did; True when it found nothing."""
    returncode = record["code"]
    runs = _stat(log, "number_of_executed_units")
    edges = re.findall(r"^#\d+\s+\w+\s+cov: (\d+)", log, re.MULTILINE)
    rss = _stat(log, "peak_rss_mb")
    errors = re.findall(r"ERROR: libFuzzer: ([\w -]+)", log)
    hangs = sum(e.startswith("timeout") for e in errors)
    oom = sum(e.startswith("out-of-memory") for e in errors)
    crashes = len(errors) - hangs - oom
    artifacts = re.findall(r"Test unit written to (\S+)", log)
    ok = returncode == 0 and not errors
    # Stopped by the time cap before its inputs were all run: said, as it ran less than asked.
    capped = ok and wanted and runs.isdigit() and int(runs) < wanted
    print(
        f"fuzz {name}: atheris, {runs} cases in {record['took']:.0f} s "
        f"({record['cpu']:.1f} CPU-s), {edges[-1] if edges else '?'} edges, "
        f"{crashes} crashes, {hangs} hangs, "
        f"{oom} over memory, peak RSS {rss} MB"
        + (f"; stopped by the time cap, {wanted} cases asked" if capped else "")
        + ("" if ok else f"; FAILED (exit {returncode}), inputs: {', '.join(artifacts)}")
    )
    if not ok:
        print(log[-6000:], file=sys.stderr)
    return ok


def _stat(log: str, key: str) -> str:
    found = re.findall(rf"stat::{key}:\s*(\d+)", log)
    return found[-1] if found else "?"


def _fork_server(spec_text: str) -> int:
    """Instrument the package once, then fuzz each target of the plan in a forked child (see
    above); one JSON line per target on stdout as it ends: its name, exit code, seconds and
    CPU seconds."""
    import atheris

    spec = json.loads(spec_text)
    started = time.monotonic()
    sys.path.insert(0, str(REPO))
    with atheris.instrument_imports(include=["inspector"]):
        import inspector._internal.formats.pickles.audit
        import inspector._internal.formats.pickles.dcp_metadata
        import inspector._internal.formats.pickles.unpickler
        import inspector._internal.formats.safetensors
        import inspector._internal.formats.torch_bin
        import inspector._internal.layouts._common
        import inspector._internal.layouts.torch_dist
        import inspector._internal.load.quant_view
        import inspector._internal.load.seal
        import inspector._internal.load.verdict
        import inspector._internal.storage.backends
        import inspector._internal.storage.guard
        import inspector._internal.storage.remote  # noqa: F401
    sys.path.insert(0, str(HERE.parent))
    from fuzz.targets import PREPARE, TARGETS

    print(f"fuzz: the package instrumented once, in {time.monotonic() - started:.0f} s")
    pending = list(spec["plan"])
    running: dict[int, tuple[dict, float]] = {}
    while pending or running:
        while pending and len(running) < spec["jobs"]:
            item = pending.pop(0)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the child: libFuzzer exits the process when its time is up
                try:
                    log = os.open(item["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    os.dup2(log, 1)
                    os.dup2(log, 2)
                    name = item["name"]
                    if name in PREPARE:
                        PREPARE[name]()
                    atheris.Setup([sys.argv[0], *item["argv"]], TARGETS[name])
                    atheris.Fuzz()
                except BaseException:
                    traceback.print_exc()
                # Only an exception gets here (the target raised: atheris printed it). Exit
                # through C's `exit`, as the interpreter does, never back into this loop: its
                # exit handler is libFuzzer's, which writes the input that did it.
                sys.stdout.flush()
                sys.stderr.flush()
                ctypes.CDLL(None).exit(1)
            running[pid] = (item, time.monotonic())
        pid, status, usage = os.wait4(-1, 0)
        item, began = running.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        took = time.monotonic() - began
        cpu = usage.ru_utime + usage.ru_stime
        record = {"name": item["name"], "code": code, "took": took, "cpu": cpu}
        print(json.dumps(record), flush=True)
    return 0


# -- hypothesis (fallback) --------------------------------------------------------------------


def _hypothesis(name: str, seconds: float, args: argparse.Namespace) -> bool:
    import resource

    from hypothesis import HealthCheck, Phase, given, seed, settings
    from hypothesis import strategies as st

    sys.path.insert(0, str(HERE.parent))
    from fuzz.targets import PREPARE, TARGETS

    target = TARGETS[name]
    if name in PREPARE:
        PREPARE[name]()
    timeout = max(args.timeout, TIMEOUTS.get(name, 0))
    seeds = [p.read_bytes() for p in sorted((CORPUS / name).iterdir()) if p.is_file()]
    started = time.monotonic()
    cpu_before = _cpu_seconds()
    deadline = started + seconds
    count = {"runs": 0, "slow": 0}

    # Seeds mutated byte-wise, plus raw bytes: no coverage feedback, so bias towards inputs
    # near the real formats.
    def mutate(data: bytes, edits: list[tuple[int, int]]) -> bytes:
        buf = bytearray(data)
        for pos, value in edits:
            if buf:
                buf[pos % len(buf)] = value
        return bytes(buf)

    inputs = st.one_of(
        st.binary(max_size=4096),
        st.builds(
            mutate,
            st.sampled_from(seeds or [b""]),
            st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=8),
        ),
    )

    def run_batch(batch: int, cases: int) -> None:
        @seed(args.seed + batch)
        @settings(
            max_examples=cases,
            deadline=None,
            database=None,
            phases=[Phase.generate, Phase.shrink],
            suppress_health_check=list(HealthCheck),
        )
        @given(inputs)
        def run(data: bytes) -> None:
            count["runs"] += 1
            start = time.monotonic()
            target(data)
            if time.monotonic() - start > timeout:
                count["slow"] += 1
                raise AssertionError(f"one input took over {timeout} s")

        run()

    wanted = args.runs_of[name]

    def left() -> int:  # cases still to run: --runs counts the corpus in, as libFuzzer does
        return 200 if wanted is None else wanted - count["runs"]

    ok = True
    try:
        for data in seeds:
            count["runs"] += 1
            target(data)
        batch = 0
        while time.monotonic() < deadline and left() > 0:
            before = count["runs"]
            run_batch(batch, min(200, left()))
            batch += 1
            if count["runs"] == before:  # hypothesis generated nothing more: never a busy loop
                break
    except Exception as exc:  # the failing input is in the hypothesis report above
        ok = False
        print(f"fuzz {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    capped = ok and wanted and count["runs"] < wanted
    print(
        f"fuzz {name}: hypothesis, {count['runs']} cases in {time.monotonic() - started:.0f} s "
        f"({_cpu_seconds() - cpu_before:.1f} CPU-s), "
        f"{0 if ok else 1} crashes, {count['slow']} hangs, peak RSS {rss} MB"
        + (f"; stopped by the time cap, {wanted} cases asked" if capped else "")
    )
    return ok


def _cpu_seconds() -> float:
    """This process's CPU seconds and its finished children's (a target may start one)."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
