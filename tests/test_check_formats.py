"""`check` as a CI gate (issue 34, item 7): `--format sarif` (validated against the SARIF
2.1.0 schema OASIS publishes, tests/fixtures/sarif), `--format junit`, `--json` as the alias
of `--format json`, the pre-commit hook and the shell completion. And the attacks on the new
formats: names with control characters, markup and XML/JSON breakers from a hostile
checkpoint, and a checkpoint with thousands of findings (bounded output)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest
from safetensors.numpy import save_file
from test_hostile_names import CONTROL, ESCAPES, hostile_folder

from inspector._internal.common.filenames import INDEX_NAME
from inspector._internal.findings.codes import code_of
from inspector._internal.findings.finding import FOLD

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "tests" / "fixtures" / "sarif" / "sarif-schema-2.1.0.json"
DRIFT = "modelopt-1422-sidecar-drift"


def sarif_errors(log: dict) -> list[str]:
    """What the SARIF 2.1.0 schema says is wrong with `log` (Draft 4, as the schema says)."""
    from jsonschema import Draft4Validator  # nbformat's dependency (the dev extra)

    validator = Draft4Validator(json.loads(SCHEMA.read_text()))
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(log)]


# What a viewer takes for an embedded link in a plain text message (SARIF 2.1.0 §3.11.6):
# an unescaped '[', link text, ']', then '(' a target ')'.
EMBEDDED_LINK = re.compile(r"(?<!\\)(?:\\\\)*\[(?:[^\\\[\]]|\\.)*\]\([^)]*\)")


def sarif_unescape(text: str) -> str:
    """A SARIF plain text message as a viewer shows it: `\\[`, `\\]`, `\\\\` are the characters."""
    return re.sub(r"\\([\\\[\]])", r"\1", text)


def test_sarif_is_one_valid_result_per_finding_with_rules_from_the_code_table(
    demo_checkpoints: Path, cli
) -> None:
    folder = demo_checkpoints / DRIFT
    run = cli("check", folder, "--format", "sarif")
    assert run.returncode == 1, run.stderr  # the exit code follows --fail-on in every format
    log = json.loads(run.stdout)
    assert sarif_errors(log) == []
    doc = json.loads(cli("check", folder, "--format", "json").stdout)
    (sarif,) = log["runs"]
    results = sarif["results"]
    assert len(results) == len(doc["findings"]) == 44
    rules = sarif["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == list(dict.fromkeys(f["code"] for f in doc["findings"]))
    for rule in rules:
        code = code_of(rule["id"])
        assert rule["fullDescription"]["text"] == code.help
        assert code.fix.text in rule["help"]["text"]
        level = {"error": "error", "warning": "warning", "info": "note"}[code.severity]
        assert rule["defaultConfiguration"]["level"] == level
    for result, finding in zip(results, doc["findings"], strict=True):
        assert result["ruleId"] == finding["code"] == rules[result["ruleIndex"]]["id"]
        assert sarif_unescape(result["message"]["text"]) == finding["message"]
        location = result["locations"][0]["physicalLocation"]["artifactLocation"]
        assert location["uriBaseId"] == "CHECKPOINT"
        assert unquote(location["uri"]) == (finding["file"] or "./")
    base = sarif["originalUriBaseIds"]["CHECKPOINT"]["uri"]
    assert base == folder.resolve().as_uri() + "/"
    # A tensor is a logical location: its exact name for scripts.
    named = [r for r in results if r["properties"]["tensor"]]
    assert named and all(
        r["locations"][0]["logicalLocations"][0]["fullyQualifiedName"] == r["properties"]["tensor"]
        for r in named
    )


def test_a_clean_checkpoint_is_a_valid_empty_log_and_one_passing_test(
    demo_checkpoints: Path, cli
) -> None:
    folder = demo_checkpoints / "healthy-hf-sharded"
    run = cli("check", folder, "--format", "sarif")
    log = json.loads(run.stdout)
    assert run.returncode == 0 and sarif_errors(log) == [] and log["runs"][0]["results"] == []
    run = cli("check", folder, "--format", "junit")
    suite = ET.fromstring(run.stdout).find("testsuite")
    assert run.returncode == 0 and suite is not None
    assert (suite.get("tests"), suite.get("failures")) == ("1", "0")
    assert [c.get("name") for c in suite.iter("testcase")] == ["no findings"]


@pytest.mark.parametrize(("fail_on", "failing"), [("error", 2), ("warning", 4), ("never", 0)])
def test_junit_has_a_case_per_code_failing_as_fail_on_says(
    demo_checkpoints: Path, fail_on: str, failing: int, cli
) -> None:
    run = cli("check", demo_checkpoints / DRIFT, "--format", "junit", "--fail-on", fail_on)
    assert run.returncode == (1 if failing else 0)
    root = ET.fromstring(run.stdout)
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert set(cases) == {
        "sidecar-unlisted-tensor",
        "unindexed-tensor",
        "sidecar-total-size-mismatch",
        "total-size-mismatch",
    }
    failed = {name for name, c in cases.items() if c.find("failure") is not None}
    assert len(failed) == failing == int(root.get("failures", "-1"))
    if fail_on == "error":
        assert failed == {"sidecar-unlisted-tensor", "unindexed-tensor"}
        passing = cases["total-size-mismatch"].find("system-out")
        assert passing is not None and "below --fail-on error" in (passing.text or "")
    failure = cases["unindexed-tensor"].find("failure")
    if failure is not None:
        # The count says what it counts, the remedy is said once, every finding is listed.
        assert "21 findings on 42 tensors" in failure.get("message", "")
        body = failure.text or ""
        assert body.count("add it to the index (ckpt-inspect repair) or remove it") == 1
        assert body.count("\n- ") == 21


def test_json_stays_and_is_the_alias_of_format_json(demo_checkpoints: Path, cli) -> None:
    folder = demo_checkpoints / DRIFT
    alias, form = cli("check", folder, "--json"), cli("check", folder, "--format", "json")
    assert alias.stdout == form.stdout and alias.returncode == form.returncode == 1
    both = cli("check", folder, "--json", "--format", "sarif")
    assert both.returncode == 2 and "give one of them" in both.stderr and both.stdout == ""


# -- attacks ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """test_hostile_names' folder (escape sequences, bidi overrides, a forged ERROR line,
    HTML, Markdown, formulas in file and tensor names), with a 20,000-character name, and a
    shard whose name breaks out of XML comments, CDATA and JSON strings."""
    folder = hostile_folder(tmp_path_factory.mktemp("ci-names"), big=20_000)
    breaker = 'x"]]><!--<testcase name="forged">\\u0000`<code>%2F?#&amp;.safetensors'
    save_file({f"model.layers.2.y{breaker}": np.zeros(1, dtype=np.float32)}, folder / breaker)
    return folder


def test_hostile_names_cannot_forge_or_break_sarif(hostile: Path, cli) -> None:
    run = cli("check", hostile, "--format", "sarif")
    assert run.returncode == 1, run.stderr[-2000:]
    assert run.stdout.isascii() and not CONTROL.search(run.stdout)  # \u escapes only
    log = json.loads(run.stdout)
    assert sarif_errors(log) == []
    results = log["runs"][0]["results"]
    on_disk = {p.name for p in hostile.iterdir()}
    for result in results:
        assert not CONTROL.search(result["message"]["text"]), result["message"]["text"][:200]
        assert len(result["message"]["text"]) <= 2_000
        uri = result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        # A URI reference: no space, control, '#' or '?' left raw; it decodes to the exact name.
        assert not re.search(r"[\s#?\x00-\x1f\x7f]", uri), uri
        if result["properties"]["file"] in on_disk:
            assert unquote(uri) == result["properties"]["file"]
        for logical in result["locations"][0].get("logicalLocations", []):
            assert logical["fullyQualifiedName"] == result["properties"]["tensor"]  # exact
            assert not CONTROL.search(logical["name"]) and len(logical["name"]) <= 256
        # A name's '[text](target)' is no link a viewer follows (SARIF's escapes).
        assert not EMBEDDED_LINK.search(result["message"]["text"]), result["message"]["text"]
    assert any("\\[click\\](javascript:" in r["message"]["text"] for r in results)
    # Data keeps the names a script matches on, exactly.
    files = {r["properties"]["file"] for r in results}
    assert f"model-00002-of-00002{ESCAPES}.safetensors" in files
    assert any(len(r["properties"]["tensor"] or "") > 20_000 for r in results)


def test_hostile_names_cannot_forge_or_break_junit(hostile: Path, cli) -> None:
    run = cli("check", hostile, "--format", "junit", "--fail-on", "warning")
    assert run.returncode == 1, run.stderr[-2000:]
    root = ET.fromstring(run.stdout)  # well-formed: nothing closed or opened by a name
    assert not CONTROL.search(run.stdout.replace("\n", " "))
    names = [c.get("name") for c in root.iter("testcase")]
    assert "forged" not in names and len(names) == len(set(names))
    assert all(code_of(n) for n in names)  # every case is a code of ours
    texts = [t for e in root.iter() for t in (e.text, *e.attrib.values()) if t]
    assert texts and all(not CONTROL.search(t.replace("\n", " ")) for t in texts)
    # The forged line stays inside a line, after its escaped newline.
    assert not any(line.lstrip().startswith("ERROR forged") for line in run.stdout.splitlines())
    assert "\\nERROR forged line \\u202etxt.exe" in run.stdout


def test_a_file_name_that_is_not_utf8_stays_legible_in_every_format(tmp_path: Path, cli) -> None:
    """A shard whose name is bytes no UTF-8 decoder takes (Python holds them as lone
    surrogates, which no UTF-8 output can carry) and that closes CDATA, opens a tag and
    erases a terminal line: every format still writes, valid and without a raw control."""
    import os

    from inspector._internal.checks import check
    from inspector._internal.report.markdown import markdown_summary
    from inspector._internal.scan.entry import scan

    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_file({"model.layers.0.a": np.zeros(1, np.float32)}, folder / "model.safetensors")
    name = b"model-\xff\xfe]]>&<x>\x1b[2K\n\xe2\x80\xae-of-00002.safetensors"
    save_file({"model.layers.1.b": np.zeros(1, np.float32)}, os.fsdecode(folder) + "/x")
    os.rename(os.fsencode(folder / "x"), os.fsencode(folder) + b"/" + name)
    text = cli("check", folder, "--verbose")
    assert text.returncode == 1 and "not valid UTF-8" in text.stdout
    assert not CONTROL.search(text.stdout.replace("\n", " ")), text.stdout
    log = json.loads(cli("check", folder, "--format", "sarif").stdout)
    assert sarif_errors(log) == []
    (uri,) = {
        r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        for r in log["runs"][0]["results"]
        if "model-" in r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    }
    assert re.fullmatch(r"[A-Za-z0-9%._~/-]+", uri), uri
    junit = cli("check", folder, "--format", "junit").stdout
    ET.fromstring(junit)
    assert not CONTROL.search(junit.replace("\n", " "))
    scanned = scan(folder)
    summary = markdown_summary(scanned, check(scanned, model=False))
    assert not CONTROL.search(summary.replace("\n", " "))


def test_thousands_of_findings_give_a_bounded_log(tmp_path: Path, cli) -> None:
    """3,000 tensors the index does not list and 6,000 index entries the shard does not hold,
    in one checkpoint: the fold policy bounds the findings, so the SARIF log and the JUnit
    report stay a few hundred kilobytes however many there are."""
    folder = tmp_path / "many"
    folder.mkdir()
    shard = "model-00001-of-00001.safetensors"
    held = {
        f"model.layers.{i // 100}.mlp.e{i}.weight": np.zeros(1, np.float32) for i in range(6000)
    }
    save_file(held, folder / shard)
    weight_map = dict.fromkeys(list(held)[:3000], shard)
    weight_map |= dict.fromkeys((f"model.layers.{i}.gone.weight" for i in range(6000)), shard)
    (folder / INDEX_NAME).write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
    )
    run = cli("check", folder, "--format", "sarif")
    log = json.loads(run.stdout)
    assert sarif_errors(log) == []
    results = log["runs"][0]["results"]
    codes = {r["ruleId"] for r in results}
    assert len(results) <= len(codes) * (FOLD.per_code + 1) and len(run.stdout) < 1_500_000
    folded = sum(r["properties"]["folded"] for r in results)
    assert folded > 0 and len(results) < 12_000
    junit = cli("check", folder, "--format", "junit")
    assert len(junit.stdout) < 300_000
    failures = [f.text or "" for f in ET.fromstring(junit.stdout).iter("failure")]
    assert failures and all(t.count("\n- ") <= 50 for t in failures)


# -- the gate as people install it ----------------------------------------------------------------


def test_the_pre_commit_hook_runs_its_entry_on_a_folder(demo_checkpoints: Path) -> None:
    """The hook as pre-commit reads it (the keys its manifest requires, pre-commit's
    `clientlib.MANIFEST_HOOK_DICT`) and its entry run as pre-commit runs it: the installed
    console script, then `args` (the folder, as the file's comment shows) and no file names.
    Exit 1 on the drifted demo, 0 on a healthy one."""
    import yaml

    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert {"id", "name", "entry", "language"} <= set(hook)
    assert hook["language"] == "python" and hook["pass_filenames"] is False
    assert re.search(hook["files"], "model-00001-of-00004.safetensors")
    assert re.search(hook["files"], INDEX_NAME)
    command = hook["entry"].split()
    script = Path(sys.executable).parent / command[0]  # the console script pip installed
    assert script.is_file(), f"{script}: the project's console script is not installed"
    for demo, code in ((DRIFT, 1), ("healthy-hf-sharded", 0)):
        done = subprocess.run(
            [str(script), *command[1:], str(demo_checkpoints / demo), "--no-model"],
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == code, done.stdout[-1000:] + done.stderr[-1000:]


def test_every_shell_script_names_every_command(cli) -> None:
    """bash, zsh and tcsh: the script shtab writes names every subcommand of the parser."""
    from inspector._internal.cli.completion import SHELLS
    from inspector._internal.cli.main import _parser

    (sub,) = (a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    commands = set(sub.choices)
    assert {"scan", "check", "diff", "repair", "consolidate", "completion"} <= commands
    for shell in SHELLS:
        run = cli("completion", shell)
        assert run.returncode == 0, run.stderr
        missing = {c for c in commands if not re.search(rf"(?<![\w-]){c}(?![\w-])", run.stdout)}
        assert not missing, f"{shell}: {sorted(missing)}"


def test_completion_without_shtab_says_how_to_install_it(
    cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "shtab", None)  # import shtab raises ImportError
    run = cli("completion", "bash")
    assert run.returncode == 2 and run.stdout == ""
    assert "checkpoint-inspector[completion]" in run.stderr


def test_bash_completion_completes_commands_options_and_paths(tmp_path: Path, cli) -> None:
    """The script `completion bash` prints (shtab, from the parser) completes the commands,
    check's options and --format's choices in a real bash."""
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    script = cli("completion", "bash")
    assert script.returncode == 0 and "ckpt-inspect" in script.stdout
    (tmp_path / "ckpt-dir").mkdir()

    def complete(*words: str) -> list[str]:
        line = " ".join(["ckpt-inspect", *words])
        probe = (
            f"source {tmp_path / 'c.bash'}\n"
            f"COMP_WORDS=(ckpt-inspect {' '.join(words)}); COMP_CWORD={len(words)}\n"
            f"COMP_LINE='{line}'; COMP_POINT={len(line)}\n"
            "_shtab_ckpt_inspect ckpt-inspect\n"
            'printf "%s\\n" "${COMPREPLY[@]}"\n'
        )
        (tmp_path / "c.bash").write_text(script.stdout)
        done = subprocess.run(
            ["bash", "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=60
        )
        return done.stdout.split()

    assert {"check", "completion", "consolidate"} <= set(complete("c"))
    assert "--format" in complete("check", "--f")
    assert set(complete("check", "--format", "")) == {"text", "json", "sarif", "junit"}
    assert "ckpt-dir" in " ".join(complete("check", "ckpt"))
    assert cli("completion", "zsh").stdout.startswith("#compdef ckpt-inspect")


def test_completion_is_documented() -> None:
    text = (ROOT / "docs" / "cli.md").read_text()
    assert "ckpt-inspect completion bash" in text and "ckpt-inspect completion zsh" in text
    assert "--format sarif" in text and ".pre-commit-hooks.yaml" in text
    assert os.path.exists(ROOT / ".pre-commit-hooks.yaml")
