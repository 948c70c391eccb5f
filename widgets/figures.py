"""Plotly figures built from the inspector's tables. Pure: DataFrames in, `Figure` out.

Shared by the notebook dashboard and the self-contained HTML report, so nothing here touches
files, widgets or the network. Every function accepts an empty frame and then returns a figure
that says why it is empty instead of an empty plot.
"""

from __future__ import annotations

import functools
import html
import math
import re
from collections import defaultdict

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from inspector.ui import format_bytes, legible, scale_for

from .renderers import import_renderers

# A figure made in a notebook is shown there by plotly's renderers: imported now, they get
# nbformat put off (see `widgets.renderers`), not at the first figure shown.
import_renderers()

__all__ = [
    "SEVERITY_COLORS",
    "STATE_COLORS",
    "bytes_per_layer",
    "expert_coverage_heatmap",
    "expert_layer_grid",
    "findings_by_code",
    "parameters_per_layer",
    "prepare_template",
    "serving_plans",
    "shard_size_distribution",
    "shard_size_outliers",
    "values_heatmap",
]

# Cell states of the coverage heatmap, in z order (0, 1, 2).
STATES = ("missing", "incomplete", "complete")
STATE_COLORS = {"missing": "#d62728", "incomplete": "#f2a900", "complete": "#2ca02c"}
SEVERITY_COLORS = {"error": "#d62728", "warning": "#f2a900", "info": "#1f77b4"}
# Files are drawn one bar each up to this count; beyond it a histogram stays readable.
_MAX_FILE_BARS = 64
# Per-expert "what is missing" hover details are computed for at most this many cells, so a
# checkpoint where every expert is incomplete does not turn hover text into a second scan.
_MAX_DETAILED_CELLS = 5_000
_NO_LAYER = "other"


# -- expert coverage ---------------------------------------------------------------------------


def expert_coverage_heatmap(
    experts: pd.DataFrame,
    *,
    tensors: pd.DataFrame | None = None,
    max_cells: int = 200_000,
) -> go.Figure:
    """Layer x expert matrix of expert states: complete, incomplete or missing.

    `experts` is the experts table (layer, expert, tensors_found, tensors_expected, missing).
    Pass the tensors table as `tensors` to name the absent tensors of incomplete experts in
    the hover text. When layers x experts exceeds `max_cells`, experts are grouped into bins
    and each cell shows the fraction of complete experts in its bin (the title says so).
    """
    frame = _expert_states(experts)
    if frame.empty:
        return _empty_figure("Expert coverage", "No MoE experts in this checkpoint.")
    layers = np.sort(frame["layer"].unique())
    n_experts = int(frame["expert"].max()) + 1
    if len(layers) * n_experts > max_cells:
        return _binned_heatmap(frame, layers, n_experts, max_cells=max_cells)
    return _cell_heatmap(frame, layers, n_experts, tensors=tensors)


