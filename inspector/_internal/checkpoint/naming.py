"""Tensor names -> layer, expert, module, param, kind and family. Pure, vectorised.

A name is reduced to its template (`model.layers.#.mlp.experts.#.down_proj.weight`): 300,000
names have a few hundred templates, so the rules run once per template and numpy cuts the
numbers out. This is the engine; the rules are the table in `checkpoint.naming_rules`: to
support a new naming scheme, edit that table, not this module.
"""

from __future__ import annotations

import operator
import re
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any

import numpy as np

from inspector._internal.checkpoint.naming_rules import (
    EXPERT_NUMBER,
    FAMILIES,
    FUSED_PARAM,
    GROUPED_PARAM,
    KIND_RULES,
    KINDS,
    MTP_OWN_KINDS,
    QUANTIZER_PARAM,
    SHARDED_OBJECT_KEY,
    TRAILING_NUMBER,
    Family,
)
from inspector._internal.common.columns import Coded, code_table, frozen

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "FAMILIES",
    "KINDS",
    "KIND_RULES",
    "LONG_NAME",
    "Family",
    "NameColumns",
    "ParsedName",
    "TextColumn",
    "layer_expert_numbers",
    "parse_name",
    "parse_names",
    "sharded_object_key",
]


@dataclass(frozen=True, slots=True)
class ParsedName:
    """What one tensor name says. `layer`/`expert` are None when the name has none;
    `fused` marks a tensor holding all experts on one axis (GPT-OSS, Megatron torch_dist)."""

    name: str
    layer: int | None
    expert: int | None
    module: str
    param: str
    kind: str
    family: str
    fused: bool
    mtp: bool
    stacked: bool


@dataclass(frozen=True, slots=True)
class TextColumn:
    """A text column of `parse_names` as codes into `values` (first-seen order, unused
    values possible where `pruned` is False); `categorical` is it as pandas has it."""

    codes: np.ndarray
    values: tuple[str, ...]
    # True when some values may be unused (a row's own text replaced its template's):
    # pandas' column then drops them, renumbering the codes.
    pruned: bool = False

    def equals(self, value: str) -> np.ndarray:
        """A boolean mask of the rows whose text is `value`."""
        if value not in self.values:
            return np.zeros(len(self.codes), dtype=bool)
        return self.codes == self.values.index(value)

    def categorical(self) -> pd.Categorical[str]:
        import pandas as pd

        column = pd.Categorical.from_codes(self.codes, pd.Index(list(self.values)))
        return column.remove_unused_categories() if self.pruned else column


@dataclass(frozen=True, slots=True)
class NameColumns:
    """`parse_names` output as parallel numpy arrays (one entry per name, in input order).

    `layer` and `expert` are int64 with -1 for "none". `layer` of an MTP name (`mtp` True)
    is its index among the MTP blocks, not a decoder layer number. `module`, `param`,
    `kind` and `family` are `pd.Categorical` (built from a few hundred templates, so they
    cost nothing per name; built on first use, so that a scan's summary, which reads only
    `texts`' codes, never imports pandas); `kind`'s categories are `KINDS`. `leaf` is each
    name's last dotted component (`name.rpartition(".")[2]`), coded (values in no set order).
    """

    layer: np.ndarray
    expert: np.ndarray
    texts: dict[str, TextColumn]
    fused: np.ndarray
    mtp: np.ndarray
    stacked: np.ndarray
    leaf: Coded[str]
    _built: dict[str, Any] = field(default_factory=dict, repr=False)

    def _categorical(self, key: str) -> pd.Categorical[str]:
        built = self._built.get(key)
        if built is None:
            built = self._built[key] = self.texts[key].categorical()
        return built

    @property
    def module(self) -> pd.Categorical[str]:
        return self._categorical("module")

    @property
    def param(self) -> pd.Categorical[str]:
        return self._categorical("param")

    @property
    def kind(self) -> pd.Categorical[str]:
        return self._categorical("kind")

    @property
    def family(self) -> pd.Categorical[str]:
        return self._categorical("family")

    def __len__(self) -> int:
        return len(self.layer)

    def _text(self, key: str, i: int) -> str:
        """Row `i` of text column `key`: what its categorical holds there (pruning unused
        values renumbers the codes, never changes a row's text)."""
        column = self.texts[key]
        return column.values[int(column.codes[i])]

    def row(self, i: int, name: str = "") -> ParsedName:
        """Entry `i` as a `ParsedName` (for tests and single look-ups, not bulk work). Its
        texts are read from the codes: building the four pandas columns for one row took
        ~5 ms (`parse_name` of one name, called by the thousand in tests)."""
        layer, expert = int(self.layer[i]), int(self.expert[i])
        module, param, kind, family = (
            self._text(key, i) for key in ("module", "param", "kind", "family")
        )
        return ParsedName(
            name,
            layer if layer >= 0 else None,
            expert if expert >= 0 else None,
            module,
            param,
            kind,
            family,
            bool(self.fused[i]),
            bool(self.mtp[i]),
            bool(self.stacked[i]),
        )


