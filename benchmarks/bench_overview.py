"""The dashboard's Overview in a fresh kernel, no browser: from sending the cell until the
Overview's widget messages are on the wire, and until "Will it load?" arrives.

Each run starts a new kernel (jupyter_client, the project's interpreter), runs `import os` to
have it up, then sends the dashboard cell as JupyterLab does (`allow_stdin` true: not
headless) and stamps every IOPub message as it arrives: the Overview is on the wire when the
dashboard's `display_data` (its widget view) arrives (IOPub is ordered: the Overview's
`comm_open`s came before it); the verdict when a widget whose value is the "Will it load?"
answer (`data-loads` other than `pending`) arrives. Each kernel keeps its verdicts in a fresh
empty cache folder, so the verdict is computed (a first look; bench_verdict_cache.py measures
the second).

Each case also reports the kernel process's CPU seconds from sending the cell until the
Overview is on the wire (user + system, every thread of the kernel): on the shared machine
the wall times follow the load, the CPU seconds far less. The kernels write bytecode for
what they import (a session that sets PYTHONDONTWRITEBYTECODE had every kernel compile
pandas and ipywidgets from source again, 1.8 s of a 5 s cell), and one untimed cell runs
first, so that no round pays for it.

Cases, run once per round, the rounds interleaved; best and median kept:
- `floor`: a cell that only reads every shard's header and `json.loads` it (the stdlib),
  until the cell's reply;
- `this tree`: the dashboard cell on this tree's code;
- `child with the scan` (`--orders`): the same, with the load check's child started as the
  scan starts instead of once the Overview is sent;
- `baseline` (`--baseline TREE`, e.g. `git archive main | tar -x -C /tmp/base`): the
  dashboard cell on an older tree, run from an overlay that maps `inspector.widgets` to its
  `widgets/` folder; `--baseline` again for more trees (a merge of branches made with `git
  merge-tree --write-tree` and `git archive`), each case named `baseline FOLDER`.

`--profile N`: one more kernel runs the cell under cProfile (the kernel's main thread: the
scan, the plain checks, building and sending the Overview) and prints the N costliest
functions by cumulative and by own time, in CPU seconds of that thread (`time.thread_time`:
the wall clock counted the time the loaded machine gave to other processes).

    .venv/bin/python benchmarks/bench_overview.py [--runs 3] [--tensors 300000]
        [--baseline TREE ...] [--orders] [--profile 30] [--lost 40:17-19]

Target: the Overview under 2 s after the cell at 300,000 tensors.
"""

from __future__ import annotations

import argparse
import compileall
import dataclasses
import os
import queue
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from _synthetic import ensure_checkpoint, spec_for, tensor_count  # noqa: E402
from bench_cli import HEADER_FLOOR  # noqa: E402

from inspector._internal.load.cache import CACHE_ENV  # noqa: E402

TARGET = 2.0
_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_DASHBOARD = "Checkpoint dashboard of"  # how the dashboard's view begins in text/plain
_OVERVIEW_HEAD = "ckpt-overview-verdict"  # the Overview's first line (its issues)
_STILL_CHECKING = "checking the "  # what it says while rules still run (widgets/state.py)

# The header floor (bench_cli's: read every shard's header and json.loads it) in the kernel.
FLOOR_CELL = "import sys\nsys.argv[1:] = [{folder!r}]\n" + HEADER_FLOOR.replace("print(count)", "")
DASHBOARD_CELL = """\
from inspector.widgets import Dashboard
dash = Dashboard({folder!r})
dash
"""
# The load check's child started with the scan (item 3 of issue 33), for a side-by-side run.
WITH_SCAN_CELL = (
    """\
import inspector.widgets.dashboard as _dashboard
_dashboard.VERDICT_WITH_SCAN = True
"""
    + DASHBOARD_CELL
)
PROFILE_CELL = """\
import cProfile, io, pstats, time
from IPython.display import display
_profile = cProfile.Profile(time.thread_time)
_profile.enable()
from inspector.widgets import Dashboard
dash = Dashboard({folder!r})
display(dash)
_profile.disable()
for _key in ("cumulative", "tottime"):
    _out = io.StringIO()
    pstats.Stats(_profile, stream=_out).sort_stats(_key).print_stats({top})
    print(_out.getvalue())
"""


