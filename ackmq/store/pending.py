"""What the broker buffers between two commits: `add`, `remove` and `delivered` (memory
only, under `_lock`: the pending batch and the index). On the lone confirm's path, so
compiled with the writer (mypyc)."""

from __future__ import annotations

from mypy_extensions import mypyc_attr

from ackmq.broker.storage import StoreError

from .index import DEAD, PENDING
from .state import PendingAdd, StoreState


@mypyc_attr(allow_interpreted_subclasses=True)
class PendingMixin(StoreState):
    def add(self, queue: str, seq: int, exchange: str, routing_key: str,
            properties: bytes, body: bytes) -> int:
        qid = self._qids.get(queue)
        if qid is None:
            raise StoreError(f"queue {queue!r} is not a saved durable queue")
        key = (qid, seq)
        op = PendingAdd(qid, seq, exchange, routing_key, properties, body)
        with self._lock:
            if self._closed:
                raise StoreError("store is closed")
            p = self._pending
            p.adds[key] = op
            p.nbytes += len(body) + len(properties) + 64
            self._unwritten[key] = op
            self._index[qid].insert(seq, PENDING)
        return (qid << 64) | seq

    def remove(self, queue: str, seq: int) -> None:
        qid = self._qids.get(queue)
        if qid is None:
            return
        key = (qid, seq)
        with self._lock:
            p = self._pending
            if p.adds.pop(key, None) is not None:  # P5 d: never written at all
                del self._unwritten[key]
                self._index[qid].pop(seq)
                self.stats.cancelled += 1
                return
            p.delivered.pop(key, None)
            if self._failed.pop(key, None) is not None:
                return
            loc = self._index[qid].pop(seq)
            if loc == DEAD:
                return
            counts = self._counts.get(qid)
            if counts:
                counts.pop(seq, None)
            p.removes[key] = loc
            p.nbytes += 24
            self._unwritten_removes[key] = loc
            if loc != PENDING:
                info = self._segs.get(loc >> 32)
                if info is not None:
                    info.live -= 1

    def delivered(self, queue: str, seq: int, delivery_count: int) -> None:
        qid = self._qids.get(queue)
        if qid is None:
            return
        key = (qid, seq)
        with self._lock:
            p = self._pending
            op = p.adds.get(key)
            if op is not None:
                if delivery_count > op.count:
                    op.count = delivery_count
            elif key not in p.removes and delivery_count > p.delivered.get(key, 0):
                p.delivered[key] = delivery_count
