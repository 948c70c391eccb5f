"""What a start costs: `import inspector`, `ckpt-inspect --version` and `--help` import none of
the heavy libraries (each costs a user 0.1-8 s on every command); the command modules are
imported only when their command runs. Not timed (benchmarks/bench_start.py measures):
these tests read which modules a fresh process imported."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from inspector._internal.cli.main import ARROW_POOL_ENV, BLAS_THREADS_ENV

# The libraries that make a start slow: pandas and pyarrow about 0.4 s, numpy 0.06 s, torch
# and transformers 8 s together, the remote stack (asyncio's aiohttp, fsspec), the figures.
HEAVY = (
    "numpy",
    "pandas",
    "pyarrow",
    "torch",
    "transformers",
    "aiohttp",
    "fsspec",
    "plotly",
    "ipywidgets",
    "yaml",
)


# Runs `python -m inspector ARGS` (or `import inspector`) in this child, then writes the
# names of the modules it imported as the last line of stderr.
_PROBE = """
import runpy, sys
argv = sys.argv[1:]
try:
    if argv == ["import"]:
        import inspector
    else:
        sys.argv = ["ckpt-inspect", *argv]
        runpy.run_module("inspector", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
print(" ".join(sorted(sys.modules)), file=sys.stderr)
"""


def _imported(*argv: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run the CLI with ARGV (or just `import inspector`) in a fresh process; its output and
    the modules it imported."""
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    lines = proc.stderr.splitlines()
    return proc, set(lines[-1].split()) if lines else set()


@pytest.mark.parametrize(
    "argv",
    [
        ("import",),
        ("--version",),
        ("--help",),
    ],
    ids=["import inspector", "--version", "--help"],
)
def test_a_start_imports_no_heavy_library(argv: tuple[str, ...]) -> None:
    proc, names = _imported(*argv)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "inspector" in names
    heavy = sorted(n for n in names if n.split(".")[0] in HEAVY)
    assert not heavy, f"{argv} imported {heavy[:10]}"
    commands = sorted(n for n in names if n.startswith("inspector._internal.cli."))
    assert set(commands) <= {"inspector._internal.cli.main"}, commands


def test_version_names_the_installed_distribution() -> None:
    from importlib.metadata import version

    proc, names = _imported("--version")
    assert proc.stdout.strip() == f"ckpt-inspect {version('checkpoint-inspector')}"
    assert "inspector.widgets.report" not in names


def test_help_lists_every_command_with_its_line_and_imports_only_the_one_asked_for() -> None:
    from inspector._internal.cli.main import COMMANDS

    proc, _ = _imported("--help")
    listed = " ".join(proc.stdout.split())
    for command in COMMANDS:
        assert " ".join(command.help.split()) in listed, command.name
    assert "report" in listed  # the plugin command of inspector.widgets

    proc, names = _imported("scan", "--help")
    assert proc.returncode == 0 and "--header-cap" in proc.stdout
    commands = {n for n in names if n.startswith("inspector._internal.cli.")}
    assert "inspector._internal.cli.scan" in commands
    assert not commands & {"inspector._internal.cli.check", "inspector._internal.cli.repair"}


def _every_command() -> list[str]:
    from inspector._internal.cli.main import _commands

    return [c.name for c in _commands()]


@pytest.mark.parametrize("command", _every_command())
def test_a_command_help_shows_its_options_and_imports_no_heavy_library(command: str) -> None:
    """`<command> --help` defines the command's options (its module and the shared option
    builders, which import the readers only when the command runs) and prints every one."""
    from inspector._internal.cli.main import _parser

    proc, names = _imported(command, "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    heavy = sorted(n for n in names if n.split(".")[0] in HEAVY)
    assert not heavy, f"{command} --help imported {heavy[:10]}"
    (sub,) = (a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    options = {o for a in sub.choices[command]._actions for o in a.option_strings}
    shown = set(re.findall(r"(?<![\w-])--?[\w][\w-]*", proc.stdout))
    assert options <= shown, sorted(options - shown)


def test_a_broken_plugin_command_is_left_out_and_every_other_command_still_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another package's entry point that does not import, or takes a built-in's name, costs
    one line on stderr, not the CLI."""
    from importlib.metadata import EntryPoint

    from inspector._internal.cli import main as cli_main

    group = cli_main.PLUGIN_GROUP
    broken = [
        EntryPoint("gone", "no_such_module_of_a_plugin", group),
        EntryPoint("helpless", "json", group),
        EntryPoint("scan", "inspector.widgets.cli", group),
        EntryPoint("report", "inspector.widgets.cli", group),
    ]
    monkeypatch.setattr(cli_main, "entry_points", lambda group: broken)
    cli_main._commands.cache_clear()
    try:
        with pytest.raises(SystemExit) as exit_:
            cli_main.main(["--help"])
        out, err = capsys.readouterr()
        assert exit_.value.code == 0
        assert "'gone'" in err and "no_such_module_of_a_plugin" in err
        assert "'scan' of the entry point 'inspector.widgets.cli' is left out" in err
        assert "is a built-in command; reinstall or uninstall" in err
        assert "'helpless' of the entry point 'json' is left out: its module has no HELP" in err
        assert "report" in out and "summarize a checkpoint" in out
        assert cli_main.main(["codes", "--json"]) == 0
    finally:
        cli_main._commands.cache_clear()


# The modules a scan of a local folder never needs: the remote stack's asyncio and ssl, and
# yaml (a compressed-tensors recipe only). Each costs every scan and check CPU at import.
_REMOTE_OR_RECIPE = ("asyncio", "ssl", "yaml")


@pytest.mark.parametrize("command", [("scan",), ("check", "--no-model")])
def test_a_local_scan_imports_neither_the_remote_stack_nor_yaml(
    command: tuple[str, ...], write_state_dict: Callable[..., Path]
) -> None:
    import torch

    folder = write_state_dict({"a.weight": torch.zeros(4, 4), "b.weight": torch.zeros(4)})
    probe = _PROBE.replace(
        'print(" ".join(sorted(sys.modules))',
        "import os, pyarrow\nprint(pyarrow.default_memory_pool().backend_name, file=sys.stderr)\n"
        f"print(os.environ.get('{BLAS_THREADS_ENV}'), file=sys.stderr)\n"
        'print(" ".join(sorted(sys.modules))',
    )
    env = {k: v for k, v in os.environ.items() if k not in (ARROW_POOL_ENV, BLAS_THREADS_ENV)}
    proc = subprocess.run(
        [sys.executable, "-c", probe, *command, str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    *_, pool, blas_threads, modules = proc.stderr.splitlines()
    imported = sorted(n for n in modules.split() if n.split(".")[0] in _REMOTE_OR_RECIPE)
    assert not imported, f"{command} imported {imported}"
    # The tables' Arrow columns reuse the heap numpy freed (cli.main.ARROW_POOL_ENV).
    assert pool == "system"
    # numpy's OpenBLAS was loaded with one thread (cli.main.BLAS_THREADS_ENV).
    assert blas_threads == "1"


@pytest.mark.parametrize(
    "argv",
    [
        ("scan",),
        ("scan", "--json"),
        ("check", "--no-model"),
        ("check", "--no-model", "--json"),
        ("check", "--no-model", "--verbose"),
        ("check", "--no-model", "--format", "sarif"),
        ("check", "--no-model", "--format", "junit"),
    ],
    ids=" ".join,
)
def test_scan_and_check_without_the_model_import_no_pandas(
    argv: tuple[str, ...], demo_checkpoints: Path
) -> None:
    """`scan`'s summary, `check --no-model`'s rules and their issues come from the numpy
    columns (`checkpoint.tables.scan_columns`): pandas and pyarrow (a quarter second of every
    such command's CPU) are imported only by what needs a table. One sharded MoE demo with
    MTP layers and a missing expert range, in every output form."""
    folder = demo_checkpoints / "megatron-3624-mtp-extra-state"
    proc, names = _imported(*argv, str(folder))
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    # What each says: the summary's tensor count, the check's finding (the MTP block's
    # _extra_state keys) in every form.
    assert ("tensors" if argv[0] == "scan" else "layer-keyset-outlier") in proc.stdout
    tabular = sorted(n for n in names if n.split(".")[0] in ("pandas", "pyarrow"))
    assert not tabular, f"{argv} imported {tabular[:10]}"


# What a built-in command never needs: importlib.metadata (about 25 ms of every process) and the
# entry-point lookup (9 ms more, every installed distribution's metadata read), which only the
# top-level help and the plugin commands, `--version`, the notebook UI, a kept load verdict,
# a SARIF log and a manifest (the last two name the tool's version) use.
@pytest.mark.parametrize(
    "argv",
    [
        ("import",),
        ("scan", "--help"),
        ("scan", "{demo}"),
        ("check", "--no-model", "{demo}"),
        ("check", "--no-model", "--format", "junit", "{demo}"),
        ("verify", "--level", "size", "{demo}"),
    ],
    ids=[
        "import inspector",
        "scan --help",
        "scan",
        "check --no-model",
        "check --format junit",
        "verify",
    ],
)
def test_a_built_in_command_imports_no_package_metadata(
    argv: tuple[str, ...], demo_checkpoints: Path
) -> None:
    demo = str(demo_checkpoints / "megatron-3624-mtp-extra-state")
    proc, names = _imported(*(a.format(demo=demo) for a in argv))
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert "inspector" in names
    assert "importlib.metadata" not in names


@pytest.mark.parametrize(
    ("argv", "lists"),
    [
        (["scan", "folder"], False),
        (["scan", "--help"], False),
        (["--", "check", "folder"], False),
        (["--version"], False),
        (["--vers", "scan"], False),
        (["--help"], True),
        (["-h", "scan"], True),
        (["--he", "scan"], True),  # argparse's abbreviation: the top-level help
        (["report", "folder"], True),
        (["completion", "bash"], True),  # writes the whole parser
        (["no-such-command"], True),  # argparse's error lists every command
        ([], True),
    ],
)
def test_plugin_commands_are_looked_up_only_when_the_parse_needs_them(
    argv: list[str], lists: bool
) -> None:
    from inspector._internal.cli.main import _lists_plugins

    assert _lists_plugins(argv) is lists


def test_the_top_level_help_before_a_built_in_command_still_lists_the_plugin_commands() -> None:
    proc, _ = _imported("--help", "scan")
    assert proc.returncode == 0
    assert re.search(r"^ +report +write a self-contained", proc.stdout, re.M)
    proc, _ = _imported("report", "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: ckpt-inspect report")


def test_the_dashboard_starts_without_pandas_or_plotly(demo_checkpoints: Path) -> None:
    """The dashboard's start (the scan, the plain checks, the Overview, the spinners' counts,
    the snapshot's figure list) reads the scan's numpy columns and figures: pandas, pyarrow and
    plotly are imported when a tab or a figure first needs them, in a fresh interpreter."""
    code = (
        "import sys\n"
        "from inspector.widgets import Dashboard\n"
        "from inspector.widgets.snapshot import figure_names\n"
        f"dash = Dashboard({str(demo_checkpoints / 'healthy-hf-sharded')!r}, model=False,"
        " progress=False)\n"
        "assert 'expert coverage' in figure_names(dash.current)\n"
        "print(' '.join(sorted({'pandas', 'pyarrow', 'plotly'} & set(sys.modules))))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == []


def test_main_given_argv_leaves_the_callers_blas_threads_alone(tmp_path: Path) -> None:
    """One OpenBLAS thread is the command's own process setting (`cli.main.BLAS_THREADS_ENV`):
    a program that calls `main(argv)` before importing numpy keeps OpenBLAS's threads."""
    probe = (
        "import os, sys\n"
        "from inspector._internal.cli.main import main\n"
        "main(['scan', sys.argv[1]])\n"
        f"print(os.environ.get('{BLAS_THREADS_ENV}'), file=sys.stderr)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != BLAS_THREADS_ENV}
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    assert proc.stderr.splitlines()[-1] == "None", proc.stderr[-2000:]