def parse_name(name: str) -> ParsedName:
    """Parse one tensor name (see `parse_names` for many)."""
    return parse_names([name]).row(0, name)


def layer_expert_numbers(names: Sequence[str]) -> list[tuple[int | None, int | None]]:
    """(decoder layer, expert) of each name, for findings. MTP blocks are not decoder
    layers, so they get no layer number."""
    parsed = parse_names(list(names))
    layers = np.where(parsed.mtp, -1, parsed.layer).tolist()
    return [
        (None if layer < 0 else layer, None if expert < 0 else expert)
        for layer, expert in zip(layers, parsed.expert.tolist(), strict=True)
    ]


def sharded_object_key(key: str) -> tuple[str, tuple[int, ...], tuple[int, ...]] | None:
    """(object key, offsets, global shape) of a Megatron ShardedObject key
    `<key>/shard_<offsets>_<shape>`, e.g. ('rng_state', (0, 1), (1, 2)) for
    'rng_state/shard_0.1_1.2'; None for any other key or when the two disagree in length."""
    match = SHARDED_OBJECT_KEY.fullmatch(key)
    if match is None:
        return None
    offsets = tuple(map(int, match.group(2).split(".")))
    shape = tuple(map(int, match.group(3).split(".")))
    return (match.group(1), offsets, shape) if len(offsets) == len(shape) else None


# -- one template ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Info:
    """The rule result for one template. Slots index the template's `#` numbers."""

    layer_slot: int
    expert_slot: int
    module: str
    param: str
    kind: str
    family: str
    fused: bool
    mtp: bool
    stacked: bool
    # Numbers that stay in module/param (e.g. `blocks.#.0`): their slots, in text order.
    keep_slots: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class _Shape:
    """What the rules say of a template before its kind: steps 1-3 of `_analyze`."""

    family: Family
    layer_slot: int
    expert_slot: int
    module: str
    param: str
    # A trailing number that is not an expert id: it stays in the param as `#`.
    marked: bool
    fused: bool
    keep_slots: tuple[int, ...]


def _analyze(template: str) -> _Info:
    """Apply FAMILIES and KIND_RULES to one template.

    1. the first family whose prefix matches gives the layer slot and the stripped prefix;
    2. the last component(s) become the param;
    3. an expert number (or a fused expert tensor) is taken out of the module;
    4. the kind comes from KIND_RULES (or the family), MTP-specific parts become "mtp".
    """
    shape = _shape(template)
    return _finish(shape, shape.module, shape.param, shape.family.kind or _kind(_path(shape)))


