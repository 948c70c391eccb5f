"""Finding tensors (name glob / regex, dtype, layer, expert, file, kind) and exporting them; the
progress hooks of scan and check; `ckpt.browse()` without the UI installed."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from inspector._internal.checks import check
from inspector._internal.demo.safetensors_layouts import healthy_per_layer
from inspector._internal.report.query import TensorQuery, export_tensors, name_pattern
from inspector._internal.scan.entry import scan
from inspector.errors import InspectorError


@pytest.fixture(scope="module")
def scanned(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("per-layer")
    healthy_per_layer(folder)
    return scan(folder)


def test_glob_matches_whole_names_and_plain_text_is_a_substring(scanned):
    t = scanned.tensors
    hit = TensorQuery(name="*.experts.3.*").apply(t)
    assert len(hit) and all(".experts.3." in n for n in hit["name"])
    assert set(hit["layer"].dropna()) == {1, 2, 3, 4}  # MoE layers and the MTP layer
    # A glob is anchored: without the leading * nothing starts with ".experts".
    assert TensorQuery(name=".experts.3.*").apply(t).empty
    # Plain text is searched anywhere, dots taken literally.
    sub = TensorQuery(name="experts.3.down_proj.weight_scale").apply(t)
    assert list(sub["name"]) == [n for n in t["name"] if "experts.3.down_proj.weight_scale" in n]
    assert len(sub) == 6  # weight_scale and weight_scale_2 in MoE layers 1-3
    assert TensorQuery(name="experts_3").apply(t).empty


def test_regex_and_column_filters_combine(scanned):
    t = scanned.tensors
    fp8 = TensorQuery(dtype="F8_E4M3", layer=2).apply(t)
    assert len(fp8) and set(fp8["dtype"].astype(str)) == {"F8_E4M3"} and set(fp8["layer"]) == {2}
    rx = TensorQuery(name=r"experts\.(1|2)\.(gate|up)_proj", regex=True, layer=3).apply(t)
    assert len(rx) == len(rx["name"].unique()) > 0
    assert all(("experts.1." in n or "experts.2." in n) and "down" not in n for n in rx["name"])
    one = TensorQuery(expert=5, kind="expert", layer=1).apply(t)
    assert set(one["expert"]) == {5} and set(one["layer"]) == {1}
    names = tuple(t["name"].iloc[[0, 7]])
    assert list(TensorQuery(names=names).apply(t)["name"]) == list(names)
    files = TensorQuery(file="model-00001-of-00004.safetensors").apply(t)
    assert set(files["file"].astype(str)) == {"model-00001-of-00004.safetensors"}
    assert TensorQuery().apply(t) is t


def test_bad_regex_is_a_readable_error():
    with pytest.raises(InspectorError, match="not a regular expression"):
        name_pattern("experts.(", regex=True)


def test_glob_translation():
    assert name_pattern("*.experts.17.*") == r"^.*\.experts\.17\..*$"
    assert name_pattern("layers.4?.mlp*") == r"^layers\.4.\.mlp.*$"
    assert name_pattern("experts.1[0-2].*") == r"^experts\.1[0-2]\..*$"
    assert name_pattern("a[!b]c") == "^a[^b]c$"
    assert TensorQuery(name="*.x.*", dtype="BF16", layer=3).describe() == (
        "name ~ *.x.*, dtype BF16, layer 3"
    )


def test_export_csv_and_parquet_round_trip(scanned, tmp_path: Path):
    rows = TensorQuery(name="*.experts.0.*", layer=1).apply(scanned.tensors)
    csv = export_tensors(rows, tmp_path / "out" / "experts.csv")
    back = pd.read_csv(csv)
    assert list(back["name"]) == list(rows["name"]) and len(back) == len(rows)
    assert back["shape"].iloc[0].startswith("[") and list(back["nbytes"]) == list(rows["nbytes"])
    parquet = export_tensors(rows, tmp_path / "experts.parquet")
    table = pd.read_parquet(parquet)
    assert list(table["name"]) == list(rows["name"]) and table["nbytes"].dtype == "int64"
    with pytest.raises(InspectorError, match="export format"):
        export_tensors(rows, tmp_path / "experts.xlsx")


def test_scan_and_check_draw_progress_only_when_asked(scanned, capsys):
    folder = scanned.path
    scan(folder)
    check(scanned)
    assert capsys.readouterr().err == ""
    again = scan(folder, progress=True)
    assert check(again, progress=True) == []
    err = capsys.readouterr().err
    assert "shard headers" in err and "checks" in err


def test_browse_without_the_ui_says_what_to_install(scanned, monkeypatch):
    import inspector._internal.checkpoint.ui

    monkeypatch.setattr(inspector._internal.checkpoint.ui, "entry_points", lambda **_: [])
    with pytest.raises(InspectorError, match=r"pip install 'checkpoint-inspector\[ui\]'"):
        scanned.browse()
