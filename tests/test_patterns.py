"""Module-name patterns from a checkpoint (`inspector._internal.formats.patterns`): Python's
answers where a pattern is accepted, a refusal with the reason where RE2 cannot run it, and
caps on patterns, names and time. The checks that use them are tested with real exports in
tests/test_compressed_tensors.py."""

from __future__ import annotations

import fnmatch
import re
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inspector._internal.formats.patterns import (
    MAX_NAME_CHARS,
    MAX_PATTERN_CHARS,
    MAX_PATTERNS,
    PatternBudget,
    compile_patterns,
)

# Pieces of Python regex syntax, the ones RE2 spells or reads otherwise included.
_ATOMS = [
    *"ab.|*+?^$()",
    *(r"\.", r"\d", r"\w", r"\s", r"\b", r"\B", r"\D", r"\W", r"\S", r"\A", r"\Z"),
    *("[ab]", "[^a]", "[]a]", "[[:alpha:]]", "[a-c]", "[\\b]", "[\\d]", "[^\\w]"),
    *("(?:", "(?i)", "(?s)", "(?m)", "*?", "{2}", "{,2}", "{1,}", "{,}", "{", "}"),
    *(r"\x41", r"\u0061", r"\0", r"\141", "A", " ", "#", "\n", "_", "1", "-"),
]
_NAMES = st.text(alphabet="ab1A_. -\n#[é١\u212a", max_size=8)


def _python(pattern: str) -> re.Pattern[str] | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return re.compile(pattern)
    except re.error:
        return None


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_ATOMS), min_size=1, max_size=6).map("".join), _NAMES)
def test_regex_answers_are_pythons(pattern: str, name: str) -> None:
    """An accepted pattern answers `re.match` (compressed-tensors' `_match_name`), or None
    for a name whose characters RE2 reads otherwise; Python-invalid patterns are refused."""
    python = _python(pattern)
    compiled = compile_patterns([pattern], syntax="regex")
    if python is None:
        assert compiled.refused and "Python's re" in compiled.refused[0].why
        return
    answer = compiled.match(name)
    if not compiled.refused and answer is not None:
        assert answer == (python.match(name) is not None)


@settings(max_examples=400, deadline=None)
@given(
    st.text(alphabet="ab*?[]!-^\\.\n&~|", min_size=1, max_size=8),
    st.text(alphabet="ab*?[]!-^\\.\n&~|", max_size=8),
)
def test_glob_answers_are_fnmatchcase(glob: str, name: str) -> None:
    compiled = compile_patterns([glob], syntax="glob")
    assert not compiled.refused
    assert compiled.match(name) == fnmatch.fnmatchcase(name, glob)


def test_llm_compressor_patterns() -> None:
    """The patterns llm-compressor and its examples write, matched at the start only."""
    ignore = compile_patterns(
        [r".*lm_head", r".*mlp.gate$", r"model\.layers\.\d+\.self_attn\.(q|k)_proj$", "visual.*"],
        syntax="regex",
    )
    assert ignore.match("lm_head") and ignore.match("model.layers.3.mlp.gate")
    assert ignore.match("model.layers.12.self_attn.k_proj") and ignore.match("visual.blocks.0")
    assert ignore.match("model.layers.3.mlp.gate_proj") is False
    assert ignore.match("x.visual.blocks.0") is False  # re.match: anchored at the start
    assert ignore.match("model.layers.3.mlp.up_proj") is False


def test_nested_quantifiers_run_in_linear_time() -> None:
    """`(a+)+$` against `a...a!` is exponential for Python's re; here it is one pass. The
    answer is Python's (no match), so nothing is refused."""
    compiled = compile_patterns(["(a+)+$", "((a*)*)*b", "(.*c){20}"], syntax="regex")
    assert not compiled.refused
    assert compiled.match("a" * (MAX_NAME_CHARS - 1) + "!") is False
    assert compiled.match("a" * 34) is True


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"(a+)+\1", "backreference"),
        ("(?P<x>a)(?P=x)", "invalid"),
        ("(?=a)a", "invalid perl operator"),
        ("(?<!b)a", "invalid perl operator"),
        ("(?>a+)b", "invalid perl operator"),
        ("a++", "bad repetition operator"),
        ("(?x) a", "invalid perl operator"),
        ("a{1001}", "invalid repetition size"),
        (r"\N{LATIN SMALL LETTER A}", "named character"),
        ("(", "Python's re"),
        ("a" * (MAX_PATTERN_CHARS + 1), "longer than"),
    ],
)
def test_refused_patterns_say_why_and_leave_names_undecided(pattern: str, why: str) -> None:
    compiled = compile_patterns([pattern, "lm_head"], syntax="regex")
    assert [r.pattern for r in compiled.refused] == [pattern]
    assert why in compiled.refused[0].why
    assert compiled.match("lm_head") is True  # an accepted pattern still decides
    assert compiled.match("model.layers.0") is None  # the refused one could have matched
    assert all(len(r) < 400 for r in compiled.reasons())


def test_caps_on_lists_and_names() -> None:
    """100,000 patterns, a 10 MB pattern, a huge alternation and a name over the cap end in
    refusals or "cannot tell", never in work proportional to them."""
    many = compile_patterns([f"p{i}" for i in range(100_000)], syntax="regex")
    assert many.refused and f"more than the {MAX_PATTERNS:,}" in many.refused[0].why
    assert many.match("p1") is None
    huge = compile_patterns(["a" * 10_000_000], syntax="glob")
    assert "longer than" in huge.refused[0].why
    alternation = compile_patterns(["|".join(f"x{i}" for i in range(800))], syntax="regex")
    assert alternation.match("x799") is True and alternation.match("y") is False
    compiled = compile_patterns([".*b"], syntax="regex")
    assert compiled.match("a" * (MAX_NAME_CHARS - 1) + "b") is True
    assert compiled.match("a" * MAX_NAME_CHARS + "b") is None
    assert compiled.reasons() == [f"1 names longer than {MAX_NAME_CHARS:,} characters"]
    budget = PatternBudget(chars=10)
    first = compile_patterns(["abcdefgh"], syntax="regex", budget=budget)
    second = compile_patterns(["abcdefgh"], syntax="regex", budget=budget)
    assert not first.refused and "characters of patterns compiled" in second.refused[0].why


def test_spent_budget_answers_cannot_tell() -> None:
    budget = PatternBudget(seconds=0.0)
    compiled = compile_patterns(["a"], syntax="regex", budget=budget)
    assert compiled.match("a") is None
    assert "matching budget was spent" in compiled.reasons()[0]


def test_odd_names_and_patterns() -> None:
    """An empty `re:` pattern matches every name (as `re.match("", name)`); a name that is
    not valid Unicode (a lone surrogate from non-UTF-8 bytes) cannot be told; glob specials
    and an empty range keep fnmatch's meaning."""
    assert compile_patterns([""], syntax="regex").match("anything") is True
    surrogate = compile_patterns(["a"], syntax="regex")
    assert surrogate.match("b\udcff") is None and surrogate.match("a\udcff") is None
    globs = compile_patterns(["[z-a]", "model.*.[!0-9]?", "[", "*[[]*"], syntax="glob")
    assert not globs.refused
    assert globs.match("model.x.ab") and globs.match("[") and globs.match("a[b")
    assert globs.match("model.x.1b") is False and globs.match("z") is False
    unicode = compile_patterns([r"\d"], syntax="regex")
    assert unicode.match("1") is True and unicode.match("١") is None  # Python: True, RE2: no
