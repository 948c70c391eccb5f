"""Module-name patterns a checkpoint chooses (compressed-tensors `re:` targets and ignore
entries, Model-Optimizer `exclude_modules` globs, `modules_to_not_convert`), compiled for a
matcher that never backtracks: the one place such a pattern becomes a matcher.

Python's `re` backtracks (`re:(a+)+$` against `aaa...a!` is exponential), so every pattern
runs on RE2 under caps, with Python's answer for every pattern accepted; what RE2 cannot run
or what breaks a cap is refused, and `Patterns.match` answers None ("cannot tell") where a
refused pattern could decide. Promise: SECURITY.md, 2; the rules: docs/architecture.md,
"formats/".
"""

from __future__ import annotations

import fnmatch
import re
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import re2

from inspector._internal.common.display import legible

__all__ = [
    "MATCH_SECONDS",
    "MAX_BUDGET_CHARS",
    "MAX_NAME_CHARS",
    "MAX_PATTERNS",
    "MAX_PATTERN_CHARS",
    "MAX_PROGRAM",
    "PatternBudget",
    "Patterns",
    "Refusal",
    "compile_patterns",
]

# Real configs list a few dozen patterns of under 200 characters; module names are under 300.
MAX_PATTERNS = 4_096
MAX_PATTERN_CHARS = 4_096
# Characters of patterns one budget compiles (Python's compile checks each, then RE2's).
MAX_BUDGET_CHARS = 1 << 20
MAX_NAME_CHARS = 1_024
# RE2 instructions of one list's program: a name costs at most its length times this.
MAX_PROGRAM = 100_000
# Matching time one budget allows (a real checkpoint needs well under a second).
MATCH_SECONDS = 10.0

