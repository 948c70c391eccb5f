"""What the browser tests share: Debian's Chromium through Playwright (browsers cannot be
downloaded here), started the way this machine needs, and a CI rule that it must be there.

Tests import it as `from browser import ...` (pytest puts tests/ on the path)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["ARTIFACTS", "CHROMIUM", "CHROMIUM_ARGS", "sync_playwright_or_fail"]

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking flags Chromium keeps dialling hosts this closed network
# refuses.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


def _unavailable(reason: str) -> None:
    """Missing browser tooling fails in CI (where it must be installed) and skips elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(
            f"{reason}; CI must provide it (apt-get install chromium, pip install playwright)"
        )
    pytest.skip(reason)


def sync_playwright_or_fail():
    """Playwright's `sync_playwright`, after checking Chromium and Playwright are there."""
    if not CHROMIUM.exists():
        _unavailable(f"{CHROMIUM} not found")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed")
    return sync_playwright
