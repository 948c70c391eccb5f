"""The plotly.js that draws every figure of the dashboard and of the HTML report: plotly.js's
own cartesian bundle, vendored unchanged in `vendor/` (its README gives the version, the
sha256 and how to fetch it again).

The figures (`figures`) are bars, histograms, scatters and heatmaps only. The cartesian bundle
holds those trace types and more at 1.5 MB, against 4.8 MB for the whole of plotly.js (3D,
maps, WebGL): a page evaluates it in 0.8 s instead of 2.1 s (idle Chromium on this project's
2-core test machine), and an HTML report that embeds it is a third of the size.
"""

from __future__ import annotations

import functools
from pathlib import Path

__all__ = ["cartesian_bundle", "cartesian_bundle_file"]

_BUNDLE = Path(__file__).parent / "vendor" / "plotly-cartesian.min.js"


@functools.cache
def cartesian_bundle() -> str:
    """The text of plotly.js's cartesian bundle (read once per process)."""
    return _BUNDLE.read_text(encoding="utf-8")


def cartesian_bundle_file() -> Path:
    """Where the cartesian bundle is (kaleido's page loads it from there)."""
    return _BUNDLE
