"""The store alone, on the lone message's path: `add` one persistent 100-byte message
and `commit(inline=True)` it (written, fdatasynced on this thread, its callback run),
N times in process — what the store costs each confirm-each publish. Measured in
instructions by `python -m tools.perf.instructions --modes store`."""

from __future__ import annotations

import sys
import tempfile

from ackmq.broker.storage import QueueDef
from ackmq.store import open_store

PROPERTIES = b"\x10\x00\x02"  # flags: delivery-mode; 2 (persistent)
BODY = b"x" * 100


def run(n: int) -> int:
    """n add+commit rounds on a fresh store; returns how many callbacks ran."""
    done: list[BaseException | None] = []
    with tempfile.TemporaryDirectory(prefix="ackmq-store-commit-") as d:
        store = open_store(d)
        store.open()
        store.save_queue(QueueDef("q"))
        store.commit(done.append, inline=True)
        for i in range(n):
            store.add("q", i + 1, "", "q", PROPERTIES, BODY)
            store.commit(done.append, inline=True)
        store.close()
    return len(done) - 1


if __name__ == "__main__":
    print(run(int(sys.argv[1])))