def _shape(template: str) -> _Shape:
    """Steps 1-3 of `_analyze`."""
    family, match = next((f, m) for f in FAMILIES if (m := f.prefix.match(template)))
    layer_slot = -1
    if "layer" in family.prefix.groupindex and match.start("layer") >= 0:
        layer_slot = template.count("#", 0, match.start("layer"))
    base = template.count("#", 0, match.end())
    module, param, grouped = _split_param(template[match.end() :])
    module, param, expert_slot, fused = _experts(module, param, grouped, base)
    keep = _kept_slots(template[match.end() :], base, expert_slot)
    marked = grouped and expert_slot < 0
    return _Shape(family, layer_slot, expert_slot, module, param, marked, fused, keep)


def _path(shape: _Shape, module: str | None = None, param: str | None = None) -> str:
    """The text KIND_RULES judge: module and param of the template (or the ones given)."""
    module = shape.module if module is None else module
    param = shape.param if param is None else param
    return f"{module}.{param}" if module else param


def _finish(shape: _Shape, module: str, param: str, kind: str) -> _Info:
    """Step 4 of `_analyze`: the `_Info` of `shape` with this module, param and kind."""
    family = shape.family
    if family.mtp and kind in MTP_OWN_KINDS:
        kind = "mtp"
    return _Info(
        shape.layer_slot,
        shape.expert_slot,
        module,
        param + "#" if shape.marked else param,
        kind,
        family.name,
        shape.fused and kind == "expert",
        family.mtp,
        family.stacked,
        shape.keep_slots,
    )


def _split_param(rest: str) -> tuple[str, str, bool]:
    """(module, param, trailing number) from the part after the layer prefix."""
    if m := QUANTIZER_PARAM.match(rest):
        return m.group(1), m.group(2), False
    if m := GROUPED_PARAM.match(rest):
        return m.group(1), m.group(2), True
    module, _, param = rest.rpartition(".")
    return module, param, False


def _experts(module: str, param: str, grouped: bool, base: int) -> tuple[str, str, int, bool]:
    """Take the expert number out of the module; recognise fused and grouped experts."""
    if m := EXPERT_NUMBER.search(module):
        slot = base + module.count("#", 0, m.end() - 1)
        return module[: m.end() - 2] + module[m.end() :], param, slot, False
    parts = module.split(".")
    in_experts = "experts" in parts
    if grouped and in_experts:
        # TEGroupedMLP `experts.linear_fc1.weight{E}`: the last number is the expert.
        return module, param, base + module.count("#"), False
    if parts[-1] == "experts" and (m := FUSED_PARAM.match(param)):
        return f"{module}.{m.group(1)}", m.group(2) or "weight", -1, True
    # Any other tensor of an experts module without a number holds every expert on one axis
    # (torch_dist `experts.experts.linear_fc1.weight`); extra state is not per expert.
    return module, param, -1, in_experts and param != "_extra_state"


def _kind(path: str) -> str:
    return next((kind for kind, rule in KIND_RULES if rule.search(path)), "other")


# KIND_RULES matching line by line: `_kinds` runs each over many paths joined by newlines
# (the rules never match a newline, so a match lies within one path).
_KIND_LINES = tuple(re.compile(rule.pattern, re.MULTILINE) for _, rule in KIND_RULES)
_KIND_NAMES = (*(kind for kind, _ in KIND_RULES), "other")


def _kinds(paths: list[str]) -> list[str]:
    """`_kind` of each of `paths`, with one pass of each rule over all of them."""
    text = "\n".join(paths)
    lengths = np.fromiter(map(len, paths), dtype=np.int64, count=len(paths))
    starts = np.cumsum(lengths + 1) - lengths - 1
    best = np.full(len(paths), len(KIND_RULES), dtype=np.int64)
    for r, rule in enumerate(_KIND_LINES):
        hits = np.fromiter((m.start() for m in rule.finditer(text)), dtype=np.int64)
        if len(hits):
            np.minimum.at(best, np.searchsorted(starts, hits, side="right") - 1, r)
    return [_KIND_NAMES[i] for i in best.tolist()]


def _kept_slots(rest: str, base: int, expert_slot: int) -> tuple[int, ...]:
    slots = [base + i for i in range(rest.count("#"))]
    return tuple(s for s in slots if s != expert_slot)


