"""The order in which the lab clicks test (tests/test_lab_clicks.py) clicks a tab's buttons,
shared with benchmarks/bench_clicks.py, which replays the same click-through in one process.
"""

from __future__ import annotations

from collections.abc import Sequence, Set

# The demo both click through, and the button each clicks first where it is offered.
DEMO = "modelopt-1422-sidecar-drift"
FIRST = {"Values": "Sample values"}


def next_click(
    title: str, enabled: Sequence[str], done: Sequence[str], before: Set[str]
) -> str | None:
    """The label to click next in tab `title`, of its `enabled` buttons: one not yet clicked,
    revealed or enabled by the last click (not in `before`) first, else the last one: the
    pane's own action (Repair, Next) before the buttons that plan again or go elsewhere. None
    when every enabled button was clicked."""
    todo = [b for b in enabled if b not in done]
    if not todo:
        return None
    fresh = [b for b in todo if b not in before]
    label = fresh[0] if before and fresh else todo[-1]
    if not done and FIRST.get(title) in todo:
        label = FIRST[title]
    return label
