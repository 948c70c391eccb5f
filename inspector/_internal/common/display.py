"""How a name from a checkpoint is shown to a person: `legible`, the one function every name,
path, key and message goes through on its way to a terminal, log, report, CSV or the
dashboard. A checkpoint chooses its names (90 million characters, escapes, bidi controls,
markup, formulas), so shortening and escaping happen in one place no renderer can skip; the
exact names stay in the data. Promise: SECURITY.md, 6; the rules: docs/architecture.md, "common/".
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Literal

__all__ = [
    "CELL_LIMIT",
    "LINE_LIMIT",
    "MESSAGE_LIMIT",
    "NAME_LIMIT",
    "Target",
    "legible",
    "legible_each",
    "legible_markup",
]

Target = Literal["text", "html", "markdown", "markdown-code", "csv"]

# A name (file, tensor, path, key): real tensor names are under 120 characters, deep paths of
# the Hugging Face cache under 200.
NAME_LIMIT = 256
# A message or one line of a plan, built from a few names and words.
MESSAGE_LIMIT = 2_000
# One line that quotes several messages (an error that refuses a plan names its findings).
LINE_LIMIT = 8_000
# A CSV cell: spreadsheets cut cells at 32,767 characters.
CELL_LIMIT = 32_000
# Below this a cut name would be mostly the note saying how much was cut.
_MIN_LIMIT = 40

_CUT = "...({:,} characters cut)..."
_FORMULA_START = frozenset("=+-@")
# Markdown inline text (see the module docstring): what each character (or run) becomes. A
# backslash-escaped ASCII punctuation character starts nothing in CommonMark, GFM and mistune.
# `_` starts emphasis only at a word boundary (`down_proj` never does, `._orig_` does);
# `://` and `www.` start autolinks; a run of `\\` and `$` becomes one code span.
_MARKDOWN_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_MARKDOWN_INLINE = re.compile(
    r"[\\$]+|[&<>`*~\[\]|@]|(?<![^\W_])_|_(?![^\W_])|:(?=//)|(?<=\b[Ww]{3})\."
)
# These start a block at the beginning of a line (a heading, a list, a definition).
_MARKDOWN_BLOCK = re.compile(r"[#+\-=:]|[0-9]{1,9}(?=[.)])")
_BACKTICKS = re.compile(r"`+")


def legible(
    value: object, *, target: Target = "text", limit: int = NAME_LIMIT, lines: bool = False
) -> str:
    """`value` (a name, a path, a message; anything else as its `str`) as a person may see
    it: at most `limit` characters (head and tail kept, "...(N characters cut)..." between
    them), every non-printable character escaped, then escaped for `target` (see the module
    docstring). `lines=True` keeps the newlines of multi-line text whose line breaks are its
    own (text built from legible parts, such as a plan's description) and applies `limit` to
    each line; every other line break (`\\r`, `\\x0b`, `\\x85`, U+2028...) is escaped.
    Text that quotes a name is made legible line by line before the lines are joined, or a
    newline in the name would survive as a line break."""
    if limit < _MIN_LIMIT:
        raise ValueError(f"limit {limit}: expected at least {_MIN_LIMIT} characters")
    text = value if isinstance(value, str) else str(value)
    if lines and "\n" in text:
        return "\n".join(legible(line, target=target, limit=limit) for line in text.split("\n"))
    text = _fit(text, limit)
    if target == "text":
        return text
    if target == "html":
        return html.escape(text, quote=True)
    if target == "markdown":
        return _markdown(text)
    if target == "markdown-code":
        return _code_span(text)
    if target == "csv":
        return "'" + text if text[:1] in _FORMULA_START else text
    raise ValueError(f"target {target!r}: expected text, html, markdown, markdown-code or csv")


def legible_each(values: Iterable[object], *, limit: int = NAME_LIMIT) -> list[str]:
    """`legible(v, limit=limit)` of each of `values`, as text. The common case, a string
    short enough and printable, is itself: tested inline, without a call per value (the
    Tensors grid's four name columns at 300,000 tensors: 2 s of calls on 2 shared cores)."""
    if limit < _MIN_LIMIT:
        raise ValueError(f"limit {limit}: expected at least {_MIN_LIMIT} characters")
    return [
        v if type(v) is str and len(v) <= limit and v.isprintable() else legible(v, limit=limit)
        for v in values
    ]


# A code span of the project's messages: a run of text between single backticks, on one line.
_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def legible_markup(
    value: object, *, target: Literal["text", "html", "markdown"] = "text", limit: int = 2_000
) -> str:
    """A message of the project's (a finding's message, an issue's title or fix, a note) as
    a person may see it: `legible` (bounded, every non-printable character escaped), its
    `code spans` rendered for `target` (see the module docstring): kept as backticks in
    text, `<code>` in HTML, code spans in Markdown."""
    if limit < _MIN_LIMIT:
        raise ValueError(f"limit {limit}: expected at least {_MIN_LIMIT} characters")
    text = _fit(value if isinstance(value, str) else str(value), limit)
    if target == "text":
        return text
    if target not in ("html", "markdown"):
        raise ValueError(f"target {target!r}: expected text, html or markdown")
    parts, at = [], 0
    for span in _CODE_SPAN.finditer(text):
        parts.append(_plain(text[at : span.start()], target, first=not at))
        inner = span[1]
        parts.append(
            f"<code>{html.escape(inner, quote=True)}</code>"
            if target == "html"
            else _code_span(inner)
        )
        at = span.end()
    parts.append(_plain(text[at:], target, first=not at))
    return "".join(parts)


def _plain(text: str, target: str, *, first: bool) -> str:
    if target == "html":
        return html.escape(text, quote=True)
    return _markdown(text, block=first)


def _markdown(text: str, *, block: bool = True) -> str:
    escaped = _MARKDOWN_INLINE.sub(_markdown_escape, text)
    start = _MARKDOWN_BLOCK.match(escaped) if block else None
    if start is None:
        return escaped
    at = start.end() if start[0][0].isdigit() else 0  # `1.` -> `1\.`, `# x` -> `\# x`
    return escaped[:at] + "\\" + escaped[at:]


def _markdown_escape(match: re.Match[str]) -> str:
    found = match[0]
    if found[0] in "\\$":
        return f"`{found}`"
    return _MARKDOWN_ENTITIES.get(found) or "\\" + found


def _code_span(text: str) -> str:
    # CommonMark: a span opened by N backticks closes at the next run of exactly N; one space
    # inside each end is dropped when both are there, so padding lets the content start or
    # end with a backtick (or a space) and still be shown whole.
    if not text:
        return "` `"
    fence = "`" * (1 + max((len(run) for run in _BACKTICKS.findall(text)), default=0))
    body = text.replace("|", "\\|")
    pad = " " if text[0] in "` " or text[-1] in "` " else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def _fit(text: str, limit: int) -> str:
    """At most `limit` printable characters: escaped, and cut in the middle when long."""
    if len(text) <= limit and text.isprintable():
        return text  # the common case: one C-level pass, no copy
    # Only a window of `limit` characters at each end can be shown: never look further.
    front = [_escape(c) for c in text[:limit]]
    if len(text) <= limit and sum(map(len, front)) <= limit:
        return "".join(front)
    back = [_escape(c) for c in text[-limit:]]
    budget = limit - len(_CUT.format(len(text)))
    head = _take(front, budget - budget // 3)
    tail = _take(back[::-1], budget - sum(map(len, front[:head])))
    cut = len(text) - head - tail
    return "".join(front[:head]) + _CUT.format(cut) + "".join(back[len(back) - tail :])


def _take(units: list[str], budget: int) -> int:
    """How many leading `units` fit in `budget` characters (an escape is never split)."""
    used = 0
    for n, unit in enumerate(units):
        used += len(unit)
        if used > budget:
            return n
    return len(units)


@lru_cache(maxsize=4096)
def _escape(char: str) -> str:
    return char if char.isprintable() else repr(char)[1:-1]