# -- many names --------------------------------------------------------------------------

_DIGIT_BYTES = bytes.maketrans(b"0123456789", b"##########")


def _masked(text: str) -> str:
    """`text` with every ASCII digit turned into `#`, through its UTF-8 bytes: about 20 times
    faster than str.translate with a dict. Exact for any text: an ASCII byte never occurs
    inside a multi-byte UTF-8 sequence, and lone surrogates (hostile names) pass through."""
    raw = text.encode("utf-8", "surrogatepass").translate(_DIGIT_BYTES)
    return raw.decode("utf-8", "surrogatepass")


_CACHE: dict[str, _Info] = {}
_CACHE_LIMIT = 200_000
_MAX_DIGITS = 9  # longer digit runs are not layer or expert numbers (keys fit in int64)
# Names masked and grouped per chunk (bounded temporaries).
_CHUNK = 1 << 15
# Digits inside words fold into one int64 key up to this many (10**18 < 2**63).
_MAX_KEY_DIGITS = 18
# A group whose digits inside words tell more templates apart than this (real names have a
# few: `w1`-`w3`, `linear_fc1`/`fc2`) is analysed once, its kind rules run over all its
# templates at once (`_fill_variants`): 200,000 names `t0`..`t199999` cost seconds, not
# 200,000 analyses.
_MANY_TEMPLATES = 32
# Names longer than this (no real tensor's) are each their own template, their numbers not
# cut out: a name of 90M characters holding 45M numbers costs one pass, not 45M slots. The
# rules see only such a name's first and last LONG_NAME // 2 characters (where its family,
# module and param are): every rule over a 20M-character name cost a pass over all of it,
# about 50 ms each, some 200 times per `check`.
LONG_NAME = 1_000


def parse_names(names: list[str]) -> NameColumns:
    """Parse many tensor names at once; 600,000 names take about a fifth of a second.

    1. names are grouped by their digit-masked form (all digits -> `#`): C-level join,
       translate, split and dict passes, no per-name Python code;
    2. per group, the digit runs that are whole components become number slots and the
       other digits (inside words) split the group into real templates;
    3. each template is analysed once (cached) and the numbers are cut out with numpy.
    """
    n = len(names)
    out = _Columns(n)
    if n == 0:
        return out.done(Coded.encode((), 0))
    # A private copy: hostile names are scrubbed in place (`_group_codes`).
    clean = list(names)
    chars = _CharSource(clean)
    codes, groups = _group_codes(clean, chars)
    order = np.argsort(codes.astype(np.int16) if len(groups) < 2**15 else codes, kind="stable")
    ends = np.cumsum(np.bincount(codes, minlength=len(groups))).tolist()
    leaves = _Leaves(n)
    start = 0
    for group, end in zip(groups, ends, strict=True):
        _fill_group(group, order[start:end], clean, chars, out)
        leaves.add(group, order[start:end], names, chars)
        start = end
    return out.done(leaves.done())


def _group_codes(names: list[str], chars: _CharSource) -> tuple[np.ndarray, list[str]]:
    """(group code per name, digit-masked group texts in first-seen order).

    Done in chunks so that the joined, masked and split temporaries (~150 bytes per name)
    reuse the same memory instead of touching fresh pages for all 600,000 names at once.
    Names that are not `str` or hold `#` or a newline are fixed in `names` (a private copy),
    so the masked text always splits into one string per name."""
    index: defaultdict[str, int] = code_table()
    codes = np.empty(len(names), dtype=np.intp)
    for lo in range(0, len(names), _CHUNK):
        hi = min(lo + _CHUNK, len(names))
        try:
            text = "\n".join(names[lo:hi])
        except TypeError:  # a hostile header may hold other types
            names[lo:hi] = [x if type(x) is str else str(x) for x in names[lo:hi]]
            text = "\n".join(names[lo:hi])
        masked = _masked(text).split("\n")
        if "#" in text or len(masked) != hi - lo:
            names[lo:hi] = [_scrub(x) for x in names[lo:hi]]
            text = "\n".join(names[lo:hi])
            masked = _masked(text).split("\n")
        chars.add(lo, hi, text)
        codes[lo:hi] = np.fromiter(map(index.__getitem__, masked), dtype=np.intp, count=hi - lo)
    return codes, list(index)


