"""gs:// requests are retried by the storage's one policy (its waits, its deadline, its count
in the scan's I/O stats), not also by gcsfs' own loop inside each attempt."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

sys.path.insert(0, str(Path(__file__).parent))

from remote_servers import Answer, FakeGCS, Proxy

from inspector._internal.scan.entry import scan

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("quick_retries")]


def test_gcs_throttling_is_retried_once_by_our_policy(tmp_path: Path) -> None:
    """Every media download answers 503 once, then 500 once: each failure is one retry of
    ours (gcsfs retried them itself first, after waits of 1 s and more that no option set,
    and the scan counted none)."""
    pytest.importorskip("gcsfs")
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for i in range(2):
        save_file({f"w{i}": np.ones((4, 4), np.float32)}, str(folder / f"part-{i}.safetensors"))
    hits: dict[str, int] = {}

    def flaky(method: str, path: str, n: int) -> Answer | None:
        if not path.startswith("/download/"):
            return None
        key = path.split("?", 1)[0]
        hits[key] = hits.get(key, 0) + 1
        return {1: Answer(503, body=b"slow down"), 2: Answer(500, body=b"oops")}.get(hits[key])

    with FakeGCS({"b": tmp_path}) as gcs, Proxy(gcs.url, fault=flaky) as front:
        options = {"endpoint_url": front.url, "token": "anon"}
        scanned = scan("gs://b/ckpt", storage_options=options, timeout=30.0)
    assert [s.readable for s in scanned.shards] == [True, True]
    assert len(hits) == 2 and set(hits.values()) == {3}
    assert scanned.storage is not None and scanned.storage.stats.retries == 2 * len(hits)
