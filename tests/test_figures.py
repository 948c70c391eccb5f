"""Figures from hand-made tables (exact cell states, outliers, aggregation) and from a real scan."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from inspector.widgets.figures import (
    STATE_COLORS,
    bytes_per_layer,
    expert_coverage_heatmap,
    findings_by_code,
    parameters_per_layer,
    shard_size_distribution,
    shard_size_outliers,
)
from safetensors.numpy import save_file

from inspector._internal.common.filenames import SAFETENSORS_WEIGHTS_NAME
from inspector._internal.findings.finding import findings_to_frame, make_finding
from inspector._internal.scan.entry import scan

PROJS = ("gate_proj", "up_proj", "down_proj")


def _experts(layers: int, experts: int, *, missing=(), incomplete=(), skip=()) -> pd.DataFrame:
    """An experts table: 3 tensors expected per expert; `missing` cells have none, `incomplete`
    ones 2, `skip` cells have no row at all."""
    rows = []
    for layer in range(layers):
        for expert in range(experts):
            if (layer, expert) in skip:
                continue
            found = 0 if (layer, expert) in missing else 2 if (layer, expert) in incomplete else 3
            rows.append((layer, expert, found, 3, found * 64, (layer, expert) in missing))
    frame = pd.DataFrame(
        rows,
        columns=["layer", "expert", "tensors_found", "tensors_expected", "bytes", "missing"],
    )
    return frame.astype({"layer": "Int64", "expert": "Int64"})


# -- expert coverage heatmap -------------------------------------------------------------------


def test_heatmap_cell_states_and_legend():
    experts = _experts(3, 8, missing={(2, 5), (2, 6), (2, 7)}, incomplete={(1, 2)}, skip={(0, 7)})
    fig = expert_coverage_heatmap(experts)
    (trace,) = fig.data
    z = np.asarray(trace.z)
    assert z.shape == (3, 8)
    assert z[1, 2] == 1 and z[2, 5] == 0 and z[2, 7] == 0 and z[0, 0] == 2
    assert np.isnan(z[0, 7]), "a cell without a row must stay blank, not look complete"
    assert list(trace.colorbar.ticktext) == ["missing", "incomplete", "complete"]
    # The stepped scale gives each state exactly its colour.
    scale = dict((round(pos, 3), color) for pos, color in trace.colorscale)
    assert scale[0.0] == STATE_COLORS["missing"] and scale[1.0] == STATE_COLORS["complete"]
    assert (trace.zmin, trace.zmax) == (-0.5, 2.5)
    assert "19 complete, 1 incomplete, 3 missing" in fig.layout.title.text
    counts = np.asarray(trace.customdata)
    assert counts[1, 2].tolist() == [2, 3] and counts[2, 6].tolist() == [0, 3]
    assert trace.text[2][6] == "missing: no tensors"
    assert "layer %{y}, expert %{x}" in trace.hovertemplate


def test_heatmap_hover_names_the_absent_tensor():
    experts = _experts(2, 4, incomplete={(1, 3)})
    names, layers, expert_ids, modules, params = [], [], [], [], []
    for layer in range(2):
        for expert in range(4):
            for proj in PROJS:
                if (layer, expert, proj) == (1, 3, "down_proj"):
                    continue
                names.append(f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight")
                layers.append(layer)
                expert_ids.append(expert)
                modules.append(f"mlp.experts.{proj}")
                params.append("weight")
    tensors = pd.DataFrame(
        {"name": names, "layer": layers, "expert": expert_ids, "module": modules, "param": params}
    ).astype({"layer": "Int64", "expert": "Int64", "module": "category"})
    trace = expert_coverage_heatmap(experts, tensors=tensors).data[0]
    assert trace.text[1][3] == "incomplete: lacks down_proj.weight"
    assert trace.text[1][2] == "complete"
    # Rows whose module is unknown (NA) are left out instead of breaking the hover text.
    odd = tensors.assign(module=tensors["module"].cat.add_categories([]).where(tensors.index != 0))
    assert odd["module"].isna().sum() == 1
    assert expert_coverage_heatmap(experts, tensors=odd).data[0].text[1][3] == (
        "incomplete: lacks down_proj.weight"
    )


def test_heatmap_aggregates_experts_above_max_cells():
    missing = {(0, e) for e in range(4)} | {(3, 99)}
    experts = _experts(4, 100, missing=missing, incomplete={(1, 50)})
    fig = expert_coverage_heatmap(experts, max_cells=100)
    (trace,) = fig.data
    z = np.asarray(trace.z)
    # 100 cells / 4 layers = 25 bins of 4 experts each.
    assert z.shape == (4, 25)
    assert "bins of 4" in fig.layout.title.text
    assert z[0, 0] == 0.0  # experts 0-3 of layer 0 all missing
    assert z[1, 12] == 0.75  # expert 50 incomplete: 3 of 4 complete
    assert z[3, 24] == 0.75 and z[2, 24] == 1.0
    assert list(trace.x[:2]) == ["0-3", "4-7"]
    assert np.asarray(trace.customdata)[1, 12].tolist() == [3, 1, 0]


def test_heatmap_cells_at_the_limit_are_not_aggregated():
    fig = expert_coverage_heatmap(_experts(4, 25), max_cells=100)
    assert np.asarray(fig.data[0].z).shape == (4, 25)
    assert "bins" not in fig.layout.title.text


def test_heatmap_empty_input_explains_itself():
    fig = expert_coverage_heatmap(_experts(0, 0))
    assert len(fig.data) == 0
    assert "No MoE experts" in fig.layout.annotations[0].text


# -- shard sizes -------------------------------------------------------------------------------


def _files(sizes: list[int], names: list[str] | None = None) -> pd.DataFrame:
    names = names or [
        f"model-{i + 1:05d}-of-{len(sizes):05d}.safetensors" for i in range(len(sizes))
    ]
    return pd.DataFrame({"file": pd.Categorical(names), "size": sizes})


def test_shard_size_outliers_rule():
    sizes = pd.Series([1000, 1000, 1000, 1000, 400, 3500, 0])
    assert shard_size_outliers(sizes).tolist() == [False] * 4 + [False, True, True]
    # A shard that is small by design (embedding only) is not flagged; a huge one still is.
    small_ok = pd.Series([False] * 5 + [True, True])
    assert shard_size_outliers(sizes, small_ok=small_ok).tolist() == [False] * 5 + [True, False]


def test_embedding_only_first_shard_of_a_per_layer_export_is_not_an_outlier():
    files = pd.DataFrame(
        {
            "file": [f"model-{i:05d}-of-00005.safetensors" for i in range(1, 6)],
            "size": [3_000_000, 4_000_000_000, 4_100_000_000, 4_000_000_000, 50_000],
            "tensors": [1, 900, 900, 900, 0],
            "first_layer": pd.array([None, 0, 1, 2, None], dtype="Int64"),
        }
    )
    fig = shard_size_distribution(files)
    colors = list(fig.data[0].marker.color)
    assert colors[0] != "#d62728"  # the embedding-only shard: small by design
    assert colors[4] == "#d62728"  # an empty file is still an outlier
    assert fig.layout.yaxis.title.text == "size (GB)"
    assert fig.data[0].customdata[1][0] == "4.0 GB"


def test_shard_bars_mark_and_annotate_outliers():
    sizes = [5_000_000] * 6 + [2_000_000, 40_000_000]
    fig = shard_size_distribution(_files(sizes))
    (bar,) = fig.data
    assert bar.type == "bar" and len(bar.x) == 8
    colors = list(bar.marker.color)
    assert colors[7] == "#d62728" and colors[6] == colors[0] != "#d62728"
    texts = [a.text for a in fig.layout.annotations]
    assert "8x median" in texts
    assert "1 outlier (" in fig.layout.title.text


def test_many_shards_become_a_histogram_with_outlier_markers():
    sizes = [4_900_000_000 + i for i in range(99)] + [1_000]
    fig = shard_size_distribution(_files(sizes))
    kinds = [t.type for t in fig.data]
    assert kinds == ["histogram", "scatter"]
    assert list(fig.data[1].text) == ["model-00100-of-00100.safetensors"]
    assert len(fig.data[0].x) == 100


def test_shard_names_are_escaped_for_plotly_labels():
    fig = shard_size_distribution(
        _files([10, 10], ["<a href='x'>a</a>.safetensors", "b.safetensors"])
    )
    assert fig.data[0].x[0] == "&lt;a href='x'&gt;a&lt;/a&gt;.safetensors"


def test_empty_files_frame():
    fig = shard_size_distribution(_files([]))
    assert "No shard files" in fig.layout.annotations[0].text


# -- per layer ---------------------------------------------------------------------------------


def test_bytes_per_layer_stacks_dtypes_with_other_last():
    tensors = pd.DataFrame(
        {
            "layer": pd.array([0, 0, 1, 1, 10, None], dtype="Int64"),
            "dtype": pd.Categorical(["BF16", "F8_E4M3", "BF16", "BF16", "F8_E4M3", "BF16"]),
            "nbytes": [100, 50, 30, 20, 7, 1000],
        }
    )
    fig = bytes_per_layer(tensors)
    assert fig.layout.barmode == "stack"
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {"BF16", "F8_E4M3"}
    assert list(by_name["BF16"].x) == ["0", "1", "10", "other"]
    # The tallest stack is 1,000 bytes: the axis is in kB (decimal), the hover exact.
    assert fig.layout.yaxis.title.text == "size (kB)"
    assert list(by_name["BF16"].y) == [0.1, 0.05, 0.0, 1.0]
    assert list(by_name["F8_E4M3"].y) == [0.05, 0.0, 0.007, 0.0]
    assert list(by_name["BF16"].customdata) == ["100 B", "50 B", "0 B", "1.0 kB"]


def test_parameters_per_layer_by_kind():
    layers = pd.DataFrame(
        {
            "layer": pd.array([0, 1, 2, 3], dtype="Int64"),
            "kind": ["dense", "moe", "moe", "mtp"],
            "parameters": [10, 200, 190, 50],
            "is_mtp": [False, False, False, True],
        }
    )
    fig = parameters_per_layer(layers)
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {"dense", "moe", "mtp"}
    assert list(by_name["moe"].x) == ["1", "2"] and list(by_name["moe"].y) == [200, 190]
    assert list(fig.layout.xaxis.categoryarray) == ["0", "1", "2", "3"]


# -- findings ----------------------------------------------------------------------------------


def test_findings_by_code_counts_and_colours():
    findings = [
        make_finding("expert-missing", "layer 1 lacks experts 4-7", layer=1),
        make_finding("expert-missing", "layer 2 lacks experts 4-7", layer=2),
        make_finding("trailing-bytes", "x.safetensors has 3 extra bytes", file="x.safetensors"),
        make_finding("file-truncated", "y.safetensors is short", file="y.safetensors"),
    ]
    fig = findings_by_code(findings_to_frame(findings))
    by_name = {t.name: t for t in fig.data}
    assert list(by_name) == ["error", "warning"]
    assert dict(zip(by_name["error"].y, by_name["error"].x, strict=True)) == {
        "expert-missing": 2,
        "file-truncated": 1,
    }
    assert by_name["warning"].marker.color == "#f2a900"
    # Worst first from the top: the category array lists bottom-up.
    assert list(fig.layout.yaxis.categoryarray)[-1] == "expert-missing"
    empty = findings_by_code(findings_to_frame([]))
    assert "No findings" in empty.layout.annotations[0].text


# -- real scan ---------------------------------------------------------------------------------


def test_figures_from_a_real_scan(tmp_path: Path):
    """A 3-layer MoE written with safetensors; layer 2 lost experts 2-3 and layer 1 expert 0's
    down_proj."""
    rng = np.random.default_rng(0)
    for shard, layers in enumerate(((0, 1), (2,)), start=1):
        tensors = {}
        for layer in layers:
            tensors[f"model.layers.{layer}.self_attn.q_proj.weight"] = rng.standard_normal(
                (8, 8), dtype=np.float32
            )
            for expert in range(4):
                for proj in PROJS:
                    if (layer == 2 and expert >= 2) or (layer, expert, proj) == (1, 0, "down_proj"):
                        continue
                    name = f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight"
                    tensors[name] = np.ones((4, 8), dtype=np.float16)
        save_file(tensors, tmp_path / f"model-{shard:05d}-of-00002.safetensors")
    scanned = scan(tmp_path)
    z = np.asarray(expert_coverage_heatmap(scanned.experts, tensors=scanned.tensors).data[0].z)
    assert z[1, 0] == 1 and z[2, 2] == 0 and z[2, 3] == 0 and z[0, 3] == 2
    fig = bytes_per_layer(scanned.tensors)
    assert {t.name for t in fig.data} == {"F16", "F32"}
    f16 = next(t for t in fig.data if t.name == "F16")
    # Bytes per layer (768 B at most, counting the F32 q_proj too: 1,024 B) in kB.
    assert fig.layout.yaxis.title.text == "size (kB)"
    assert list(f16.y) == [4 * 3 * 64 / 1000, (4 * 3 - 1) * 64 / 1000, 2 * 3 * 64 / 1000]
    assert list(f16.customdata) == ["768 B", "704 B", "384 B"]
    assert len(shard_size_distribution(scanned.files).data[0].x) == 2


def test_widgets_package_is_lazy():
    """`import inspector.widgets` loads neither plotly nor ipywidgets; `.figures` no ipywidgets;
    the Markdown summary (core) never loads plotly. One fresh interpreter (1 s of CPU to
    start), the core first: it adds neither module for the later asserts to miss."""
    code = (
        "import sys, inspector._internal.report.markdown\n"
        "assert 'plotly' not in sys.modules\n"
        "import inspector.widgets as widgets\n"
        "assert 'plotly' not in sys.modules and 'ipywidgets' not in sys.modules\n"
        "import inspector.widgets.figures\n"
        "assert 'ipywidgets' not in sys.modules\n"
        "assert callable(widgets.expert_coverage_heatmap)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


@pytest.mark.parametrize("max_cells", [1, 7])
def test_heatmap_never_has_fewer_than_one_bin(max_cells: int):
    fig = expert_coverage_heatmap(_experts(10, 6), max_cells=max_cells)
    assert np.asarray(fig.data[0].z).shape == (10, 1)
    assert np.asarray(fig.data[0].z)[0, 0] == 1.0


def test_figures_are_shown_without_importing_nbformat():
    """plotly's renderers (imported by its widget too) import nbformat (then jsonschema, whose
    format checkers build a lark grammar: 1.6-4.2 s of a kernel's CPU) only to check its
    version each time a figure is shown. In a shell, the dashboard's widget and a figure of
    `inspector.widgets.figures` shown with `fig.show()` or as a cell's result import neither;
    the version plotly checks is the installed one, and any other use of the module imports
    it. In a fresh interpreter."""
    code = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
from IPython.display import display
from inspector.widgets.figures import findings_by_code
from inspector.widgets.plot import figure_widget
import pandas as pd
import plotly.graph_objects as go
import plotly.io._renderers as renderers
shown = []
shell.display_pub.publish = lambda data, **kwargs: shown.append(sorted(data))
widget = figure_widget(go.Figure(go.Bar(y=[1, 2])), "ckpt-test")
go.Figure(go.Bar(y=[3])).show(renderer="plotly_mimetype")
# As a notebook shows it (in a kernel plotly sets both itself):
renderers.renderers.default, renderers.renderers.render_on_display = "plotly_mimetype", True
display(findings_by_code(pd.DataFrame()))
before = {m: m in sys.modules for m in ("nbformat", "jsonschema")}
# As in the test process (conftest.py): jsonschema builds no IRI grammar nothing here checks.
sys.modules.setdefault("rfc3987_syntax", None)
import nbformat
print(json.dumps({
    "before": before, "shown": shown, "bars": len(widget.data),
    "version": renderers.nbformat.__version__ == nbformat.__version__,
    "reads": renderers.nbformat.reads is nbformat.reads,
}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["before"] == {"nbformat": False, "jsonschema": False}, result
    bundle = ["application/vnd.plotly.v1+json"]
    assert result["shown"] == [bundle, bundle] and result["bars"] == 1, result
    assert result["version"] and result["reads"], result


def test_dashboard_figures_load_the_cartesian_bundle_and_refuse_later_edits():
    """The page gets plotly.js's cartesian bundle (every trace type the figures use), never
    the whole of plotly.js; a figure is drawn once from its first state, so an edit from the
    kernel is refused with what to do instead of silently never reaching the page."""
    import plotly.graph_objects as go
    import plotly.offline
    from inspector.widgets.figures import expert_coverage_heatmap, shard_size_distribution
    from inspector.widgets.plot import figure_module, figure_widget
    from inspector.widgets.plotlyjs import cartesian_bundle

    module = figure_module()
    assert cartesian_bundle() in module and plotly.offline.get_plotlyjs() not in module
    assert "plotly.js (cartesian - minified) v" in cartesian_bundle()[:200]
    # Every trace type the UI's code makes (`go.Bar(...)`: type "bar") is one the bundle
    # registers: a 3D or map trace added to a figure would draw nothing.
    held = set(re.findall(r'moduleType:"trace",name:"(\w+)"', cartesian_bundle()))
    widgets = Path(figure_module.__code__.co_filename).parent
    made = {
        kind.lower()
        for source in widgets.glob("*.py")
        for kind in re.findall(r"\bgo\.([A-Z]\w*)\(", source.read_text())
        if kind not in ("Figure", "Layout")
    }
    assert made and made <= held, (made - held, held)
    figure = figure_widget(go.Figure(go.Bar(x=[1, 2], y=[3, 4])), "ckpt-probe")
    state = figure.get_state()
    assert figure._module_holder.source == module and "ckpt-probe" in state["_dom_classes"]
    for edit in (
        lambda: setattr(figure.data[0].marker, "color", "red"),
        lambda: figure.update_layout(title="edited"),
        lambda: figure.add_trace(go.Bar(x=[1], y=[1])),
    ):
        with pytest.raises(TypeError, match=r"drawn once .*figure_widget"):
            edit()
    # The figure functions' own output is drawn with no edit at all.
    empty = pd.DataFrame(columns=["layer", "expert", "tensors_found", "tensors_expected"])
    figure_widget(expert_coverage_heatmap(empty), "ckpt-expert-heatmap")
    figure_widget(shard_size_distribution(pd.DataFrame()), "ckpt-shard-sizes")


def test_snapshot_pngs_are_drawn_by_the_cartesian_bundle_without_mathjax(monkeypatch):
    """kaleido's page evaluates the plotly.js the dashboard draws with, read from the vendored
    file, and fetches no MathJax from a CDN (its defaults: all of plotly.js, MathJax from
    cdnjs, on every kernel's first snapshot). The PNGs come out byte for byte the same."""
    import kaleido
    from inspector.widgets import snapshot
    from inspector.widgets.plotlyjs import cartesian_bundle, cartesian_bundle_file

    started: list[dict] = []
    monkeypatch.setattr(snapshot, "_server_started", False)
    monkeypatch.setattr(kaleido, "start_sync_server", lambda **options: started.append(options))
    monkeypatch.setattr(kaleido, "calc_fig_sync", lambda fig, opts: b"png")
    figures = [("shard sizes", shard_size_distribution(pd.DataFrame()))]
    assert snapshot.render_pngs(figures) == [b"png"]
    assert snapshot.render_pngs(figures) == [b"png"]  # one kaleido per process
    (options,) = started
    assert options["mathjax"] is False
    assert Path(options["plotlyjs"]).read_text(encoding="utf-8") == cartesian_bundle()
    assert Path(options["plotlyjs"]) == cartesian_bundle_file()


def test_snapshot_pngs_are_drawn_by_a_headless_shell_where_one_is_installed(monkeypatch, tmp_path):
    """A full Chromium, even headless, opens its new-tab page and the omnibox popup's WebUI,
    each in a renderer of its own: kaleido is given Chromium's headless shell when one is on
    PATH (the same PNGs, 1.1 CPU-s against 2.4 for a demo's three figures), left to its own
    search where BROWSER_PATH names the browser, and given what that search finds where no
    shell is installed."""
    import shutil

    import kaleido
    from browser import _unavailable
    from choreographer.browsers import Chromium
    from inspector.widgets import snapshot

    shell = shutil.which("chrome-headless-shell") or shutil.which("chromium-headless-shell")
    if shell is None:
        _unavailable("no headless shell (apt-get install chromium-headless-shell)")
    started: list[dict] = []
    monkeypatch.setattr(kaleido, "start_sync_server", lambda **options: started.append(options))
    monkeypatch.setattr(kaleido, "calc_fig_sync", lambda fig, opts: b"png")
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    figures = [("shard sizes", shard_size_distribution(pd.DataFrame()))]
    # PATH as it is; a browser named by BROWSER_PATH; a PATH with no browser at all on it.
    for changes in ({}, {"BROWSER_PATH": "/usr/bin/chromium"}, {"PATH": str(tmp_path)}):
        with monkeypatch.context() as env:
            for name, value in changes.items():
                env.setenv(name, value)
            env.setattr(snapshot, "_server_started", False)
            assert snapshot.render_pngs(figures) == [b"png"]
    # Without a shell, the browser kaleido's own search finds, given so that it searches
    # no more (a file planted between two searches would not be what it starts).
    with monkeypatch.context() as env:
        env.setenv("PATH", str(tmp_path))
        full = Chromium.find_browser(skip_local=False)
    assert [options.get("path") for options in started] == [shell, None, full]


@pytest.mark.parametrize("where", ["last", "first", "only"])
def test_no_browser_is_started_from_the_current_folder(monkeypatch, tmp_path, where):
    """A PATH with an empty or relative entry (a trailing ":", ".") looks in the current
    folder, which may be a checkpoint someone else filled (a notebook's kernel runs in its
    folder): a browser planted there is never what kaleido is given, nor what its own search
    would start; the snapshot says why it has no figures instead. Before, with PATH ending in
    ":", a planted `chrome-headless-shell` ran ahead of /usr/bin's headless shell."""
    import os

    import kaleido
    from choreographer.browsers import Chromium
    from inspector.widgets import snapshot

    folder = tmp_path / "checkpoint"
    folder.mkdir()
    for name in (*snapshot._HEADLESS_SHELLS, "chrome", "chromium", "google-chrome"):
        planted = folder / name
        planted.write_text("#!/bin/sh\nexit 1\n")
        planted.chmod(0o755)
    empty = tmp_path / "no-browser"
    empty.mkdir()
    path = {
        "last": f"{os.environ.get('PATH', '')}:",
        "first": f".:{os.environ.get('PATH', '')}",
        "only": f":{empty}",
    }[where]
    started: list[dict] = []
    monkeypatch.chdir(folder)
    monkeypatch.setenv("PATH", path)
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    monkeypatch.setattr(snapshot, "_server_started", False)
    monkeypatch.setattr(kaleido, "start_sync_server", lambda **options: started.append(options))
    monkeypatch.setattr(kaleido, "calc_fig_sync", lambda fig, opts: b"png")
    figures = [("shard sizes", shard_size_distribution(pd.DataFrame()))]
    try:
        snapshot.render_pngs(figures)
    except RuntimeError as exc:
        assert "relative PATH entry" in str(exc) and not started
        return
    (options,) = started
    chosen = options.get("path") or Chromium.find_browser(skip_local=False)
    assert chosen and os.path.isabs(chosen) and folder not in Path(chosen).parents, chosen


def test_a_full_browser_draws_the_snapshot_pngs_without_its_address_bar_popups(monkeypatch):
    """Without a headless shell kaleido starts a full Chrome or Chromium, which even headless
    builds its address bar's popups as WebUI pages in a renderer of their own (0.55 of the
    2.4 CPU-s of a demo's three figures): the browser it is given is started without them."""
    import kaleido
    from choreographer.browsers import Chromium
    from choreographer.channels import Pipe
    from inspector.widgets import snapshot

    started: list[dict] = []
    monkeypatch.setattr(snapshot, "_server_started", False)
    monkeypatch.setattr(kaleido, "start_sync_server", lambda **options: started.append(options))
    monkeypatch.setattr(kaleido, "calc_fig_sync", lambda fig, opts: b"png")
    assert snapshot.render_pngs([("shard sizes", shard_size_distribution(pd.DataFrame()))])
    (options,) = started
    assert issubclass(options["browser_cls"], Chromium)
    pipe = Pipe()
    browser = options["browser_cls"](pipe, sys.executable)  # a path that exists; not started
    try:
        browser.pre_open()
        cli = browser.get_cli()
    finally:
        browser.clean()
        pipe.close()
    assert "--disable-features=WebUIOmniboxPopup,WebUIOmniboxAimPopup" in cli
    assert "--headless" in cli and "--remote-debugging-pipe" in cli  # choreographer's own


def test_values_heatmap_labels_stand_upright_thinned_and_clear_of_the_axis_title() -> None:
    """The Values heatmap's column labels at -45 degrees crossed each other and ran into the
    axis title and the legend under the plot: upright now, at most 80 of them, each at most
    40 characters, the title set off below them and the legend above the plot."""
    from inspector.widgets.figures import values_heatmap

    kinds = [f"mlp.experts.{e}.gate_and_up_projection_of_a_long_name.weight" for e in range(300)]
    rows = [
        {
            "name": f"model.layers.{layer}.{kind}",
            "decoded": True,
            **dict.fromkeys(("std", "sibling_std", "min", "max", "mean", "zero_frac"), 0.02),
            "absmax": 1.0,
            "sibling_absmax": 1.0,
            "why": "far from its siblings",
            "finding": "tensor-values-outlier" if layer == e == 0 else "",
            "nan": 0,
            "inf": 0,
            "all_zero": False,
        }
        for layer in range(2)
        for e, kind in enumerate(kinds)
    ]
    import pandas as pd

    fig = values_heatmap(pd.DataFrame(rows))
    x = fig.layout.xaxis
    heat = fig.data[0]
    assert x.tickangle == -90 and x.automargin and x.tickmode == "array"
    assert 0 < len(x.tickvals) <= 80 and set(x.tickvals) <= set(heat.x)
    assert max(len(t) for t in x.ticktext) <= 40 and "..." in x.ticktext[0]
    assert x.title.text == "tensor kind" and x.title.standoff > 0
    assert fig.layout.legend.y >= 1 and fig.layout.legend.yanchor == "bottom"
    assert fig.layout.height >= 260 + 40 * 10 * 0.6  # the labels' height is added


def test_a_layer_zoom_holds_the_rows_of_its_recorded_experts(tmp_path: Path) -> None:
    """The Experts tab's zoom into one layer (`expert_layer_grid`) of a MoE checkpoint
    (safetensors' `save_file`) whose one expert is numbered 999,999,999: the rows that hold
    a recorded expert, labelled by their ids, not every row up to that id (31 million rows,
    7.5 GiB per cell array: the tab ran out of memory). Run in a child whose address space is
    held to 3 GB."""
    import resource

    one = np.zeros((2, 2), np.float32)
    ids = [0, 1, 2, 3, 999_999_999]
    save_file(
        {f"model.layers.0.mlp.experts.{e}.{p}.weight": one for e in ids for p in ("up", "down")},
        str(tmp_path / SAFETENSORS_WEIGHTS_NAME),
    )
    program = (
        "import json, sys\n"
        "from inspector._internal.scan.entry import scan\n"
        "from inspector.widgets.figures import expert_layer_grid\n"
        "s = scan(sys.argv[1])\n"
        "trace = expert_layer_grid(s.experts, 0).data[0]\n"
        "print(json.dumps([list(trace.y), [list(row) for row in trace.text]]))\n"
    )

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    done = subprocess.run(
        [sys.executable, "-c", program, str(tmp_path)],
        capture_output=True,
        text=True,
        preexec_fn=limited,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    labels, text = json.loads(done.stdout)
    assert labels == ["0-31", "999999968-999999999"]
    assert text[0][:5] == ["0", "1", "2", "3", ""] and text[1][-1] == "999999999"
