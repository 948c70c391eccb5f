"""The layout registry names its reader modules (imported on use): each name it gives must be
the name of the module's `LAYOUT`, and every layout must be named once."""

from __future__ import annotations

import pytest

from inspector._internal.checkpoint.scanned import LayoutName
from inspector._internal.scan.registry import READERS, layout_by_name, reader


def test_each_layout_named_once_by_its_module() -> None:
    assert sorted(name for name, _ in READERS) == sorted(LayoutName)
    for name, module in READERS:
        assert reader(module).name == name
        assert layout_by_name(name) is reader(module)


def test_unknown_layout_lists_the_known_names() -> None:
    with pytest.raises(ValueError, match="expected one of safetensors-single"):
        layout_by_name("zip")
