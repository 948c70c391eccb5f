"""placeholder until the layout module lands."""

from pathlib import Path

NAME = "dcp-sharded"


def detect(path: Path) -> bool:
    return False
