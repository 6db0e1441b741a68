"""`SegmentStore`: the embedded durable store (append-only checksummed segment log).

Threads and ownership:
- the broker thread calls add/remove/delivered (memory only: pending batch, index, under
  `_lock`) and commit, which `write()`s the batch at once: what a turn acked or delivered
  is in the OS before the turn's replies reach the socket, so `kill -9` loses none of it;
- ONE sync thread runs one fdatasync for everything written since the last one (group
  commit: writes go on while it syncs) and then hands the callbacks to the broker thread,
  in commit order;
- a commit someone waits for, while the sync thread has nothing in hand (a lone
  confirm-each publisher), is synced on the broker thread instead: its callback runs
  before commit() returns, so the confirm leaves in the same loop turn, without the two
  thread wake-ups (there and back) that cost as much as the fdatasync itself;
- a compactor thread rewrites old segments (see compact.py).

Why a log and not SQLite: see docs/storage.md (measured).
"""

from __future__ import annotations

import fcntl
import os
import threading
from dataclasses import asdict
from typing import Any

from ackmq.broker.storage import (
    BindingDef,
    CorruptStore,
    ExchangeDef,
    QueueDef,
    QueuedMessages,
    Recovered,
    StoreError,
)

from . import fileio
from .compact import compactor_main, finish_interrupted
from .compact_api import CompactionMixin
from .defs import DefsLog, binding_key, encode_value
from .format import log
from .index import PENDING, QueueIndex
from .notes import NotesMixin
from .reads import READ_AHEAD, ReadsMixin
from .recovered import RecoveredQueue
from .recovery import RecoveryMixin
from .state import StoreStats, WriteBatch, seg_name
from .writer import PREALLOC_CHUNK, commit_batch

__all__ = ["PREALLOC_CHUNK", "READ_AHEAD", "SegmentStore", "StoreStats", "seg_name"]


