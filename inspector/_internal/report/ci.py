"""`check` for CI systems: SARIF 2.1.0 (code-scanning uploads) and JUnit XML (test reports),
built from the `check --format json` result (`inspector._internal.report.text.check_result`).

These are data formats that viewers render, so each field is one of two kinds: data a script
matches on keeps the exact name, text a viewer shows goes through `display.legible`. The
fields and the mapping: docs/architecture.md, "report/".
"""

from __future__ import annotations

import hashlib
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from itertools import groupby
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from inspector._internal.common.display import MESSAGE_LIMIT, legible
from inspector._internal.common.text import plural
from inspector._internal.findings.codes import Code, code_of
from inspector._internal.findings.words import FINDING
from inspector._internal.report.text import count_text, fix_once, issue_lines

if TYPE_CHECKING:
    from inspector._internal.checkpoint.scanned import ScannedCheckpoint

__all__ = ["JUNIT_MESSAGES", "SARIF_SCHEMA", "junit_xml", "sarif_log"]

# The schema the log names: SARIF 2.1.0 with its errata, as OASIS publishes it.
SARIF_SCHEMA = (
    "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
)
_LEVELS = {"error": "error", "warning": "warning", "info": "note"}
# The base the results' file locations are relative to (`originalUriBaseIds`).
_BASE = "CHECKPOINT"
# Messages a JUnit failure lists per code; `--format json` has them all.
JUNIT_MESSAGES = 50


def sarif_log(result: Mapping[str, Any], *, scanned: ScannedCheckpoint | None = None) -> dict:
    """The SARIF 2.1.0 log of a `check` result: one run, one rule per code found, one
    result per finding."""
    findings: Sequence[Mapping[str, Any]] = result["findings"]
    codes = list(dict.fromkeys(str(f["code"]) for f in findings))
    rule_index = {code: i for i, code in enumerate(codes)}
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "ckpt-inspect",
                "fullName": "checkpoint-inspector check",
                "version": _version(),
                "rules": [_rule(code) for code in codes],
            }
        },
        "originalUriBaseIds": {
            _BASE: {
                "uri": _base_uri(result, scanned),
                "description": {"text": _sarif_text(result["path"])},
            }
        },
        "columnKind": "unicodeCodePoints",
        "results": [_result(f, rule_index) for f in findings],
        "invocations": [{"executionSuccessful": True}],
        "properties": {
            "layout": result["layout"],
            "counts": result["counts"],
            "issues": [
                {k: i[k] for k in ("key", "severity", "title", "fix", "command", "by_code")}
                for i in result.get("issues", ())
            ],
        },
    }
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}


def _rule(code: str) -> dict[str, Any]:
    try:
        known: Code | None = code_of(code)
    except ValueError:  # a finding built by hand with a code of its own
        known = None
    if known is None:
        text = f"{code} (no help recorded)"
        return {"id": code, "shortDescription": {"text": text}}
    fix = f"{known.fix.kind}: {known.fix.text}" if known.fix.text else known.fix.kind
    return {
        "id": code,
        "shortDescription": {"text": _first_sentence(known.help)},
        "fullDescription": {"text": known.help},
        "help": {"text": f"{known.help}\nFix ({fix})"},
        "defaultConfiguration": {"level": _LEVELS[str(known.severity)]},
        "properties": {"group": known.group, "fix_kind": known.fix.kind, "tags": [known.group]},
    }


def _first_sentence(text: str) -> str:
    head, dot, _ = text.partition(". ")
    return head + "." if dot else text


def _result(f: Mapping[str, Any], rule_index: Mapping[str, int]) -> dict[str, Any]:
    code = str(f["code"])
    file, tensor = f.get("file"), f.get("tensor")
    where: dict[str, Any] = {
        "physicalLocation": {
            "artifactLocation": (
                {"uri": quote(str(file), safe="/"), "uriBaseId": _BASE}
                if file
                # No file: the finding is about the checkpoint as a whole.
                else {"uri": "./", "uriBaseId": _BASE}
            )
        }
    }
    if tensor:
        where["logicalLocations"] = [
            {"name": legible(tensor), "fullyQualifiedName": str(tensor), "kind": "member"}
        ]
    identity = "\0".join(str(f.get(k)) for k in ("code", "file", "tensor", "layer", "expert"))
    return {
        "ruleId": code,
        "ruleIndex": rule_index[code],
        "level": _LEVELS.get(str(f["severity"]), "warning"),
        "message": {"text": _sarif_text(f["message"])},
        "locations": [where],
        "partialFingerprints": {
            "checkpointFinding/v1": hashlib.sha256(identity.encode("utf-8", "replace")).hexdigest()
        },
        "properties": {k: f.get(k) for k in ("file", "tensor", "layer", "expert", "folded")},
    }


