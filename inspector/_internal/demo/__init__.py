"""Built-in demo checkpoints (`ckpt-inspect demo OUTDIR`): small but real checkpoints, healthy
and damaged the way the seed bugs damaged them, each in its own folder with a `README.txt`.

The safetensors demos need numpy plus `ml_dtypes` or torch; the torch_dist and DCP demos come
from `inspector._internal.demo.torch_dist` and `inspector._internal.demo.dcp` and are skipped with a
note when those modules are not there.
"""

from __future__ import annotations

import importlib
import importlib.util
import shutil
from collections.abc import Callable
from pathlib import Path

from inspector._internal.demo.safetensors_layouts import SAFETENSORS_DEMOS, Demo, write_readme

__all__ = ["demo_names", "write_demos"]

# (folder, summary, module, function, keyword arguments) of demos written by other modules.
_EXTERNAL: tuple[tuple[str, str, str, str, dict[str, bool]], ...] = (
    (
        "healthy-torch-dist",
        "Megatron torch_dist, no findings",
        "torch_dist",
        "write_torch_dist_demo",
        {},
    ),
    (
        "megatron-4448-rerun-drift",
        "common state says rerun machine active, .metadata lacks its shards",
        "torch_dist",
        "write_torch_dist_demo",
        {"rerun_drift": True},
    ),
    ("healthy-dcp-sharded", "DCP-sharded safetensors, no findings", "dcp", "write_dcp_demo", {}),
    (
        "automodel-2289-dcp-mapping-collapsed",
        "DCP shards whose file-index mapping sends every tensor to file 1",
        "dcp",
        "write_dcp_demo",
        {"collapsed": True},
    ),
)


def demo_names() -> list[str]:
    """Every demo folder name `write_demos` may create, in writing order."""
    return [d.name for d in SAFETENSORS_DEMOS] + [e[0] for e in _EXTERNAL]


def write_demos(outdir: Path, *, log: Callable[[str], None] = print) -> list[Path]:
    """Write every demo into its own folder under `outdir` and return the folders written.

    Re-running replaces the demo folders only; anything else in `outdir` is left alone.
    `log` gets one line per demo (written or skipped).
    """
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    external, skipped = _external_demos()
    written: list[Path] = []
    for demo in [*SAFETENSORS_DEMOS, *external]:
        dest = outdir / demo.name
        _clear(dest)
        # External writers create their folder themselves; ours expect it to exist.
        if demo in SAFETENSORS_DEMOS:
            dest.mkdir()
        try:
            demo.write(dest)
        except ModuleNotFoundError as exc:
            # torch is optional: without it the torch_dist and DCP writers cannot run.
            _clear(dest)
            skipped.append(f"skip  {demo.name:<38} (needs {exc.name or exc})")
            continue
        if not (dest / "README.txt").exists():
            write_readme(dest, demo.name, demo.summary)
        written.append(dest)
        log(f"wrote {demo.name:<38} {demo.summary}")
    for note in skipped:
        log(note)
    return written


def _external_demos() -> tuple[list[Demo], list[str]]:
    """The torch_dist and DCP demos whose writer modules are importable, and a note for
    each one that is not."""
    demos: list[Demo] = []
    skipped: list[str] = []
    for name, summary, module, function, kwargs in _EXTERNAL:
        qualified = f"inspector._internal.demo.{module}"
        if importlib.util.find_spec(qualified) is None:
            skipped.append(f"skip  {name:<38} ({qualified} is not available)")
            continue
        writer = getattr(importlib.import_module(qualified), function)
        demos.append(Demo(name, summary, _bind(writer, kwargs)))
    return demos, skipped


def _bind(writer: Callable[..., object], kwargs: dict[str, bool]) -> Callable[[Path], object]:
    return lambda dest: writer(dest, **kwargs)


def _clear(dest: Path) -> None:
    """Remove a previous demo folder; a symlink is unlinked, never followed."""
    if dest.is_symlink() or dest.is_file():
        dest.unlink()
    elif dest.is_dir():
        shutil.rmtree(dest)