class _Leaves:
    """`NameColumns.leaf`, filled a group at a time (`parse_names`): a group whose masked
    leaf holds no `#` gives it to all its names (masking changes digits alone, scrubbing
    only `#` and newlines, both in place), and so does one whose names have the same digits
    there (`weight_scale_2`: a quarter of an NVFP4 MoE's names); the others slice it off
    each name, all as long as their group. Splitting every name cost 0.035 s at 300,000
    names, and slicing that quarter 0.02 s."""

    def __init__(self, n: int) -> None:
        self.index: defaultdict[str, int] = code_table()
        self.codes = np.zeros(n, dtype=np.int32)

    def add(self, group: str, rows: np.ndarray, names: list[str], chars: _CharSource) -> None:
        leaf = group.rpartition(".")[2]
        if "#" not in leaf and "\ufffd" not in leaf:
            self.codes[rows] = self.index[leaf]
            return
        base = len(group) - len(leaf)
        if chars.ascii and "\ufffd" not in leaf and leaf.count("#") <= _MAX_KEY_DIGITS:
            # Usually every name of the group has the same digits there (`_2`): one numpy
            # comparison of their character codes shows it. Only for a few digits: the
            # codes are a row per name and a column per digit (a hostile leaf of thousands
            # of digits is sliced off each name, one C-level pass, as before).
            digits = chars.codes(
                rows, [base + i for i, c in enumerate(leaf) if c == "#"], len(group)
            )
            if (digits == digits[0]).all():
                self.codes[rows] = self.index[names[int(rows[0])][base:]]
                return
        own: Iterator[str] = map(
            operator.getitem,
            map(str, map(names.__getitem__, rows.tolist())),
            repeat(slice(base, None)),
        )
        self.codes[rows] = np.fromiter(map(self.index.__getitem__, own), np.int32, len(rows))

    def done(self) -> Coded[str]:
        return Coded(frozen(self.codes), tuple(self.index))


def _scrub(name: str) -> str:
    """`name` without newline and `#` (same length), for parsing only."""
    return name.replace("\n", "\ufffd").replace("#", "\ufffd")