def _base_uri(result: Mapping[str, Any], scanned: ScannedCheckpoint | None) -> str:
    """The checkpoint folder as an absolute URI ending in '/': a local folder as a file
    URI, a remote checkpoint as its own URL."""
    local = scanned.local_path if scanned is not None else None
    if local is not None:
        folder = local if local.is_dir() else local.parent
        return folder.resolve().as_uri().rstrip("/") + "/"
    path = str(result["path"])
    return quote(path.rstrip("/"), safe=":/@") + "/"


# SARIF 2.1.0 §3.11.6: a plain text message may embed links, `[text](N)` to a related
# location or `[text](URI)`, and `\[`, `\]`, `\\` stand for the literal characters; viewers
# (GitHub code scanning, the SARIF and CodeQL extensions of VS Code) render them. A name
# holding `[click](https://...)` would be a link: every message escapes the three.
_SARIF_ESCAPE = str.maketrans({"\\": "\\\\", "[": "\\[", "]": "\\]"})


def _sarif_text(value: object) -> str:
    """A message of the log: `legible` (bounded, control characters and bidi overrides
    escaped), then SARIF's escapes, so nothing in a name becomes an embedded link."""
    return legible(value, limit=MESSAGE_LIMIT).translate(_SARIF_ESCAPE)


def _version() -> str:
    # Imported here: only the SARIF log names the tool's version, and importlib.metadata
    # costs every `check --format junit` about 25 ms at start.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("checkpoint-inspector")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0"


def junit_xml(result: Mapping[str, Any], *, fail_on: str = "error") -> str:
    """The JUnit XML report of a `check` result (see the module docstring): every text
    through `legible`, the messages of a code bounded by `JUNIT_MESSAGES`."""
    failing = {"error": ("error",), "warning": ("error", "warning"), "never": ()}[fail_on]
    findings: Sequence[Mapping[str, Any]] = result["findings"]
    path = legible(result["path"], limit=MESSAGE_LIMIT)
    suite = ET.Element("testsuite", name=f"ckpt-inspect check {path}")
    ET.SubElement(
        ET.SubElement(suite, "properties"), "property", name="layout", value=result["layout"]
    )
    classname = "ckpt-inspect.check"
    cases = failures = 0
    for code, group in groupby(findings, key=lambda f: str(f["code"])):
        items = list(group)
        severity = str(items[0]["severity"])
        case = ET.SubElement(suite, "testcase", classname=classname, name=code)
        cases += 1
        body = _junit_body(code, items)
        if severity in failing:
            failures += 1
            help_text = _help(code)
            failure = ET.SubElement(
                case,
                "failure",
                type=severity,
                message=f"{severity} {code}: {count_text(items)}{help_text}",
            )
            failure.text = body
        else:
            out = ET.SubElement(case, "system-out")
            out.text = f"{severity} (below --fail-on {fail_on}): {count_text(items)}\n{body}"
    if not cases:
        ET.SubElement(suite, "testcase", classname=classname, name="no findings")
        cases = 1
    issues = result.get("issues") or []
    if issues:
        out = ET.SubElement(suite, "system-out")
        out.text = "\n".join(issue_lines(list(issues))).strip("\n")
    for element in (suite,):
        element.set("tests", str(cases))
        element.set("failures", str(failures))
        element.set("errors", "0")
        element.set("skipped", "0")
    root = ET.Element(
        "testsuites",
        name="ckpt-inspect check",
        tests=str(cases),
        failures=str(failures),
        errors="0",
    )
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _help(code: str) -> str:
    try:
        return f" ({_first_sentence(code_of(code).help)})"
    except ValueError:
        return ""


def _junit_body(code: str, items: Sequence[Mapping[str, Any]]) -> str:
    """The findings of one code, one per line, the fix said once; at most `JUNIT_MESSAGES`."""
    shown = items[:JUNIT_MESSAGES]
    fix, messages = fix_once(code, [str(f["message"]) for f in shown])
    lines = [f"fix: {legible(fix, limit=MESSAGE_LIMIT)}"] if fix else []
    for f, message in zip(shown, messages, strict=True):
        where = " ".join(
            legible(v) for v in (f.get("file"), f.get("tensor")) if v is not None and v != ""
        )
        at = f" [{where}]" if where else ""
        lines.append(f"- {legible(message, limit=MESSAGE_LIMIT)}{at}")
    if len(items) > JUNIT_MESSAGES:
        more = len(items) - JUNIT_MESSAGES
        lines.append(
            f"... {plural(more, FINDING)} more (`ckpt-inspect check --format json` lists them)"
        )
    return "\n".join(lines)
