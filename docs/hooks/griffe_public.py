"""A griffe extension for the API pages: document the package under the names people import.

Two things static analysis of the source tree cannot know by itself:
- `widgets/` installs as `inspector.widgets` (pyproject.toml's package-dir), so it is loaded
  from its folder and mounted there;
- a public function may share its name with the module that defines it (`inspector.scan`, the
  function, re-exported over the submodule `inspector/scan.py`): Python gives the importer the
  function, and so do the pages.
"""

from __future__ import annotations

from typing import Any

import griffe


class PublicNames(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.path != "inspector":
            return
        if "widgets" not in pkg.members:
            pkg.set_member("widgets", loader.load("widgets", try_relative_path=False))
        for name, member in list(pkg.members.items()):
            # Exports first: an alias to another package (`__future__`) cannot be resolved here.
            if name in (pkg.exports or ()) and pkg.is_public and member.is_module:
                target = member.members.get(name)
                if target is not None:
                    pkg.set_member(name, griffe.Alias(name, target, parent=pkg))
