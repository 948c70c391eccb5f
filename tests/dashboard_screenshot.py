"""Take the README's picture of the dashboard (`make docs-screenshot`, writes docs/dashboard.png).

The real dashboard, as a person sees it: the demo whose index forgot its 42 MTP tensors, opened
by notebooks/02 in a real JupyterLab (local only) and Chromium, once the Overview shows its
issues and the load check's verdict. The same helpers and steps as tests/test_lab_browser.py;
the PNG is reduced to a palette so the picture stays small in the repository.

    python tests/dashboard_screenshot.py docs/dashboard.png
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from browser import (
    launch_chromium,
    open_tab,
    run_all_cells,
    running_lab,
    sync_playwright_or_fail,
)

from inspector._internal.demo import write_demos

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "02-repair-an-index-that-forgot-mtp.ipynb"
WIDTH, HEIGHT = 1200, 1000
# The Overview's issues and verdict; the rest of the page is the docs' job.
MAX_HEIGHT = 625


def shoot() -> bytes:
    """The dashboard's Overview as PNG bytes, from a JupyterLab on temp copies."""
    sync_playwright = sync_playwright_or_fail()
    with tempfile.TemporaryDirectory(prefix="ckpt-") as tmp:
        tmp_path = Path(tmp)
        demo, work, root = tmp_path / "demo", tmp_path / "checkpoints", tmp_path / "notebooks"
        write_demos(demo, log=lambda _line: None)
        shutil.copytree(ROOT / "notebooks", root)
        env = {"CKPT_DEMO_DIR": str(demo), "CKPT_WORK_DIR": str(work)}
        with running_lab(root, tmp_path / "lab", env=env) as server, sync_playwright() as pw:
            browser = launch_chromium(pw)
            try:
                page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
                page.route("**/*", server.only_local)
                page.goto(server.url(NOTEBOOK), wait_until="domcontentloaded")
                run_all_cells(page, timeout=180)
                page.wait_for_selector(".ckpt-dashboard", timeout=60_000)
                open_tab(page, "Overview")
                overview = page.locator(".ckpt-overview").first
                overview.locator(".ckpt-problem").first.wait_for(timeout=60_000)
                overview.locator(".ckpt-load[data-loads='yes']").wait_for(timeout=120_000)
                # The notebook takes the width (no file browser); the picture is the
                # dashboard's top, as far as the window shows it.
                page.keyboard.press("Escape")
                page.keyboard.press("Control+b")
                dashboard = page.locator(".ckpt-dashboard").first
                dashboard.evaluate("element => element.scrollIntoView({block: 'start'})")
                page.wait_for_timeout(1000)  # the figures re-layout to the new width
                box = dashboard.bounding_box()
                bottom = page.locator("#jp-main-statusbar").bounding_box()
                assert box is not None and bottom is not None
                height = min(box["height"], bottom["y"] - box["y"], MAX_HEIGHT)
                clip = {"x": box["x"], "y": box["y"], "width": box["width"], "height": height}
                return page.screenshot(clip=clip)
            finally:
                browser.close()


def small_png(png: bytes) -> bytes:
    """The same picture with a 128-colour palette (a third of the bytes or less)."""
    try:
        from PIL import Image
    except ImportError:
        return png
    image = Image.open(io.BytesIO(png)).convert("RGB")
    out = io.BytesIO()
    image.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(out, "PNG", optimize=True)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="where to write the PNG")
    args = parser.parse_args()
    png = small_png(shoot())
    args.dest.write_bytes(png)
    print(f"wrote {args.dest} ({len(png):,} bytes)")


if __name__ == "__main__":
    main()
