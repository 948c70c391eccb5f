"""The GPUs `ckpt-inspect fit --gpu` knows: one table, each with its memory and compute
capability as the vendor states them.

Memory is the vendor's figure (NVIDIA's product pages and datasheets, "80GB" HBM), taken as
GiB: HBM comes in binary sizes, and the device reports a fraction of a percent less than that
to the engine (an H100 80GB shows 79.6 GiB), which `--gpu-memory-utilization` (0.9 by default,
as vLLM) leaves room for. Compute capabilities are NVIDIA's (https://developer.nvidia.com/cuda-gpus).
`--gpu-memory GiB` stands for any GPU not listed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["GIB", "GPUS", "Gpu", "gpu_named"]

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU model: its name as `--gpu` takes it, memory (GiB), compute capability, and
    where the figures come from."""

    name: str
    memory_gib: float
    compute_capability: str
    source: str

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)


_A100 = "https://www.nvidia.com/en-us/data-center/a100/"
_H100 = "https://www.nvidia.com/en-us/data-center/h100/"

GPUS: Mapping[str, Gpu] = MappingProxyType(
    {
        gpu.name: gpu
        for gpu in (
            Gpu("A100-40GB", 40, "8.0", _A100),
            Gpu("A100-80GB", 80, "8.0", _A100),
            Gpu("L4", 24, "8.9", "https://www.nvidia.com/en-us/data-center/l4/"),
            Gpu("L40S", 48, "8.9", "https://www.nvidia.com/en-us/data-center/l40s/"),
            Gpu("H100-80GB", 80, "9.0", _H100),
            Gpu("H100-NVL", 94, "9.0", _H100),
            Gpu("H200", 141, "9.0", "https://www.nvidia.com/en-us/data-center/h200/"),
            # DGX B200: "8 x NVIDIA B200 GPUs that provide 1,440 GB total GPU memory".
            Gpu(
                "B200",
                180,
                "10.0",
                "https://docs.nvidia.com/dgx/dgxb200-user-guide/introduction-to-dgxb200.html",
            ),
            Gpu(
                "RTX-PRO-6000",
                96,
                "12.0",
                "https://www.nvidia.com/en-us/products/workstations/professional-desktop-gpus/"
                "rtx-pro-6000/",
            ),
        )
    }
)


def gpu_named(name: str) -> Gpu | None:
    """The GPU called `name` (case and `_`/`-` ignored: `h100-80gb`, `H100_80GB`), or None."""
    wanted = name.strip().upper().replace("_", "-")
    return next((g for key, g in GPUS.items() if key.upper() == wanted), None)
