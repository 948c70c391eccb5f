"""`make coverage`'s summary: line coverage by folder, then inspector/, widgets/ and both
together, read from coverage's JSON report; `--against OLD.json` adds the files whose
covered statements fell most since another run (another commit's report, say).

    python tests/coverage_table.py build/coverage/coverage.json [--against OLD.json]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path, PurePosixPath

# The two parts the totals are given for: the core and the notebook UI (installed as
# inspector.widgets, measured in its own folder).
PARTS = ("inspector", "widgets")


def _files(report: Path) -> dict[str, tuple[int, int]]:
    """Each measured file's (statements, missed), keyed by its path from the repository."""
    data = json.loads(report.read_text())
    return {
        PurePosixPath(name).as_posix(): (
            entry["summary"]["num_statements"],
            entry["summary"]["missing_lines"],
        )
        for name, entry in data["files"].items()
    }


def _row(label: str, statements: int, missed: int) -> str:
    percent = 100.0 * (statements - missed) / statements if statements else 100.0
    return f"{label:<44} {statements:>7} {missed:>7} {percent:>6.1f}%"


def table(files: dict[str, tuple[int, int]]) -> list[str]:
    """Lines of the folder table and the three totals."""
    folders: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    parts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for name, (statements, missed) in files.items():
        path = PurePosixPath(name)
        for key, sums in ((str(path.parent) + "/", folders), (path.parts[0], parts)):
            sums[key][0] += statements
            sums[key][1] += missed
    lines = [f"{'folder':<44} {'stmts':>7} {'missed':>7} {'cover':>7}"]
    lines += [_row(folder, *folders[folder]) for folder in sorted(folders)]
    lines.append("")
    for part in PARTS:
        lines.append(_row(f"total {part}/", *parts.get(part, [0, 0])))
    statements = sum(s for s, _ in files.values())
    missed = sum(m for _, m in files.values())
    lines.append(_row("TOTAL", statements, missed))
    return lines


def drops(
    files: dict[str, tuple[int, int]], old: dict[str, tuple[int, int]], *, count: int = 25
) -> list[str]:
    """The files whose covered statements fell most from `old` to `files` (a file gone or
    moved counts as all of its covered statements lost, a new one as all gained)."""
    covered = {name: s - m for name, (s, m) in files.items()}
    covered_old = {name: s - m for name, (s, m) in old.items()}
    change = {
        name: covered.get(name, 0) - covered_old.get(name, 0) for name in covered | covered_old
    }
    fallen = sorted((delta, name) for name, delta in change.items() if delta < 0)[:count]
    lines = [f"{'file (covered statements: old -> new)':<60} {'change':>7}"]
    for delta, name in fallen:
        pair = f"{covered_old.get(name, 0)} -> {covered.get(name, 0)}"
        lines.append(f"{name + ' (' + pair + ')':<60} {delta:>7}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="coverage's JSON report (coverage json)")
    parser.add_argument("--against", type=Path, help="another run's JSON report, to compare")
    args = parser.parse_args()
    files = _files(args.report)
    print("\n".join(table(files)))
    if args.against is not None:
        print()
        print("\n".join(drops(files, _files(args.against))))


if __name__ == "__main__":
    main()