class SegmentStore(RecoveryMixin, ReadsMixin, CompactionMixin, NotesMixin):
    """The `Store` of ackmq: see docs/storage.md for the design and the figures.

    Its parts: state.py (the shared fields), recovery.py (open's scan), writer.py (commit,
    the sync thread, rollover), reads.py (read_message / read_body), compact_api.py (what
    the compactor may call), pending.py (add/remove/delivered); here: open/close and the
    definitions. state.py, pending.py and writer.py are one compiled chain (mypyc); the
    other parts derive from its last class, WriterMixin (an object's native methods are
    those of the native class it is allocated by: its first bases' native ancestor)."""

    def open(self) -> Recovered:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lockfd = fileio.open(self.dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lockfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            fileio.close(self._lockfd)
            raise StoreError(f"{self.dir} is in use by another process") from e
        try:
            # the data dir's own entry: a fresh dir lost at power loss loses everything
            fileio.fsync_dir(self.dir.resolve().parent)
            return self._open_locked()
        except OSError as e:
            fileio.close(self._lockfd)
            raise StoreError(f"cannot open the store in {self.dir}: {e}") from e
        except BaseException:
            fileio.close(self._lockfd)
            raise

    def _open_locked(self) -> Recovered:

        finish_interrupted(self.dir)
        seg_ids = sorted(int(p.name.split(".")[0]) for p in self.dir.glob("*.seg"))
        if seg_ids and not (self.dir / DefsLog.NAME).exists():
            raise CorruptStore(f"{self.dir}: {DefsLog.NAME} is missing but segments exist")
        self._defs = DefsLog(self.dir)
        state = self._defs.load_and_bump()
        names = {qid: name for name, (qid, _) in state.queues.items()}
        self._qids = {name: qid for qid, name in names.items()}
        self._index = {qid: QueueIndex() for qid in names}
        self._counts = {qid: {} for qid in names}
        for s in seg_ids:
            self._load_segment(s, s == seg_ids[-1])
        out: dict[str, QueuedMessages] = {
            names[qid]: RecoveredQueue(qid, self._index[qid], self._counts[qid], self._lock)
            for qid in names}
        self._active = (seg_ids[-1] if seg_ids else 0) + 1
        self._new_segment(self._active)
        self._closed = False
        if self.fsync and self.sync_thread:
            self._syncer = threading.Thread(target=self._sync_main, name="ackmq-store-sync",
                                            daemon=True)
            self._syncer.start()
        if self.auto_compact:

            self._compactor = threading.Thread(target=compactor_main, args=(self,),
                                               name="ackmq-store-compactor", daemon=True)
            self._compactor.start()
        return Recovered(epoch=state.epoch, exchanges=list(state.exchanges.values()),
                         queues=[d for _, d in state.queues.values()],
                         bindings=list(state.bindings.values()), messages=out)

    def _defs_op(self, op: dict[str, Any]) -> None:
        if self._closed or self._defs is None:
            raise StoreError("store is closed")
        try:
            self._defs.append(op)
        except OSError as e:
            raise StoreError(f"cannot write {self._defs.path}: {e}") from e

    def save_exchange(self, d: ExchangeDef) -> None:
        if self._defs is not None and self._defs.state.exchanges.get(d.name) == d:
            return  # redeclared as it is: no journal record, no fsync
        self._defs_op({"op": "exchange", "def": encode_value(asdict(d))})

    def delete_exchange(self, name: str) -> None:
        self._defs_op({"op": "del_exchange", "name": name})

    def save_queue(self, d: QueueDef) -> None:
        assert self._defs is not None
        qid = self._qids.get(d.name)
        if qid is not None and self._defs.state.queues.get(d.name) == (qid, d):
            return  # redeclared as it is
        if qid is None:
            qid = self._defs.state.next_qid
        self._defs_op({"op": "queue", "qid": qid, "def": encode_value(asdict(d))})
        with self._lock:
            if d.name not in self._qids:
                self._qids[d.name] = qid
                self._index[qid] = QueueIndex()
                self._counts[qid] = {}

    def delete_queue(self, name: str) -> None:
        self._defs_op({"op": "del_queue", "name": name})
        with self._lock:
            qid = self._qids.pop(name, None)
            if qid is None:
                return
            idx = self._index.pop(qid, None)
            self._counts.pop(qid, None)
            if idx is not None:
                for _, loc in idx.items():
                    if loc != PENDING:
                        info = self._segs.get(loc >> 32)
                        if info is not None:
                            info.live -= 1
            p = self._pending
            for d in (p.adds, p.removes, p.delivered, self._unwritten,
                      self._unwritten_removes, self._failed):
                for k in [k for k in d if k[0] == qid]:
                    del d[k]

    def save_binding(self, b: BindingDef) -> None:
        if self._defs is not None and binding_key(b) in self._defs.state.bindings:
            return
        self._defs_op({"op": "binding", "def": encode_value(asdict(b))})

    def delete_binding(self, b: BindingDef) -> None:
        self._defs_op({"op": "del_binding", "def": encode_value(asdict(b))})

    def close(self) -> None:
        with self._lock:
            if self._closed or self._closing:
                return
            b, self._pending = self._pending, WriteBatch()
        commit_batch(self, b)  # what is still buffered, then the sync thread's last fsync
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._syncer is not None:
            self._syncer.join()
        elif self.fsync:
            self.sync_round()
        self._compact_wake.set()
        if self._compactor is not None:
            self._compactor.join()
        with self._lock:
            self._closed = True
            for fd in self._rfds.values():
                fileio.close(fd)
            self._rfds.clear()
        if self._wfd >= 0:
            try:
                if self._alloc_end > self._woff and self._broken is None:
                    self._cut_prealloc()  # a clean stop leaves no zeros past the data
                    if self.fsync:
                        fileio.fsync(self._wfd)
            except OSError as e:  # recovery drops them instead
                log.warning("%s: could not cut the preallocated tail: %s", self.dir, e)
            fileio.close(self._wfd)
            self._wfd = -1
        if self._defs is not None:
            self._defs.close()
        if self._lockfd >= 0:
            fileio.close(self._lockfd)
            self._lockfd = -1

    def index_bytes(self) -> int:
        """Memory held by the per-message index (arrays), for the bytes/message figure."""
        with self._lock:
            return sum(i.nbytes() for i in self._index.values())
