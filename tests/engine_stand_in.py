"""A stand-in for vLLM's verdict child (`inspector._internal.load.engine_child`), for the
browser tests that click the Serve tab's "vLLM's own verdict" to see the button work, not
what vLLM says: it answers each request, through the same pipe and in the same format, that
the verdict was not run, without importing vLLM (about 20 s of CPU per kernel). What vLLM
itself answers is tested against the real engine (tests/test_engines.py, tests/vllm_cases.py).

Run as `python tests/engine_stand_in.py` in place of the child (`ENGINE_PROCESS.command`).
"""

from __future__ import annotations

import sys

import orjson

from inspector._internal.load.child import verdict_digest
from inspector._internal.scan.entry import scan

# The words its answer shows in the tab.
SKIPPED = "vLLM was not run: this is the browser test's stand-in for its child"


def main() -> None:
    for line in sys.stdin.buffer:
        request = orjson.loads(line)
        scanned = scan(request["path"], layout=request["layout"])
        # The digest of the files read, as the real child sends it: the parent compares it.
        answer = {"skipped": SKIPPED, "digest": verdict_digest(scanned)}
        sys.stdout.buffer.write(orjson.dumps(answer) + b"\n")
        sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