Syntax = Literal["regex", "glob"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """A pattern that was not compiled, and why (words for a finding)."""

    pattern: str
    why: str


@dataclass(slots=True)
class PatternBudget:
    """The matching time the pattern lists of one check share; once spent, every list
    answers None ("cannot tell") for the names left."""

    seconds: float = MATCH_SECONDS
    spent: float = 0.0
    chars: int = MAX_BUDGET_CHARS

    @property
    def exhausted(self) -> bool:
        return self.spent >= self.seconds


@dataclass(slots=True)
class Patterns:
    """One compiled list: `match(name)` is True when a pattern matches, False when none
    does, None when it cannot tell (a refused pattern could match, the name is too long or
    holds characters the pattern reads otherwise than Python, the budget is spent)."""

    syntax: Syntax
    refused: tuple[Refusal, ...]
    budget: PatternBudget
    _program: re2._Regexp | None = None
    # The accepted patterns use a construct whose meaning outside printable ASCII differs.
    _ascii_only: bool = False
    # Names answered None, by cause (for the finding's words).
    undecided: dict[str, int] = field(default_factory=dict)

    def match(self, name: str) -> bool | None:
        """Whether a pattern of the list matches `name` (None: cannot tell)."""
        program = self._program
        if program is None:
            return None if self.refused else False
        cause = self._cannot_run(name)
        if cause is None:
            try:
                text = name.encode()
            except UnicodeError:  # a lone surrogate (a name read from non-UTF-8 bytes)
                cause = "names that are not valid Unicode"
            else:
                start = time.perf_counter()
                # The program is compiled from UTF-8 bytes and run on bytes: the wrapper's
                # character offsets, never used, are not computed.
                found = (program.fullmatch if self.syntax == "glob" else program.match)(text)
                self.budget.spent += time.perf_counter() - start
                if found is not None:
                    return True
                return None if self.refused else False
        self.undecided[cause] = self.undecided.get(cause, 0) + 1
        return None

    def _cannot_run(self, name: str) -> str | None:
        if len(name) > MAX_NAME_CHARS:
            return f"names longer than {MAX_NAME_CHARS:,} characters"
        if self._ascii_only and not (name and name.isascii() and name.isprintable()):
            return "names that are empty or hold characters outside printable ASCII"
        if self.budget.exhausted:
            return f"names left when the {self.budget.seconds:g} s matching budget was spent"
        return None

    def reasons(self) -> list[str]:
        """What was refused or left undecided, in words (empty when nothing was)."""
        out = [f"'{legible(r.pattern, limit=80)}' {r.why}" for r in self.refused]
        out += [f"{n:,} {cause}" for cause, n in self.undecided.items()]
        return out


def compile_patterns(
    patterns: Sequence[str], *, syntax: Syntax, budget: PatternBudget | None = None
) -> Patterns:
    """The matcher of one list of patterns from a checkpoint (see the module docstring)."""
    budget = budget if budget is not None else PatternBudget()
    if len(patterns) > MAX_PATTERNS:
        why = f"is one of {len(patterns):,} patterns, more than the {MAX_PATTERNS:,} allowed"
        return Patterns(syntax, tuple(Refusal(p, why) for p in patterns[:1]), budget)
    refused: list[Refusal] = []
    accepted: list[str] = []
    ascii_only = False
    for pattern in dict.fromkeys(patterns):
        if len(pattern) > MAX_PATTERN_CHARS:
            refused.append(Refusal(pattern, f"is longer than {MAX_PATTERN_CHARS:,} characters"))
            continue
        if len(pattern) > budget.chars:
            why = f"comes after the first {MAX_BUDGET_CHARS:,} characters of patterns compiled"
            refused.append(Refusal(pattern, why))
            continue
        budget.chars -= len(pattern)
        rewritten = _glob_regex(pattern) if syntax == "glob" else pattern
        if rewritten is None:
            continue  # an empty character range: the glob matches nothing, as in fnmatch
        translated, problem, sensitive = _spell(rewritten)
        if problem is not None:
            refused.append(Refusal(pattern, problem))
            continue
        accepted.append(translated)
        ascii_only |= sensitive
    program = None
    if accepted:
        try:
            joined = "|".join(f"(?:{p})" for p in accepted)
            program = re2.compile(joined.encode(), _options())
        except re2.error:
            program = None
        if program is None or program.programsize > MAX_PROGRAM:
            why = f"is part of a list whose program exceeds {MAX_PROGRAM:,} RE2 instructions"
            refused += [Refusal(p, why) for p in patterns if p not in {r.pattern for r in refused}]
            program = None
    return Patterns(syntax, tuple(refused), budget, program, ascii_only)


def _spell(pattern: str) -> tuple[str, str | None, bool]:
    """(RE2 spelling, why the pattern is refused or None, whether it reads characters outside
    printable ASCII otherwise than Python) of a Python regex."""
    if not _encodable(pattern):
        return "", "is not valid Unicode (a lone surrogate)", False
    problem = _python_refuses(pattern)
    if problem is not None:
        return "", problem, False
    translated, problem, sensitive = _to_re2(pattern)
    if problem is None and _FOLDS.search(pattern) and _beyond_ascii(translated):
        # Python folds some non-ASCII letters onto ASCII ones RE2 does not (sre's
        # `_ignorecase_fixes`: "(?i)ı" matches "i" and "I"), so such a pattern can answer
        # otherwise for an ASCII name too.
        problem = (
            "folds the case of characters outside ASCII, which RE2 folds otherwise than "
            "Python's re; it was not matched"
        )
    if problem is None:
        problem = _re2_refuses(translated)
    return translated, problem, sensitive


# Case folding turned on (or off) anywhere in a pattern: `(?i)`, `(?i:...)`, `(?-i:...)`.
_FOLDS = re.compile(r"\(\?[a-zA-Z]*-?[a-zA-Z]*i[a-zA-Z-]*[:)]")
# A code point past ASCII in an RE2 spelling: `\x{...}` (what `_escape` writes) or `\xHH`.
_CODE_POINT = re.compile(r"\\x\{([0-9a-fA-F]+)\}|\\x([0-9a-fA-F]{2})")


def _beyond_ascii(spelled: str) -> bool:
    """Whether an RE2 spelling names a character outside ASCII, as itself or escaped."""
    if not spelled.isascii():
        return True
    return any(int(m.group(1) or m.group(2), 16) > 0x7F for m in _CODE_POINT.finditer(spelled))


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeError:
        return False
    return True


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False
    options.never_capture = True  # only whether it matches is asked
    options.max_mem = 64 << 20
    return options


def _python_refuses(pattern: str) -> str | None:
    """Why the library's own `re` refuses the pattern (its loader would fail), or None.
    Compiling is bounded for a pattern within the caps: it never runs the pattern."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "possible nested set" and the like
            re.compile(pattern)
    except re.error as exc:
        return f"is not a valid regular expression for Python's re ({exc})"
    except (RecursionError, OverflowError, ValueError, MemoryError) as exc:
        return f"is not a regular expression Python's re can compile ({type(exc).__name__})"
    return None


def _re2_refuses(pattern: str) -> str | None:
    try:
        re2.compile(pattern, _options())
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        text = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
        return (
            "needs a backtracking matcher or a syntax RE2 does not read "
            f"({text[:120]}); it was not matched"
        )
    return None


# -- Python's syntax, spelled for RE2 ----------------------------------------------------

_REPEAT = re.compile(r"\{(\d*),(\d*)\}")
_FLAGS = re.compile(r"\(\?([a-zA-Z-]*)[:)]")
_HEX = {"x": 2, "u": 4, "U": 8}
_OCTAL = frozenset("01234567")
# Escapes whose class differs outside printable ASCII (Unicode in Python, ASCII in RE2).
_CLASS_ESCAPES = frozenset("dDwWsSbB")


def _to_re2(pattern: str) -> tuple[str, str | None, bool]:
    """(RE2 spelling, why it cannot be spelled or None, whether it reads characters outside
    printable ASCII otherwise than Python). One pass; `pattern` is valid for Python's re."""
    out: list[str] = []
    sensitive = False
    in_class = False
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            escape, width, why = _escape(pattern, i, in_class)
            if why is not None:
                return "", why, sensitive
            sensitive |= pattern[i + 1] in _CLASS_ESCAPES
            out.append(escape)
            i += width
        elif in_class:
            # Python reads "[" inside a class literally; RE2 would start "[:alpha:]".
            out.append("\\[" if c == "[" else c)
            in_class = c != "]"
            i += 1
        elif c == "[":
            in_class = True
            out.append("[")
            i += 1
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            if i < n and pattern[i] == "]":  # a "]" first in a class is literal
                out.append("\\]")
                i += 1
        elif c == "{" and (m := _REPEAT.match(pattern, i)) and not m.group(1):
            # Python repeats `{,n}` (0 to n) and `{,}`; RE2 would read them literally.
            out.append(f"{{0,{m.group(2)}}}")
            i = m.end()
        else:
            if c == "$":
                sensitive = True  # Python's `$` also matches before a final newline
            elif c == "(" and (m := _FLAGS.match(pattern, i)) and "i" in m.group(1):
                sensitive = True  # case folding of non-ASCII letters
            out.append(c)
            i += 1
    return "".join(out), None, sensitive


def _escape(pattern: str, i: int, in_class: bool) -> tuple[str, int, str | None]:
    """(RE2 spelling, characters read, why not) of the escape at `pattern[i]`."""
    d = pattern[i + 1]
    if d in _HEX and d != "x":
        digits = pattern[i + 2 : i + 2 + _HEX[d]]
        return f"\\x{{{digits}}}", 2 + len(digits), None
    if d == "Z" and not in_class:
        return "\\z", 2, None
    if d == "b" and in_class:
        return "\\x{8}", 2, None  # a backspace in a class, for Python
    if d == "N":
        return "", 0, "uses a named character (\\N{...}), which RE2 does not read"
    if d.isdigit():
        # Python: "\0" and three octal digits are a character; other digits a backreference
        # (inside a class, up to three octal digits are always a character).
        j = i + 1
        limit = i + 4
        if d == "0" or in_class:
            while j < limit and j < len(pattern) and pattern[j] in _OCTAL:
                j += 1
            return f"\\x{{{int(pattern[i + 1 : j] or '0', 8):x}}}", j - i, None
        digits = pattern[i + 1 : limit]
        if len(digits) == 3 and set(digits) <= _OCTAL:
            return f"\\x{{{int(digits, 8):x}}}", 4, None
        return "", 0, "uses a backreference, which needs a backtracking matcher"
    if not d.isascii():
        return f"\\x{{{ord(d):x}}}", 2, None  # Python reads "\é" as "é"
    return pattern[i : i + 2], 2, None


def _glob_regex(glob: str) -> str | None:
    """The Python regex `fnmatch.fnmatchcase(name, glob)` decides by, without CPython's atomic
    groups (RE2 has none): `*` is `.*` (the same names match), `?` any character, each
    `[...]` as `fnmatch.translate` spells it; None when a `[...]` is an empty range, which
    matches nothing."""
    parts: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        if c == "*":
            if not parts or parts[-1] != ".*":
                parts.append(".*")
            i += 1
        elif c == "[":
            # Where fnmatch.translate ends a bracket expression (a leading "!" and "]" are
            # part of it); without a closing "]" the "[" is literal.
            j = i + 1
            if j < n and glob[j] == "!":
                j += 1
            if j < n and glob[j] == "]":
                j += 1
            j = glob.find("]", j)
            if j < 0:
                parts.append(re.escape(c))
                i += 1
                continue
            spelled = fnmatch.translate(glob[i : j + 1])
            inner = spelled.removeprefix("(?s:").removesuffix(")\\Z")
            if inner == "(?!)":
                return None
            parts.append(inner)
            i = j + 1
        else:
            parts.append("." if c == "?" else re.escape(c))
            i += 1
    return "(?s:" + "".join(parts) + ")"