class _CharSource:
    """Character codes at given positions of given names, without a Python loop per name.

    ASCII input (the normal case) is one byte buffer, filled chunk by chunk (`add`);
    otherwise each group is turned into a fixed-width unicode array (names of one group
    have the same length)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        try:
            lengths = np.fromiter(map(len, names), dtype=np.int64, count=len(names))
        except TypeError:  # not all `str`: `add` sees the text does not fit and gives up
            lengths = np.zeros(len(names), dtype=np.int64)
        # Name i starts one past the end of name i - 1 (ASCII: one byte per character).
        self.ends = np.cumsum(lengths + 1)
        self.starts = self.ends - lengths - 1
        self.ascii = True
        self.buf = np.zeros(int(self.ends[-1]) if len(names) else 0, dtype=np.uint8)

    def add(self, first: int, stop: int, text: str) -> None:
        """`text` holds names `first` to `stop - 1`, joined by newlines."""
        at = int(self.starts[first])
        fits = at + len(text) == int(self.ends[stop - 1]) - 1
        if self.ascii and fits and text.isascii():
            self.buf[at : at + len(text)] = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
        else:
            self.ascii = False
            self.buf = np.zeros(0, dtype=np.uint8)

    def codes(self, rows: np.ndarray, positions: list[int], width: int) -> np.ndarray:
        """(len(rows), len(positions)) array of character codes."""
        if self.ascii:
            return self.buf[self.starts[rows][:, None] + np.asarray(positions)[None, :]]
        group = np.asarray([self.names[i] for i in rows], dtype=f"<U{width}")
        matrix = group.view(np.uint32).reshape(len(rows), width)
        return matrix[:, positions]


def _fill_group(
    group: str, rows: np.ndarray, names: list[str], chars: _CharSource, out: _Columns
) -> None:
    """Split one digit-masked group into real templates and fill their rows.

    Every digit the group needs (number slots first, then digits inside words) is
    gathered in one numpy call; the word digits then tell the templates apart."""
    if len(group) > LONG_NAME:
        half = LONG_NAME // 2
        for row in rows.tolist():
            name = names[row]
            out.assign(np.asarray([row]), _analyze(name[:half] + name[-half:]), [])
        return
    slots, word = _digit_runs(group)
    positions = [p for a, b in slots for p in range(a, b)] + word
    digits = chars.codes(rows, positions, len(group)) if positions else np.zeros((len(rows), 0))
    values, at = [], 0
    for a, b in slots:
        values.append(_numbers(digits[:, at : at + b - a]))
        at += b - a
    firsts, inverse = _word_keys(digits[:, at:] if word else None)
    if inverse is None:
        out.assign(rows, _info(_template(names[int(rows[0])], slots)), values)
    elif len(firsts) > _MANY_TEMPLATES:
        variants = _Variants(rows, firsts, inverse, digits[:, at:])
        _fill_variants(group, names, slots, word, variants, values, out)
    else:
        for members in _members(inverse):
            info = _info(_template(names[int(rows[members[0]])], slots))
            out.assign(rows[members], info, [v[members] for v in values])


def _word_keys(keys: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """(first row of each distinct set of digits inside words, which set each row has), in
    key order; (_, None) when every row has the same.

    Usually all rows agree (`w1`, `weight_scale_2`), which one comparison shows; the digits
    are otherwise folded into one int64 key, as `np.unique` over rows is slow."""
    if keys is None:
        return np.zeros(1, dtype=np.intp), None
    if keys.shape[1] <= _MAX_KEY_DIGITS:
        flat = _numbers(keys)
        if (flat == flat[0]).all():
            return np.zeros(1, dtype=np.intp), None
        _, firsts, inverse = np.unique(flat, return_index=True, return_inverse=True)
    else:
        _, firsts, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    return firsts, inverse.reshape(-1)


def _members(inverse: np.ndarray) -> list[np.ndarray]:
    """The rows of each value of `inverse`, in value order, each ascending: one stable sort,
    never a mask over every row per value."""
    order = np.argsort(inverse, kind="stable")
    cuts = np.flatnonzero(np.diff(inverse[order])) + 1
    return list(np.split(order, cuts))


@dataclass(frozen=True, slots=True)
class _Variants:
    """The templates of one group that differ only in digits inside words: `firsts[v]` is
    the first row (into `rows`) of template v, `inverse[i]` the template of row i, `digits`
    the word digits' character codes per row."""

    rows: np.ndarray
    firsts: np.ndarray
    inverse: np.ndarray
    digits: np.ndarray