def expert_layer_grid(
    experts: pd.DataFrame,
    layer: int,
    *,
    tensors: pd.DataFrame | None = None,
    columns: int = 32,
) -> go.Figure:
    """One MoE layer zoomed in: its experts wrapped into rows of `columns` cells, each cell
    labelled with its expert id and coloured by state, so a single missing expert of 512 is
    a cell of its own to see, hover and click. Expert id = row * columns + column. A layer of
    fewer than `columns` experts is one row of its own width: no empty cell to click."""
    frame = _expert_states(experts)
    frame = frame[frame["layer"] == layer]
    if frame.empty:
        return _empty_figure(f"Layer {layer}", f"No experts recorded for layer {layer}.")
    n = int(frame["expert"].max()) + 1
    columns = min(columns, n)
    experts_ = frame["expert"].to_numpy()
    # Only the rows that hold a recorded expert (all of them, but for ids far past the
    # expected count): a hostile expert id of 999,999,999 made 31 million rows, 7.5 GiB of
    # cells per array. Rows are labelled by their first expert, so a click still finds it.
    starts, r = np.unique(experts_ // columns, return_inverse=True)
    r = r.reshape(-1)
    c = experts_ % columns
    rows = len(starts)
    z = np.full((rows, columns), np.nan)
    ids = np.full((rows, columns), "", dtype=object)
    notes = np.full((rows, columns), "", dtype=object)
    z[r, c] = frame["state"].to_numpy()
    ids[r, c] = experts_.astype(str)
    labels = np.array(["missing: no tensors", "incomplete", "complete"], dtype=object)
    counts = np.char.add(
        np.char.add(frame["found"].to_numpy().astype(str), " of "),
        frame["expected"].to_numpy().astype(str),
    )
    notes[r, c] = np.char.add(
        np.char.add(labels[frame["state"].to_numpy()].astype(str), "<br>"),
        np.char.add(counts, " tensors"),
    )
    for (lay, expert), lacks in _missing_parts(frame, tensors).items():
        if lay == layer:
            row = int(np.searchsorted(starts, expert // columns))
            notes[row, expert % columns] = f"incomplete: lacks {lacks}"
    trace = go.Heatmap(
        z=z,
        x=list(range(columns)),
        y=[f"{i * columns}-{min(n, (i + 1) * columns) - 1}" for i in starts.tolist()],
        text=ids,
        customdata=notes,
        texttemplate="%{text}",
        textfont={"size": 9},
        zmin=-0.5,
        zmax=2.5,
        colorscale=_discrete_scale([STATE_COLORS[s] for s in STATES]),
        showscale=False,
        xgap=2,
        ygap=2,
        hovertemplate="expert %{text}<br>%{customdata}<extra></extra>",
    )
    counts_by_state = np.bincount(frame["state"].to_numpy(), minlength=3)
    title = (
        f"Layer {layer}: {n} experts, {counts_by_state[2]:,} complete, "
        f"{counts_by_state[1]:,} incomplete, {counts_by_state[0]:,} missing"
    )
    fig = go.Figure(trace)
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(autorange="reversed", type="category")
    return _layout(
        fig, title, x="expert id = row start + column", y="experts", height=120 + 26 * rows
    )


def _expert_states(experts: pd.DataFrame) -> pd.DataFrame:
    """layer, expert, found, expected, state (0 missing, 1 incomplete, 2 complete) as numpy
    integers; rows without a layer or expert number are dropped."""
    if experts is None or experts.empty:
        return pd.DataFrame(columns=["layer", "expert", "found", "expected", "state"])
    keep = experts["layer"].notna() & experts["expert"].notna()
    e = experts.loc[keep]
    found = e["tensors_found"].to_numpy(dtype="int64", na_value=0)
    expected = e["tensors_expected"].to_numpy(dtype="int64", na_value=0)
    missing = e["missing"].to_numpy(dtype=bool, na_value=False) | (found == 0)
    state = np.where(missing, 0, np.where(found < expected, 1, 2))
    return pd.DataFrame(
        {
            "layer": e["layer"].to_numpy(dtype="int64"),
            "expert": e["expert"].to_numpy(dtype="int64"),
            "found": found,
            "expected": expected,
            "state": state,
        }
    )


def _cell_heatmap(
    frame: pd.DataFrame, layers: np.ndarray, n_experts: int, *, tensors: pd.DataFrame | None
) -> go.Figure:
    # 1. Scatter the states into a dense matrix; cells without a row stay NaN (blank).
    row_of = {int(layer): i for i, layer in enumerate(layers)}
    rows = np.fromiter((row_of[v] for v in frame["layer"]), dtype=np.int64, count=len(frame))
    cols = frame["expert"].to_numpy()
    z = np.full((len(layers), n_experts), np.nan)
    z[rows, cols] = frame["state"].to_numpy()
    counts = np.full((len(layers), n_experts, 2), np.nan)
    counts[rows, cols, 0] = frame["found"].to_numpy()
    counts[rows, cols, 1] = frame["expected"].to_numpy()
    # 2. Hover notes: what each cell lacks.
    notes = np.full((len(layers), n_experts), "", dtype=object)
    notes[rows, cols] = np.array(["missing: no tensors", "incomplete", "complete"], dtype=object)[
        frame["state"].to_numpy()
    ]
    for (layer, expert), lacks in _missing_parts(frame, tensors).items():
        notes[row_of[layer], expert] = f"incomplete: lacks {lacks}"
    # 3. Discrete colour scale: each state owns one third of [0, 1].
    trace = go.Heatmap(
        z=z,
        x=np.arange(n_experts),
        y=[str(v) for v in layers],
        customdata=counts,
        text=notes,
        zmin=-0.5,
        zmax=2.5,
        colorscale=_discrete_scale([STATE_COLORS[s] for s in STATES]),
        colorbar={"title": {"text": "state"}, "tickvals": [0, 1, 2], "ticktext": list(STATES)},
        xgap=1 if n_experts <= 128 else 0,
        ygap=1 if len(layers) <= 64 else 0,
        hovertemplate="layer %{y}, expert %{x}<br>%{customdata[0]} of %{customdata[1]} tensors"
        "<br>%{text}<extra></extra>",
    )
    title = _coverage_title(frame)
    return _layout(go.Figure(trace), title, x="expert", y="layer", height=_height(len(layers)))


def _binned_heatmap(
    frame: pd.DataFrame, layers: np.ndarray, n_experts: int, *, max_cells: int
) -> go.Figure:
    # 1. Bin width: as few experts per bin as keep layers x bins under max_cells.
    n_bins = max(1, max_cells // len(layers))
    width = math.ceil(n_experts / n_bins)
    n_bins = math.ceil(n_experts / width)
    row_of = {int(layer): i for i, layer in enumerate(layers)}
    rows = np.fromiter((row_of[v] for v in frame["layer"]), dtype=np.int64, count=len(frame))
    bins = frame["expert"].to_numpy() // width
    # 2. Count states per (layer, bin) with one scatter-add per state.
    per_state = np.zeros((3, len(layers), n_bins))
    np.add.at(per_state, (frame["state"].to_numpy(), rows, bins), 1)
    total = per_state.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.where(total > 0, per_state[2] / total, np.nan)
    customdata = np.stack([per_state[2], per_state[1], per_state[0]], axis=-1)
    labels = [f"{b * width}-{min(n_experts, (b + 1) * width) - 1}" for b in range(n_bins)]
    trace = go.Heatmap(
        z=z,
        x=labels,
        y=[str(v) for v in layers],
        customdata=customdata,
        zmin=0,
        zmax=1,
        colorscale=[
            [0, STATE_COLORS["missing"]],
            [0.5, STATE_COLORS["incomplete"]],
            [1, STATE_COLORS["complete"]],
        ],
        colorbar={"title": {"text": "fraction complete"}, "tickformat": ".0%"},
        hovertemplate="layer %{y}, experts %{x}<br>%{z:.1%} complete<br>%{customdata[0]} complete,"
        " %{customdata[1]} incomplete, %{customdata[2]} missing<extra></extra>",
    )
    title = f"{_coverage_title(frame)}; experts aggregated in bins of {width} (fraction complete)"
    return _layout(go.Figure(trace), title, x="experts", y="layer", height=_height(len(layers)))


def _missing_parts(frame: pd.DataFrame, tensors: pd.DataFrame | None) -> dict[tuple[int, int], str]:
    """For incomplete experts: the tensor suffixes their layer's siblings have and they lack."""
    incomplete = frame.loc[frame["state"] == 1, ["layer", "expert"]]
    if tensors is None or tensors.empty or incomplete.empty:
        return {}
    if len(incomplete) > _MAX_DETAILED_CELLS:
        return {}
    # 1. Integer columns only: 300k expert tensors must not go through Python string ops.
    t = tensors.loc[tensors["expert"].notna() & tensors["layer"].notna()]
    layer = t["layer"].to_numpy(dtype="int64")
    expert = t["expert"].to_numpy(dtype="int64")
    key_codes, key_names = _suffix_codes(t)
    known = key_codes >= 0
    layer, expert, key_codes = layer[known], expert[known], key_codes[known]
    # 2. Each layer's set of suffixes, from the unique (layer, suffix) pairs.
    width = max(1, len(key_names))
    per_layer: dict[int, set[int]] = defaultdict(set)
    for pair in np.unique(layer * width + key_codes).tolist():
        lay, key = divmod(pair, width)
        per_layer[lay].add(key)
    # 3. What each incomplete expert has: only its own rows are visited.
    wanted = incomplete["layer"].to_numpy() * (1 << 32) + incomplete["expert"].to_numpy()
    mine = np.isin(layer * (1 << 32) + expert, wanted)
    have: dict[tuple[int, int], set[int]] = defaultdict(set)
    for lay, exp, key in zip(
        layer[mine].tolist(), expert[mine].tolist(), key_codes[mine].tolist(), strict=True
    ):
        have[(lay, exp)].add(key)
    out = {}
    for lay, exp in zip(incomplete["layer"].tolist(), incomplete["expert"].tolist(), strict=True):
        lacks = sorted(key_names[k] for k in per_layer[lay] - have[(lay, exp)])
        if lacks:
            out[(lay, exp)] = _label(", ".join(lacks[:4])) + (" ..." if len(lacks) > 4 else "")
    return out


def _suffix_codes(t: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    """An integer per row for "<last module component>.<param>" ("down_proj.weight"), which
    names an expert's tensor independently of layer and expert number; strings are built
    once per distinct (module, param) pair."""
    module = pd.Categorical(t["module"].astype("category"))
    param = pd.Categorical(t["param"].astype("category"))
    width = len(param.categories)
    combined = module.codes.astype("int64") * width + param.codes
    # A row without module or param (NA) gets no suffix: it is left out of the comparison.
    combined[(module.codes < 0) | (param.codes < 0)] = -1
    uniques, codes = np.unique(combined, return_inverse=True)
    names = []
    for value in uniques.tolist():
        if value < 0:
            names.append("")
            continue
        m, p = divmod(value, width)
        names.append(f"{str(module.categories[m]).rsplit('.', 1)[-1]}.{param.categories[p]}")
    codes = codes.reshape(-1)
    if len(uniques) and uniques[0] < 0:
        codes = codes - 1  # the NA group was code 0; it becomes -1 and names[0] is dropped
        names = names[1:]
    return codes, names


def _coverage_title(frame: pd.DataFrame) -> str:
    counts = np.bincount(frame["state"].to_numpy(), minlength=3)
    n_layers = frame["layer"].nunique()
    return (
        f"Expert coverage: {n_layers} MoE layers, {counts[2]:,} complete, "
        f"{counts[1]:,} incomplete, {counts[0]:,} missing"
    )


def _discrete_scale(colors: list[str]) -> list[list[object]]:
    """A stepped colour scale: colour i covers [i/n, (i+1)/n] exactly."""
    n = len(colors)
    scale: list[list[object]] = []
    for i, color in enumerate(colors):
        scale += [[i / n, color], [(i + 1) / n, color]]
    return scale


# -- shard sizes -------------------------------------------------------------------------------


def shard_size_outliers(
    sizes: pd.Series,
    *,
    factor: float = 3.0,
    tiny: float = 10.0,
    small_ok: pd.Series | None = None,
) -> pd.Series:
    """True where a size is over `factor` x the median or under median / `tiny`.

    The last shard of a greedy split is legitimately smaller than the rest, so the low cut is
    loose (a tenth of the median): it catches empty and truncated files, not the tail shard.
    Where `small_ok` is True a small size is expected (see `expected_small`) and only the
    high cut applies.
    """
    values = sizes.astype("float64")
    median = float(values.median()) if len(values) else 0.0
    if median <= 0:
        return pd.Series(False, index=sizes.index)
    low = values < median / tiny
    if small_ok is not None:
        low &= ~small_ok.to_numpy(dtype=bool)
    return (values > factor * median) | low


def expected_small(files: pd.DataFrame) -> pd.Series:
    """Shards that are small by design: they hold tensors but none of a decoder layer (the
    embedding-only first shard or the head-only last shard of a per-layer export)."""
    if "first_layer" not in files.columns or "tensors" not in files.columns:
        return pd.Series(False, index=files.index)
    return files["first_layer"].isna() & (files["tensors"] > 0)


def shard_size_distribution(files: pd.DataFrame) -> go.Figure:
    """Shard sizes on disk: one bar per file when there are few, else a histogram; outliers
    (see `shard_size_outliers`) are drawn in red and annotated with their ratio to the median.
    Sizes are in decimal units (GB) on the axis and in the hover text."""
    if files is None or files.empty:
        return _empty_figure("Shard sizes", "No shard files.")
    sizes = files["size"].fillna(0).astype("int64")
    names = files["file"].astype(str).map(_label)
    outliers = shard_size_outliers(sizes, small_ok=expected_small(files))
    median = float(sizes.median())
    title = f"Shard sizes: {len(files):,} files, median {format_bytes(median)}"
    if outliers.any():
        n = int(outliers.sum())
        title += f"; {n} outlier{'s' if n != 1 else ''} (> 3x or < 1/10 of the median)"
    divisor, unit = scale_for(float(sizes.max()))
    if len(files) <= _MAX_FILE_BARS:
        fig = _file_bars(names, sizes, outliers, median, divisor)
        return _layout(fig, title, x="file", y=f"size ({unit})")
    fig = _size_histogram(names, sizes, outliers, median, divisor)
    return _layout(fig, title, x=f"size ({unit})", y="files")


def _file_bars(
    names: pd.Series, sizes: pd.Series, outliers: pd.Series, median: float, divisor: float
) -> go.Figure:
    colors = np.where(outliers.to_numpy(), "#d62728", "#1f77b4")
    ratio = (sizes / median if median else sizes * 0).round(2)
    fig = go.Figure(
        go.Bar(
            x=names.tolist(),
            y=(sizes / divisor).tolist(),
            marker={"color": colors.tolist()},
            customdata=np.stack([_bytes_text(sizes), ratio.astype(str)], axis=-1).tolist(),
            hovertemplate="%{x}<br>%{customdata[0]} (%{customdata[1]}x median)<extra></extra>",
            name="shard",
        )
    )
    fig.add_hline(y=median / divisor, line_dash="dot", line_color="#555", annotation_text="median")
    for name, size in zip(names[outliers].tolist(), sizes[outliers].tolist(), strict=True):
        ratio_text = f"{size / median:.2g}x median" if median else "empty"
        fig.add_annotation(x=name, y=size / divisor, text=ratio_text, showarrow=True, arrowhead=2)
    fig.update_xaxes(type="category", tickangle=-45)
    return fig


def _size_histogram(
    names: pd.Series, sizes: pd.Series, outliers: pd.Series, median: float, divisor: float
) -> go.Figure:
    scaled = sizes / divisor
    fig = go.Figure(
        go.Histogram(x=scaled.tolist(), nbinsx=60, name="shards", marker_color="#1f77b4")
    )
    if outliers.any():
        # Outliers also as a red rug under the bars so each one can be hovered by name.
        fig.add_trace(
            go.Scatter(
                x=scaled[outliers].tolist(),
                y=[0] * int(outliers.sum()),
                mode="markers",
                marker={"color": "#d62728", "size": 10, "symbol": "triangle-up"},
                text=names[outliers].tolist(),
                customdata=_bytes_text(sizes[outliers]),
                hovertemplate="%{text}<br>%{customdata}<extra>outlier</extra>",
                name="outlier",
            )
        )
        shown = sizes[outliers].sort_values(ascending=False).head(5)
        label_of = names.to_dict()
        for idx, size in shown.items():
            name = label_of[idx]
            text = f"{name}: {size / median:.2g}x median" if median else str(name)
            fig.add_annotation(
                x=size / divisor, y=0, text=text, showarrow=True, arrowhead=2, ay=-40
            )
    fig.add_vline(x=median / divisor, line_dash="dot", line_color="#555", annotation_text="median")
    return fig


def _bytes_text(sizes: pd.Series) -> list[str]:
    """'4.1 GB' per value; a handful of distinct sizes are formatted once each."""
    texts = {v: format_bytes(v) for v in pd.unique(sizes.to_numpy())}
    return [texts[v] for v in sizes.to_numpy()]


# -- bytes and parameters per layer ------------------------------------------------------------


def bytes_per_layer(tensors: pd.DataFrame) -> go.Figure:
    """Stacked bars: bytes of each layer, split by dtype. Tensors outside any layer
    (embedding, output head) are one bar labelled "other"."""
    if tensors is None or tensors.empty:
        return _empty_figure("Bytes per layer", "No tensors.")
    table = _per_layer(tensors, value="nbytes", by="dtype")
    # One unit for the whole axis, chosen by the tallest stack.
    divisor, unit = scale_for(float(table.sum(axis=1).max()))
    fig = go.Figure()
    for dtype in table.columns:
        fig.add_trace(
            go.Bar(
                x=table.index.tolist(),
                y=(table[dtype] / divisor).tolist(),
                name=_label(dtype),
                customdata=_bytes_text(table[dtype]),
                hovertemplate="layer %{x}<br>%{fullData.name}: %{customdata}<extra></extra>",
            )
        )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(type="category")
    title = f"Bytes per layer by dtype ({format_bytes(float(tensors['nbytes'].sum()))} in total)"
    return _layout(fig, title, x="layer", y=f"size ({unit})")


def parameters_per_layer(layers: pd.DataFrame) -> go.Figure:
    """Bars: parameters of each layer, one colour per layer kind (moe, dense, mtp ...)."""
    if layers is None or layers.empty:
        return _empty_figure("Parameters per layer", "No layers.")
    fig = go.Figure()
    labels = layers["layer"].astype("Int64").astype(str)
    for kind in sorted(layers["kind"].astype(str).unique()):
        mask = (layers["kind"].astype(str) == kind).to_numpy()
        fig.add_trace(
            go.Bar(
                x=labels[mask].tolist(),
                y=layers.loc[mask, "parameters"].astype("int64").tolist(),
                name=_label(kind),
                hovertemplate="layer %{x} (%{fullData.name})<br>%{y:,} parameters<extra></extra>",
            )
        )
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=labels.tolist())
    fig.update_layout(showlegend=True)  # the kind is only told by the legend
    return _layout(fig, "Parameters per layer by kind", x="layer", y="parameters")


def _per_layer(tensors: pd.DataFrame, *, value: str, by: str) -> pd.DataFrame:
    """value summed per (layer, by) as a wide frame indexed by layer label, layers in order
    and the "other" bucket last."""
    layer = tensors["layer"].astype("Int64")
    frame = pd.DataFrame(
        {
            "layer": layer.fillna(-1).astype("int64"),
            "by": tensors[by].astype(str),
            "value": tensors[value].astype("int64"),
        }
    )
    wide = frame.pivot_table(
        index="layer", columns="by", values="value", aggfunc="sum", fill_value=0
    )
    order = sorted(wide.index, key=lambda v: (v < 0, v))
    wide = wide.loc[order]
    wide.index = [_NO_LAYER if v < 0 else str(v) for v in wide.index]
    return wide


# -- findings ----------------------------------------------------------------------------------


def findings_by_code(findings: pd.DataFrame) -> go.Figure:
    """Horizontal bars: number of findings per code, coloured by severity, worst first."""
    if findings is None or findings.empty:
        return _empty_figure("Findings by code", "No findings.")
    counts = (
        findings.assign(
            code=findings["code"].astype(str), severity=findings["severity"].astype(str)
        )
        .groupby(["severity", "code"])
        .size()
        .rename("count")
        .reset_index()
    )
    rank = {"error": 0, "warning": 1, "info": 2}
    counts["rank"] = counts["severity"].map(rank).fillna(3)
    counts = counts.sort_values(["rank", "count", "code"], ascending=[True, False, True])
    fig = go.Figure()
    for severity in sorted(counts["severity"].unique(), key=lambda s: rank.get(s, 3)):
        part = counts[counts["severity"] == severity]
        fig.add_trace(
            go.Bar(
                x=part["count"].tolist(),
                y=part["code"].tolist(),
                orientation="h",
                name=severity,
                marker_color=SEVERITY_COLORS.get(severity, "#7f7f7f"),
                hovertemplate="%{y}: %{x}<extra>" + severity + "</extra>",
            )
        )
    # Worst code on top: categories listed bottom-up.
    fig.update_yaxes(
        type="category", categoryorder="array", categoryarray=counts["code"].tolist()[::-1]
    )
    # Counts are whole numbers: no 0.2-step ticks when every code has one finding.
    fig.update_xaxes(tick0=0, dtick=max(1, math.ceil(int(counts["count"].max()) / 8)))
    height = 120 + 28 * len(counts)
    return _layout(
        fig, f"Findings by code ({len(findings):,})", x="findings", y="code", height=height
    )


# -- serving plans (`fit`) ---------------------------------------------------------------------

_PLAN_COLORS = {True: STATE_COLORS["complete"], False: STATE_COLORS["missing"]}


def serving_plans(plans: pd.DataFrame) -> go.Figure:
    """Bars: the weights of the fullest GPU of each parallel plan (`FitResult.frame()`),
    green where vLLM and SGLang would start it (and it fits), red where not, hovering the
    codes that decide; a dashed line at the memory the engine may use of the GPU, when one
    was given."""
    if plans is None or plans.empty:
        return _empty_figure("Weights per GPU by parallel plan", "No parallel plan.")
    weights = plans["weights_bytes_per_rank"].to_numpy(dtype="float64")
    budget = plans["budget_bytes"].dropna().to_numpy(dtype="float64")
    top = max(float(weights.max()), float(budget.max()) if len(budget) else 0.0)
    divisor, unit = scale_for(top)
    fig = go.Figure()
    for feasible in (True, False):
        part = plans[plans["feasible"] == feasible]
        if part.empty:
            continue
        sizes = _bytes_text(part["weights_bytes_per_rank"])
        reasons = [_label(codes) or "starts" for codes in part["codes"].astype(str)]
        fig.add_trace(
            go.Bar(
                x=part["plan"].astype(str).tolist(),
                y=(part["weights_bytes_per_rank"].astype("float64") / divisor).tolist(),
                name="serves" if feasible else "does not serve",
                marker_color=_PLAN_COLORS[feasible],
                customdata=list(zip(sizes, reasons, strict=True)),
                hovertemplate="%{x}<br>%{customdata[0]} per GPU<br>%{customdata[1]}"
                "<extra>%{fullData.name}</extra>",
            )
        )
    if len(budget):
        fig.add_hline(
            y=budget[0] / divisor,
            line_dash="dash",
            line_color="#555",
            annotation_text=f"usable GPU memory ({format_bytes(budget[0])})",
        )
    fig.update_xaxes(
        type="category", categoryorder="array", categoryarray=plans["plan"].astype(str).tolist()
    )
    return _layout(fig, "Weights per GPU by parallel plan", x="plan", y=f"weights ({unit})")


# -- tensor values (`ckpt.values`) -------------------------------------------------------------
# Layer x tensor kind, coloured by log10 of std or absmax, one column per expert for MoE
# tensors, outliers marked. Each cell carries its tensor's name as `customdata`, so a click
# can show that tensor's row.

METRICS = ("std", "absmax")
_MARK = {"tensor-values-outlier": "#f2a900", "tensor-uninitialised": "#d62728"}
_NAN_MARK = "#7f0000"
# Columns beyond this many: experts of one tensor kind are folded into one column (its cell
# shows the expert furthest from the siblings' median) so the figure stays drawable.
_MAX_COLUMNS = 1_500
_LAYER_PART = re.compile(r"^.*?\.(\d+)\.")


def values_heatmap(values: pd.DataFrame, *, metric: str = "std") -> go.Figure:
    """Layers (rows) x tensor kinds (columns) of log10(`metric`), per expert for MoE tensors;
    NaN/Inf and all-zero tensors drawn dark, outliers and never-written tensors marked."""
    title = f"Tensor values: log10 {metric} per layer and tensor kind"
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r}: expected one of {', '.join(METRICS)}")
    if values is None or values.empty or not values["decoded"].any():
        return _empty_figure(title, "No value statistics (run check --values sample|full)")
    frame = values[values["decoded"]].copy()
    frame["column"] = [_column(n, e) for n, e in zip(frame["name"], _experts(frame), strict=True)]
    frame["row"] = [_row(n, layer) for n, layer in zip(frame["name"], _layers(frame), strict=True)]
    if frame["column"].nunique() > _MAX_COLUMNS:
        frame["column"] = [_column(n, None) for n in frame["name"]]
        frame = frame.sort_values("finding", ascending=False, kind="stable")
    frame = frame.drop_duplicates(["row", "column"])
    with np.errstate(divide="ignore", invalid="ignore"):
        frame["z"] = np.log10(frame[metric].astype(float))
    frame.loc[~np.isfinite(frame["z"]), "z"] = np.nan
    rows = sorted(frame["row"].unique(), key=_row_key)
    columns = sorted(frame["column"].unique(), key=_column_key)
    grid = frame.pivot(index="row", columns="column", values="z").reindex(
        index=rows, columns=columns
    )
    names = frame.pivot(index="row", columns="column", values="name").reindex(
        index=rows, columns=columns
    )
    hover = frame.assign(text=[_hover(r, metric) for r in frame.itertuples(index=False)])
    text = hover.pivot(index="row", columns="column", values="text").reindex(
        index=rows, columns=columns
    )
    fig = go.Figure(
        go.Heatmap(
            z=grid.to_numpy(),
            x=[_label(c) for c in columns],
            y=[_label(r) for r in rows],
            customdata=names.fillna("").to_numpy(),
            text=text.fillna("").to_numpy(),
            hovertemplate="%{text}<extra></extra>",
            colorscale="Viridis",
            colorbar={"title": f"log10 {metric}"},
            hoverongaps=False,
        )
    )
    marked = frame[(frame["finding"] != "") | (frame["nan"] + frame["inf"] > 0) | frame["all_zero"]]
    for label, part, color in _marks(marked):
        fig.add_trace(
            go.Scatter(
                x=[_label(c) for c in part["column"]],
                y=[_label(r) for r in part["row"]],
                mode="markers",
                marker={"symbol": "x", "size": 12, "color": color, "line": {"width": 2}},
                name=label,
                customdata=part["name"].tolist(),
                text=[_hover(r, metric) for r in part.itertuples(index=False)],
                hovertemplate="%{text}<extra></extra>",
            )
        )
    _layout(fig, title, x="tensor kind", y="layer", height=_height(len(rows)))
    _column_labels(fig, columns)
    fig.update_yaxes(type="category", autorange="reversed")
    return fig


# The values heatmap's column labels (tensor kinds, up to thousands of them): upright, so
# neighbours never cross as they did at -45 degrees; at most `_LABELS_ACROSS` of them (every
# k-th: at 12 px a label, about what a notebook's width holds) and each at most
# `_LABEL_CHARS` long, so that the margin under the plot stays bounded.
_LABELS_ACROSS = 80
_LABEL_CHARS = 40
_LABEL_FONT = 10  # px


def _column_labels(fig: go.Figure, columns: list[str]) -> None:
    """Upright, thinned, elided labels on the x axis; the axis title and the legend placed
    where the labels cannot reach them (the title below the labels' margin, the legend above
    the plot), the figure made taller by the labels' height."""
    step = max(1, -(-len(columns) // _LABELS_ACROSS))
    shown = columns[::step]
    texts = [_elided(legible(c)) for c in shown]
    longest = max(map(len, texts), default=0)
    # plotly.js sizes the margin for the labels itself (automargin); the figure grows by as
    # much so the plot keeps its height. ~0.6 em a character.
    labels_px = int(longest * _LABEL_FONT * 0.6) + 10
    fig.update_xaxes(
        type="category",
        tickangle=-90,
        automargin=True,
        tickmode="array",
        tickvals=[_label(c) for c in shown],
        ticktext=[html.escape(t, quote=False) for t in texts],
        tickfont={"size": _LABEL_FONT},
        title={"text": "tensor kind", "standoff": 8},
    )
    fig.update_layout(
        height=(fig.layout.height or 0) + labels_px,
        margin={"t": 80},
        legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.02, "yanchor": "bottom"},
    )


def _elided(text: str) -> str:
    """`text` cut in its middle to `_LABEL_CHARS` (a tensor kind differs at both ends)."""
    if len(text) <= _LABEL_CHARS:
        return text
    half = (_LABEL_CHARS - 3) // 2
    return f"{text[:half]}...{text[-(_LABEL_CHARS - 3 - half) :]}"


def _marks(marked: pd.DataFrame) -> list[tuple[str, pd.DataFrame, str]]:
    out = []
    bad = marked["nan"] + marked["inf"] > 0
    if bad.any():
        out.append(("NaN/Inf", marked[bad], _NAN_MARK))
    zero = marked["all_zero"] & ~bad
    if zero.any():
        out.append(("all zero", marked[zero], "#444444"))
    for code, color in _MARK.items():
        part = marked[(marked["finding"] == code) & ~bad & ~zero]
        if len(part):
            out.append((code, part, color))
    return out


def _experts(frame: pd.DataFrame) -> list[int | None]:
    if "expert" not in frame:
        return [None] * len(frame)
    return [None if pd.isna(e) or int(e) < 0 else int(e) for e in frame["expert"]]


def _layers(frame: pd.DataFrame) -> list[int | None]:
    if "layer" not in frame:
        return [None] * len(frame)
    return [None if pd.isna(v) or int(v) < 0 else int(v) for v in frame["layer"]]


def _column(name: str, expert: int | None) -> str:
    """The tensor kind: the name after its layer number, the expert number kept (or folded
    to '#')."""
    match = _LAYER_PART.match(name)
    rest = name[match.end() :] if match else name
    if expert is None:
        return re.sub(r"(?<=\.)\d+(?=\.)", "#", rest)
    return re.sub(rf"(?<=\.){expert}(?=\.)", f"e{expert}", rest, count=1)


def _row(name: str, layer: int | None) -> str:
    return f"layer {layer}" if layer is not None else "other"


def _row_key(row: str) -> tuple[int, int]:
    return (0, int(row.split()[1])) if row.startswith("layer ") else (1, 0)


def _column_key(column: str) -> tuple[str, int]:
    match = re.search(r"\.e(\d+)\.", f".{column}")
    base = re.sub(r"(?<=\.)e\d+(?=\.)", "#", column)
    return (base, int(match.group(1)) if match else -1)


def _hover(row: object, metric: str) -> str:
    get = row.__getattribute__
    parts = [
        f"<b>{_label(get('name'))}</b>",
        f"{metric} {get(metric):.3g} (siblings' median {get('sibling_' + metric):.3g})",
        f"min {get('min'):.3g}, max {get('max'):.3g}, mean {get('mean'):.3g}",
        f"zeros {get('zero_frac'):.1%}, NaN {get('nan'):,}, Inf {get('inf'):,}",
    ]
    if get("finding"):
        parts.append(f"{get('finding')}: {_label(get('why'))}")
    return "<br>".join(parts)


# -- shared helpers ----------------------------------------------------------------------------

# The trace types these figures draw: their figures carry plotly_white's defaults for these
# alone. The whole template (defaults for 24 trace types) is copied and validated into every
# figure that names it: 12-14 ms a figure against 6-7, and 3.3 kB more in each figure's JSON
# (in the page, the report and the saved notebook), for trace types never drawn here.
_TRACE_TYPES = ("bar", "heatmap", "histogram", "scatter")


@functools.cache
def _template() -> go.layout.Template:
    """plotly_white with its trace defaults for `_TRACE_TYPES` only (built once)."""
    white = pio.templates["plotly_white"].to_plotly_json()
    data = {kind: white["data"][kind] for kind in _TRACE_TYPES}
    return go.layout.Template(layout=white["layout"], data=data)


def prepare_template() -> None:
    """Build plotly's template of the figures once per kernel, ahead of the first figure:
    the first figure that names it imports about 180 of plotly's graph-object modules and
    validates the template (0.6-1.9 s of the kernel's CPU on the 1422 demo, 4.6 s of the
    Files tab's first click at load 6), a later figure copies it."""
    _templated(go.Figure())


def _templated(fig: go.Figure) -> go.Figure:
    """`fig` with `_template()` as its template, set as plotly sets its default template
    (`BaseFigure._initialize_layout_template`: the layout's validation off while it is
    assigned): the template was validated when it was built. Assigned with validation, it
    was copied into a new Template and every property of it checked again in each figure:
    10 ms of the 17 ms a small figure took (the figure's JSON is the same either way; the
    layout keeps its own deep copy, so no figure shares the cached template)."""
    layout = fig.layout
    layout._validate = False
    try:
        layout.template = _template()
    finally:
        layout._validate = fig._validate
    return fig


def _layout(fig: go.Figure, title: str, *, x: str, y: str, height: int | None = None) -> go.Figure:
    _templated(fig).update_layout(
        title={"text": title, "x": 0.01},
        # No fixed width: the figure takes the width of its output or page.
        autosize=True,
        margin={"l": 60, "r": 20, "t": 60, "b": 60},
        xaxis_title=x,
        yaxis_title=y,
        legend={"orientation": "h", "y": -0.2},
        **({"height": height} if height else {}),
    )
    return fig


def _empty_figure(title: str, message: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(
        text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font={"size": 16}
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    _templated(fig).update_layout(
        title={"text": title, "x": 0.01},
        autosize=True,
        height=140,
        margin={"l": 20, "r": 20, "t": 40, "b": 10},
    )
    return fig


def _label(text: object) -> str:
    """Checkpoint-chosen text for a figure: bounded, control characters escaped (`legible`),
    and, since plotly.js renders tags such as <a href> in labels, `<`, `>` and `&` escaped
    (plotly.js shows the entities as the plain characters)."""
    return html.escape(legible(text), quote=False)


def _height(n_rows: int) -> int:
    """Cells stay legible for a handful of layers and the figure stays on screen for 100+."""
    return int(min(1200, max(260, 140 + 14 * n_rows)))
