"""placeholder until the layout module lands."""

from pathlib import Path

NAME = "torch-dist"


def detect(path: Path) -> bool:
    return False