def _fill_variants(
    group: str,
    names: list[str],
    slots: list[tuple[int, int]],
    word: list[int],
    variants: _Variants,
    values: list[np.ndarray],
    out: _Columns,
) -> None:
    """Many templates that differ only in digits inside words, analysed as one.

    What FAMILIES, the param split and the expert rules decide does not depend on those
    digits (no rule names a digit there, and a letter no name of the group holds matches
    every rule a digit matches: `\\w`, never `[a-z_]`, `#` or `.`), so the template is
    analysed once with that letter in their place; each template's module and param then
    get its own digits back, and KIND_RULES (which do name digits: `w1`, `linear_fc2`)
    judge all of them in one pass (`_kinds`)."""
    mark = _absent_letter(group)
    first = list(names[int(variants.rows[variants.firsts[0]])])
    for p in word:
        first[p] = mark
    shape = _shape(_template("".join(first), slots))
    n_mod, n_par = shape.module.count(mark), shape.param.count(mark)
    # Module and param hold the last of the word digits (the prefix the family strips
    # holds the others), in text order.
    own = variants.digits[variants.firsts][:, len(word) - n_mod - n_par :]
    modules = _with_digits(shape.module, mark, own[:, :n_mod])
    params = _with_digits(shape.param, mark, own[:, n_mod:])
    family = shape.family
    if family.kind:
        kinds = [family.kind] * len(modules)
    else:
        kinds = _kinds([_path(shape, m, p) for m, p in zip(modules, params, strict=True)])
    if family.mtp:
        kinds = ["mtp" if k in MTP_OWN_KINDS else k for k in kinds]
    columns: dict[str, list[Any]] = {
        "module": modules,
        "param": [p + "#" for p in params] if shape.marked else params,
        "kind": kinds,
        "fused": [shape.fused and k == "expert" for k in kinds],
    }
    first_info = _finish(shape, modules[0], params[0], kinds[0])
    out.assign_variants(variants.rows, first_info, columns, variants.inverse, values)


def _absent_letter(text: str) -> str:
    """A letter (`\\w`, no ASCII) that `text` does not hold."""
    used = set(text)
    return next(c for c in map(chr, range(0x4E00, 0x9FFF)) if c not in used)


def _with_digits(text: str, mark: str, digits: np.ndarray) -> list[str]:
    """`text` once per row of `digits` (character codes), its `mark` characters replaced in
    order by that row's digits: one array operation for all rows."""
    count = len(digits)
    if mark not in text:
        return [text] * count
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    grid = np.repeat(codes[None, :], count, axis=0)
    grid[:, np.flatnonzero(codes == ord(mark))] = digits
    texts: list[str] = grid.view(f"<U{len(codes)}").reshape(-1).tolist()
    if text.endswith("\x00"):  # numpy drops trailing NULs of its strings: put them back
        texts = [t.ljust(len(codes), "\x00") for t in texts]
    return texts


def _info(template: str) -> _Info:
    """`_analyze(template)`, cached (bounded: hostile names could make endless templates)."""
    info = _CACHE.get(template)
    if info is None:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        info = _CACHE[template] = _analyze(template)
    return info


def _digit_runs(group: str) -> tuple[list[tuple[int, int]], list[int]]:
    """(number slots as (start, end), positions of digits inside words) of a masked name."""
    slots: list[tuple[int, int]] = []
    word: list[int] = []
    for m in re.finditer("#+", group):
        a, b = m.span()
        whole = (a == 0 or group[a - 1] == ".") and (b == len(group) or group[b] == ".")
        trailing = b == len(group) and TRAILING_NUMBER.search(group, 0, a) is not None
        if (whole or trailing) and b - a <= _MAX_DIGITS:
            slots.append((a, b))
        else:
            word.extend(range(a, b))
    return slots, word


def _numbers(codes: np.ndarray) -> np.ndarray:
    """Decimal digit character codes (rows x digits) -> int64 values."""
    weights = 10 ** np.arange(codes.shape[1] - 1, -1, -1, dtype=np.int64)
    return (codes.astype(np.int64) - 48) @ weights


def _template(name: str, slots: list[tuple[int, int]]) -> str:
    pieces, last = [], 0
    for a, b in slots:
        pieces.append(name[last:a])
        pieces.append("#")
        last = b
    pieces.append(name[last:])
    return "".join(pieces)