@dataclasses.dataclass
class Run:
    """One cell in one fresh kernel: seconds after sending it."""

    overview: float = float("nan")  # the dashboard's display_data arrived
    checked: float = float("nan")  # an Overview with every plain rule's findings arrived
    verdict: float = float("nan")  # "Will it load?" with its answer arrived
    reply: float = float("nan")  # the cell's execute_reply
    comms: int = 0  # widget models opened before the Overview was on the wire
    cpu: float = float("nan")  # the kernel's CPU seconds from sending the cell to the Overview
    load: float = 0.0  # the 1-minute load average as the cell was sent


def overlay(tree: Path) -> Path:
    """A folder whose `inspector` package is `tree`'s, with `inspector.widgets` its
    `widgets/` folder (as the installed package has it), made of symbolic links."""
    root = Path(tempfile.mkdtemp(prefix="bench-overview-tree-"))
    package = root / "inspector"
    package.mkdir()
    for entry in (tree / "inspector").iterdir():
        (package / entry.name).symlink_to(entry)
    (package / "widgets").symlink_to(tree / "widgets")
    return root


def run_cell(code: str, *, pythonpath: Path | None, until: str, echo: bool) -> Run:
    """Start a kernel, run `code` in it and time its IOPub messages until the cell's reply
    and then `until` ("reply", "checked": every plain rule's findings, "verdict")."""
    import psutil
    from jupyter_client.manager import KernelManager

    env = {**os.environ, CACHE_ENV: tempfile.mkdtemp(prefix="bench-overview-")}
    # As an installed package's modules are: compiled once, then read as bytecode.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=env, cwd=str(pythonpath or ROOT))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        kc.execute_interactive("import os", timeout=60)
        kernel = psutil.Process(km.provisioner.process.pid)
        run = Run(load=os.getloadavg()[0])
        cpu0 = sum(kernel.cpu_times()[:2])
        values: dict[str, str] = {}  # each widget's `value` when it opened
        t0 = time.perf_counter()
        sent = kc.execute(code, allow_stdin=True)
        deadline = t0 + 300
        while time.perf_counter() < deadline:
            try:
                msg = kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            now = time.perf_counter() - t0
            kind, content = msg["msg_type"], msg["content"]
            if kind == "comm_open" and run.overview != run.overview:
                run.comms += 1
            data = content.get("data", {})
            # The dashboard's view (the progress bars' Output is displayed before it).
            dashboard = _WIDGET_VIEW in data and _DASHBOARD in data.get("text/plain", "")
            if kind == "display_data" and dashboard and run.overview != run.overview:
                run.overview = now
                run.cpu = sum(kernel.cpu_times()[:2]) - cpu0
            state = content.get("data", {}).get("state", {})
            value = str(state.get("value", ""))
            if kind == "comm_open":
                values[content.get("comm_id")] = value
            # A widget gets its CSS class in an update after it opened (`add_class`).
            head = _OVERVIEW_HEAD in state.get("_dom_classes", ())
            shown = values.get(content.get("comm_id"), "")
            if head and run.checked != run.checked and _STILL_CHECKING not in shown:
                run.checked = now  # the first Overview: sent before its view, stamped at it
            answer = "class='ckpt-load'" in value and "data-loads='pending'" not in value
            if kind in ("comm_open", "comm_msg") and answer and run.verdict != run.verdict:
                run.verdict = now
            if kind == "stream" and echo:
                print(content["text"], end="")
            if kind == "error":
                print("\n".join(content["traceback"]), file=sys.stderr)
            if (
                kind == "status"
                and content["execution_state"] == "idle"
                and msg["parent_header"].get("msg_id") == sent
            ):
                run.reply = now
                if run.cpu != run.cpu:  # a cell that shows no dashboard (the floor)
                    run.cpu = sum(kernel.cpu_times()[:2]) - cpu0
            last = {"reply": run.reply, "checked": run.checked, "verdict": run.verdict}[until]
            if run.reply == run.reply and last == last:
                break
        return run
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--tensors", type=int, default=300_000)
    parser.add_argument("--lost", default="", metavar="LAYER:FIRST-LAST")
    parser.add_argument(
        "--baseline",
        type=Path,
        action="append",
        default=[],
        help="an older tree, run side by side (again for more: each named by its folder)",
    )
    parser.add_argument(
        "--orders", action="store_true", help="also the load check's child started with the scan"
    )
    parser.add_argument(
        "--no-verdict",
        action="store_true",
        help="stop once every plain rule's findings are on the wire, not at the verdict",
    )
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="profile the cell")
    parser.add_argument(
        "--only-profile", action="store_true", help="the profile alone, no timed rounds"
    )
    args = parser.parse_args(argv)
    print("load average (1, 5, 15 min) at the start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    spec = dataclasses.replace(spec_for(tensors=args.tensors, shards=147), lost=args.lost)
    folder = str(ensure_checkpoint(spec))
    print(f"checkpoint: {folder} ({tensor_count(spec):,} tensors)")
    trees = {"this tree": ROOT}
    for tree in args.baseline:
        trees[_baseline_name(tree, args.baseline)] = tree.resolve()
    for tree in trees.values():  # bytecode, as an installed package has it
        for package in ("inspector", "widgets"):
            compileall.compile_dir(tree / package, quiet=1)
    cases: dict[str, tuple[str, Path | None]] = {}
    if not args.only_profile:
        cases["floor"] = (FLOOR_CELL.format(folder=folder), None)
        cases["this tree"] = (DASHBOARD_CELL.format(folder=folder), None)
        if args.orders:
            cases["child with the scan"] = (WITH_SCAN_CELL.format(folder=folder), None)
        for tree in args.baseline:
            name = _baseline_name(tree, args.baseline)
            cases[name] = (DASHBOARD_CELL.format(folder=folder), overlay(trees[name]))
    runs: dict[str, list[Run]] = {name: [] for name in cases}
    if "this tree" in cases:
        run_cell(cases["this tree"][0], pythonpath=None, until="reply", echo=False)
        print("warm-up cell run (bytecode of what the kernel imports, files in the page cache)")
    for round_ in range(args.runs if cases else 0):
        for name, (code, path) in cases.items():
            until = "reply" if name == "floor" else "checked" if args.no_verdict else "verdict"
            run = run_cell(code, pythonpath=path, until=until, echo=False)
            runs[name].append(run)
            print(
                f"round {round_ + 1} {name:20} overview {run.overview:6.2f} s  every plain "
                f"rule {max(run.checked, run.overview):6.2f} s  verdict "
                f"{run.verdict:6.2f} s  reply {run.reply:6.2f} s  widgets {run.comms:4}  "
                f"kernel CPU {run.cpu:5.2f} s  "
                f"[load {run.load:.2f}]",
                flush=True,
            )
    if cases:
        _table(runs)
    if args.profile:
        print(f"\n-- cProfile of the dashboard cell in a fresh kernel (top {args.profile}) --")
        run_cell(
            PROFILE_CELL.format(folder=folder, top=args.profile),
            pythonpath=None,
            until="reply",
            echo=True,
        )
    print("load average (1, 5, 15 min) at the end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    return 0


def _baseline_name(tree: Path, trees: list[Path]) -> str:
    """`baseline`, or with several, `baseline NAME` (the tree's folder name)."""
    return "baseline" if len(trees) == 1 else f"baseline {tree.resolve().name}"[:22]


def _table(runs: dict[str, list[Run]]) -> None:
    floor = min(r.reply for r in runs["floor"])
    print(
        f"\n{'case':22}{'Overview best / median':>26}{'x floor':>9}"
        f"{'kernel CPU-s, median':>22}"
        f"{'every plain rule, median':>26}{'verdict best / median':>26}"
    )
    for name, rs in runs.items():
        shown = [r.reply if name == "floor" else r.overview for r in rs]
        verdicts = [r.verdict for r in rs if r.verdict == r.verdict]
        verdict = (
            f"{min(verdicts):8.2f} s / {statistics.median(verdicts):6.2f} s" if verdicts else "-"
        )
        checked = [max(r.checked, r.overview) for r in rs if r.checked == r.checked]
        plain = f"{statistics.median(checked):8.2f} s" if checked else "-"
        cpus = [r.cpu for r in rs if r.cpu == r.cpu]
        cpu = f"{statistics.median(cpus):8.2f} s" if cpus else "-"
        print(
            f"{name:22}{min(shown):10.2f} s / {statistics.median(shown):6.2f} s"
            f"{min(shown) / floor:8.2f}x{cpu:>22}{plain:>26}{verdict:>26}"
        )
    print(f"target: the Overview under {TARGET:g} s")


if __name__ == "__main__":
    raise SystemExit(main())