class _Columns:
    """Output columns, filled one template at a time: numbers per row, everything else
    once per template (`tid` says which template each row has)."""

    def __init__(self, n: int) -> None:
        self.layer = np.full(n, -1, dtype=np.int64)
        self.expert = np.full(n, -1, dtype=np.int64)
        self.tid = np.zeros(n, dtype=np.int64)
        # Per template, in the order assigned: module, param, kind, family and the flags.
        self.of_template: dict[str, list[Any]] = {key: [] for key in _PER_TEMPLATE}
        # Rows whose module/param keep numbers of their own (rare): row -> text.
        self.overrides: dict[str, dict[int, str]] = {"module": {}, "param": {}}

    def assign(self, rows: np.ndarray, info: _Info, values: list[np.ndarray]) -> None:
        self._slots(rows, info, values)
        self.tid[rows] = len(self.of_template["module"])
        for key, column in self.of_template.items():
            column.append(getattr(info, key))
        if info.keep_slots:
            self._keep_numbers(rows, info.module, info.param, info.keep_slots, values)

    def assign_variants(
        self,
        rows: np.ndarray,
        first: _Info,
        columns: dict[str, list[Any]],
        inverse: np.ndarray,
        values: list[np.ndarray],
    ) -> None:
        """`assign` for templates that share their slots and family (`_fill_variants`):
        `first` is the first one, `columns` gives each one's module, param, kind and fused
        flag, and row i has template `inverse[i]`."""
        self._slots(rows, first, values)
        self.tid[rows] = len(self.of_template["module"]) + inverse
        count = len(columns["module"])
        for key, column in self.of_template.items():
            column.extend(columns[key] if key in columns else [getattr(first, key)] * count)
        if first.keep_slots:
            modules, params = columns["module"], columns["param"]
            for members in _members(inverse):
                v = int(inverse[members[0]])
                kept = [x[members] for x in values]
                self._keep_numbers(rows[members], modules[v], params[v], first.keep_slots, kept)

    def _slots(self, rows: np.ndarray, info: _Info, values: list[np.ndarray]) -> None:
        if info.layer_slot >= 0:
            self.layer[rows] = values[info.layer_slot]
        if info.expert_slot >= 0:
            self.expert[rows] = values[info.expert_slot]

    def _keep_numbers(
        self,
        rows: np.ndarray,
        module: str,
        param: str,
        keep_slots: tuple[int, ...],
        values: list[np.ndarray],
    ) -> None:
        """Numbers that are neither layer nor expert go back into module/param."""
        if (module + param).count("#") != len(keep_slots):
            return
        kept = [values[s] for s in keep_slots]
        split = module.count("#")
        for j, row in enumerate(rows.tolist()):
            numbers = [str(int(k[j])) for k in kept]
            self.overrides["module"][row] = _refill(module, numbers[:split])
            self.overrides["param"][row] = _refill(param, numbers[split:])

    def _text(self, key: str, first: tuple[str, ...] = ()) -> TextColumn:
        index = {v: i for i, v in enumerate(first)}
        small = [index.setdefault(v, len(index)) for v in self.of_template[key]]
        codes = np.asarray(small, dtype=np.int64)[self.tid] if small else self.tid.copy()
        overrides = self.overrides.get(key, {})
        for row, value in overrides.items():
            codes[row] = index.setdefault(value, len(index))
        # The narrowest type, as pandas' Categorical keeps its codes: int64 codes of four
        # columns cost 32 bytes a tensor while the tables are built (check's peak).
        narrow = np.min_scalar_type(-max(len(index), 1))
        return TextColumn(codes.astype(narrow), tuple(index), bool(overrides))

    def _flag(self, key: str) -> np.ndarray:
        small = np.asarray(self.of_template[key] or [False], dtype=bool)
        return small[self.tid]

    def done(self, leaf: Coded[str]) -> NameColumns:
        return NameColumns(
            self.layer,
            self.expert,
            {
                "module": self._text("module"),
                "param": self._text("param"),
                "kind": self._text("kind", KINDS),
                "family": self._text("family"),
            },
            self._flag("fused"),
            self._flag("mtp"),
            self._flag("stacked"),
            leaf,
        )


_PER_TEMPLATE = ("module", "param", "kind", "family", "fused", "mtp", "stacked")


def _refill(text: str, numbers: list[str]) -> str:
    for number in numbers:
        text = text.replace("#", number, 1)
    return text
