"""The write path: commit writes a batch at once (one pwrite into preallocated space),
ONE sync thread fdatasyncs everything written so far and hands the callbacks back in
commit order (group commit, no timer), a lone waiter is synced inline; a batch no one
waits on (acks, deliveries: `write`) is synced by the next commit's fdatasync or
LAZY_SYNC_S later; segment rollover, preallocation, and what a failed write or fsync
leaves (docs/storage.md).
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable

from mypy_extensions import mypyc_attr

from ackmq.broker.storage import StoreError

from . import fileio
from .format import (
    LONE_ADD_MAX,
    NOTE_PUT,
    FrameWriter,
    encode_add,
    encode_delivered,
    encode_note,
    encode_remove,
    encode_synced,
    file_header,
    log,
    lone_add_frame,
)
from .index import DEAD, PENDING
from .pending import PendingMixin
from .state import Callback, PendingAdd, SegInfo, WriteBatch, seg_name

# The active segment is extended (fallocate) this far ahead of its data: a commit then
# writes into space the file already has, so its fdatasync flushes the data without a
# journal commit for a new file size (measured on ext4: 99-125 µs instead of 159-164 µs
# for a 120-byte append). Cut back to the data at rollover and close; a crash leaves
# zeros past the last frame, which recovery drops as it drops a torn tail.
PREALLOC_CHUNK = 4 << 20

# A batch no client waits on (acks, delivery counts, a dead-letter's move: one frame,
# both or neither) is written at once and made durable by the
# next commit's fdatasync, or by the sync thread this long after it was written. A power
# cut in between redelivers what it acked (as on RabbitMQ, whose acks are not synced
# before they take effect); nothing confirmed is lost. Syncing each such batch put an
# ack's fdatasync in front of the next publish's (docs/storage.md, "Acks synced lazily").
LAZY_SYNC_S = 0.05


@mypyc_attr(allow_interpreted_subclasses=True)
class WriterMixin(PendingMixin):
    def commit(self, callback: Callback, inline: bool = False) -> None:
        """Write what is buffered now (one `write()`), then let the sync thread report it
        durable with the next fdatasync, which it shares with every write made meanwhile.

        `inline=True` (someone waits, and the batch is small): when the sync thread has
        nothing in hand, call `before_sync` (set_before_sync: the broker sends what its
        connections gathered), fdatasync here and call `callback` before returning."""
        b = take_pending(self)
        self.stats.commits += 1
        b.callbacks.append(callback)
        commit_batch(self, b, inline)

    def set_before_sync(self, before_sync: Callable[[], None]) -> None:
        self._before_sync = before_sync

    def write(self) -> StoreError | None:
        """Write what is buffered now (one `write()`: it survives `kill -9` from here on)
        with no one waiting for its fdatasync: the next commit's, or LAZY_SYNC_S later.
        The write's failure, if any (the batch's removes go back into the buffer)."""
        b = take_pending(self)
        self.stats.lazy_writes += 1
        return write_lazily(self, b)

    def sync_now(self) -> None:
        errors: list[BaseException | None] = []
        self.commit(errors.append, inline=True)
        err = errors[0] if errors else None
        if err is None and self.fsync:
            err = self._sync_to(self._wstate[1])  # the sync thread had a batch in hand
        if err is not None:
            raise err if isinstance(err, StoreError) else StoreError(str(err))

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def _new_segment(self, s: int) -> None:
        path = self.dir / seg_name(s)
        head = file_header(s)
        # synced with its directory entry in every mode: a segment that may vanish at a
        # power cut would make the fdatasyncs of its frames worthless (and, --no-fsync,
        # leave a hole before newer segments); OSError (disk full): the caller goes on
        # appending to the current segment
        fd = fileio.create_durably(path, head)  # written with pwrite at _woff
        if self._wfd >= 0:
            fileio.close(self._wfd)
        self._wfd, self._woff = fd, len(head)
        self._alloc_end = len(head)
        self._wstate = (fd, self._wstate[1], s, self._woff)
        self._claimed = 0
        with self._lock:
            self._active = s
            self._segs[s] = SegInfo(size=len(head))
            self._paths[s] = path

    def _sync_to(self, need: int) -> StoreError | None:
        """fdatasync the active segment unless write generation `need` is durable already
        (a rollover or another sync may have covered it); None when it is durable."""
        if need <= self._synced:
            return None
        with self._sync_lock:
            if self._broken is not None:
                return self._broken
            if need > self._synced:
                fd, gen, seg, end = self._wstate  # gen >= need: all in fd
                stats = self.stats
                records = stats.records_written
                t0 = time.perf_counter()
                try:
                    fileio.fdatasync(fd)
                except OSError as e:
                    return self._fsync_failed(e)
                stats.fsync_seconds.observe(time.perf_counter() - t0)  # /metrics
                stats.fsync_records.observe(records - self._records_synced)
                self._records_synced = records
                stats.fsyncs += 1
                self._synced = gen
                self._synced_at = (seg, end)
        return None

    def _sync_main(self) -> None:
        """fdatasync what was written, then report it; everything written while one
        fdatasync runs shares the next (group commit with no timer). What was written
        lazily (`write`) and not synced since is synced LAZY_SYNC_S after the thread saw
        it, unless a commit's fdatasync covered it first."""
        due = 0.0
        while True:
            with self._cond:
                while not self._syncq and not self._closing:
                    if self._wstate[1] <= self._synced:
                        due = 0.0
                        self._sync_idle = True
                        self._cond.wait()
                        self._sync_idle = False
                        continue
                    now = time.monotonic()
                    if due == 0.0:
                        due = now + LAZY_SYNC_S
                    elif now >= due:
                        break
                    self._cond.wait(due - now)
                if not self._syncq and self._closing:
                    return
            due = 0.0
            self.sync_round()

    def sync_round(self) -> None:
        """One round of the sync thread: fdatasync everything written so far, then hand
        the callbacks of every batch it covered to the broker. Called by the thread, or,
        with sync_thread=False, by whoever drives the store (the crash simulator)."""
        with self._cond:
            entries = list(self._syncq)
            self._syncq.clear()
        if not entries:  # lazily written batches only (their time is up)
            if self.fsync and self._wstate[1] > self._synced \
                    and self._sync_to(self._wstate[1]) is None:
                self.stats.lazy_syncs += 1
            return
        need = max((gen for gen, _, exc in entries if exc is None), default=0)
        err = self._sync_to(need)
        done: list[tuple[list[Callback], BaseException | None]] = []
        for gen, callbacks, exc in entries:
            if exc is None and gen > self._synced:
                exc = err or StoreError("store closed before the write was synced")
                self.stats.failed_commits += len(callbacks)
            done.append((callbacks, exc))
        # one hand-over for all of them (one wake-up of the broker's loop)
        if self._call is not None:
            try:
                self._call(self._report, done)
            except Exception:  # the loop is closed: nobody is left to tell
                log.exception("store commit callbacks not delivered")
        else:
            self._report(done)

    def _report(self, done: list[tuple[list[Callback], BaseException | None]]) -> None:
        """Run synced batches' callbacks, in commit order (on the broker's thread)."""
        try:
            for callbacks, exc in done:
                run_callbacks(callbacks, exc)
        finally:
            with self._cond:
                self._in_thread -= len(done)

    def _fsync_failed(self, e: OSError) -> StoreError:
        """After a failed fdatasync the page cache can't be trusted: disable the store."""
        self._broken = StoreError(f"fdatasync failed, store disabled: {e}")
        log.error("%s", self._broken)
        return self._broken

    def _rollover(self) -> None:
        """Start the next segment (under `_wlock`). The old one is fsynced first, so only
        the newest segment can ever have a torn tail (recovery relies on it)."""
        with self._sync_lock:  # the sync thread is not inside an fdatasync of the old fd
            fd, gen, _, _ = self._wstate
            try:
                self._cut_prealloc()
            except OSError as e:  # an older segment must end with its last frame
                self._broken = StoreError(f"cannot cut {self._paths[self._active]} to its "
                                          f"data, store disabled: {e}")
                log.error("%s", self._broken)
                return
            # in every mode, --no-fsync too (once per segment): only the newest segment
            # may then have a torn tail, so a power cut never leaves damage that
            # recovery must refuse (a hole in an older segment)
            try:
                fileio.fsync(fd)  # fsync, not fdatasync: the file's new (smaller) size too
            except OSError as e:
                self._fsync_failed(e)
                return
            if self.fsync:  # the counter is of fsyncs for message data
                self.stats.fsyncs += 1
            self._synced = gen
            try:
                self._new_segment(self._active + 1)  # closes the old fd
                self._compact_wake.set()
            except OSError as e:
                log.warning("cannot start a new segment (%s); appending to the current one", e)

    def _preallocate(self, need: int) -> None:
        """Extend the active segment's file to cover `need` bytes and PREALLOC_CHUNK more
        (not past segment_bytes); a refusal only means commits append as before."""
        end = max(need, min(self._alloc_end + PREALLOC_CHUNK, self.segment_bytes))
        try:
            fileio.posix_fallocate(self._wfd, self._alloc_end, end - self._alloc_end)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EINTR):
                self._prealloc = False  # not supported here: do not ask again
                log.info("%s: no preallocation (%s)", self.dir, e)
            return
        self._alloc_end = end
        self.stats.preallocated += end - need

    def _cut_prealloc(self) -> None:
        """Cut the active segment's file back to its last frame (rollover, close)."""
        if self._alloc_end > self._woff:
            fileio.ftruncate(self._wfd, self._woff)
            self._alloc_end = self._woff

    def _undo_write(self, base: int) -> None:
        """Cut a partial write off so later frames follow valid data (else: broken)."""
        with self._lock:
            self._forget_read_ahead()
        try:
            self._alloc_end = base
            fileio.ftruncate(self._wfd, base)
            if self.fsync:
                fileio.fdatasync(self._wfd)
        except OSError as e:
            self._broken = StoreError(f"cannot truncate after a failed write, store disabled: {e}")

    def _fail_batch(self, b: WriteBatch) -> None:
        """Nothing of the batch is durable: its adds are not stored (kept readable until
        removed); its removes and delivery counts go back into the next batch."""
        with self._lock:
            p = self._pending
            for key, op in b.adds.items():
                if self._unwritten.pop(key, None) is not None:
                    idx = self._index.get(op.qid)
                    if idx is not None and idx.pop(op.seq) != DEAD:
                        self._failed[key] = op
            for key, loc in b.removes.items():
                if key not in p.adds:
                    p.removes[key] = loc
            for key, count in b.delivered.items():
                if key not in p.adds and key not in p.removes:
                    p.delivered[key] = max(count, p.delivered.get(key, 0))


def take_pending(store: WriterMixin) -> WriteBatch:
    """The buffered batch, an empty one in its place (`commit`, `write`)."""
    with store._lock:
        if store._closed or store._closing:
            raise StoreError("store is closed")
        b = store._pending
        store._pending = WriteBatch()
    return b


def write_checked(store: WriterMixin, b: WriteBatch) -> StoreError | None:
    """`write_batch` (under `_wlock`); a bug in it disables the store, loudly, and keeps
    the broker up."""
    try:
        return write_batch(store, b)
    except Exception as e:
        log.exception("store write failed")
        err = store._broken = StoreError(f"store write failed: {e!r}")
        return err


def commit_batch(store: WriterMixin, b: WriteBatch, inline: bool = False) -> None:
    """Write `b`, then sync it inline or hand it to the sync thread (`commit`, `close`).

    The write path's steps are module functions, not methods: compiled code calls them
    directly, where a method of a class with interpreted subclasses is looked up by
    name on every call."""
    with store._wlock:
        err = write_checked(store, b)
        if err is not None:
            store.stats.failed_commits += len(b.callbacks)
        if not store.fsync:
            dispatch(store, b.callbacks, err)
            return
        # `_cond`'s lock, taken directly (Condition's __enter__ is Python code on the
        # lone message's path); notify needs only that lock held
        with store._lock:  # in write order: the sync thread reports them in that order
            if inline and store._in_thread == 0 and not store._closing:
                inline_gen = store._wstate[1]
            else:
                inline_gen = -1
                store._in_thread += 1
                store._syncq.append((store._wstate[1], b.callbacks, err))
                store._cond.notify()
        if inline_gen >= 0:
            if err is None:
                before_sync = store._before_sync
                if before_sync is not None:
                    try:
                        before_sync()
                    except Exception:  # the output is the caller's: the sync goes on
                        log.exception("before_sync failed")
                err = store._sync_to(inline_gen)
                if err is not None:
                    store.stats.failed_commits += len(b.callbacks)
            store.stats.inline_syncs += 1
    if inline_gen >= 0:
        run_callbacks(b.callbacks, err)


def write_lazily(store: WriterMixin, b: WriteBatch) -> StoreError | None:
    """Write `b` (`write`); wake the sync thread if it waits with no timer."""
    with store._wlock:
        err = write_checked(store, b)
    with store._lock:  # the thread decides to wait untimed under it, after reading _wstate
        if store._sync_idle:
            store._sync_idle = False
            store._cond.notify()
    return err


def dispatch(store: WriterMixin, callbacks: list[Callback], exc: BaseException | None) -> None:
    for cb in callbacks:
        try:
            if store._call is not None:
                store._call(cb, exc)
            else:
                cb(exc)
        except Exception:  # a broken callback must not kill the writer
            log.exception("store commit callback failed")


def run_callbacks(callbacks: list[Callback], exc: BaseException | None) -> None:
    for cb in callbacks:
        try:
            cb(exc)
        except Exception:  # a broken callback must not break the commit or the writer
            log.exception("store commit callback failed")


def write_batch(store: WriterMixin, b: WriteBatch) -> StoreError | None:
    """Serialize and `write()` one batch (under `_wlock`); no fsync here."""
    if store._broken is not None:
        store._fail_batch(b)
        return store._broken
    if not b:
        return None  # nothing to write: reported once what came before is synced
    if store._woff >= store.segment_bytes:
        store._rollover()
        if store._broken is not None:
            store._fail_batch(b)
            return store._broken
    base = store._woff
    synced_seg, synced = store._synced_at
    if synced_seg == store._active and synced > store._claimed:  # tells torn from corrupt
        store._claimed = synced
    else:
        synced = -1
    placed: list[tuple[PendingAdd, int]] = []
    data: bytes | bytearray
    op = lone_add(b)
    if op is not None:
        data, at = lone_add_frame(synced, op.qid, op.seq, op.count, op.exchange.encode(),
                                  op.routing_key.encode(), op.properties, op.body)
        placed.append((op, base + at))
        add_bytes = len(data) - at
        records = 1 if synced < 0 else 2
    else:
        data, add_bytes, records = encode_batch(b, synced, base, placed)
    if base + len(data) > store._alloc_end and store._prealloc:
        store._preallocate(base + len(data))
    try:
        done = fileio.pwrite(store._wfd, data, base)
        if done < len(data):  # a short write (a signal, a full disk): the rest
            view = memoryview(data)
            while done < len(data):
                done += fileio.pwrite(store._wfd, view[done:], base + done)
    except OSError as e:
        store._undo_write(base)
        store._fail_batch(b)
        if store._broken is not None:
            return store._broken
        what = "disk full" if e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT) else "I/O error"
        return StoreError(f"write to {store._paths[store._active]} failed ({what}): {e}")
    store.stats.writes += 1
    store.stats.bytes_written += len(data)
    store.stats.records_written += records
    seg = store._active
    shift = seg << 32
    with store._lock:
        info = store._segs[seg]
        info.size = base + len(data)
        store._woff = info.size
        for op, off in placed:
            key = (op.qid, op.seq)
            store._unwritten.pop(key, None)
            info.adds += 1
            idx = store._index.get(op.qid)
            if idx is not None and idx.replace(op.seq, PENDING, shift | off):
                info.live += 1
        info.add_bytes += add_bytes
        for key in b.removes:
            store._unwritten_removes.pop(key, None)
        if b.notes:  # where each live note's record is now (compaction copies it)
            later = {n for _op, n in store._pending.notes}
            for nop, note in b.notes:
                if nop == NOTE_PUT and note not in later and store._notes.get(note) == -1:
                    store._notes[note] = seg
    store._wstate = (store._wfd, store._wstate[1] + 1, seg, store._woff)
    return None


def lone_add(b: WriteBatch) -> PendingAdd | None:
    """The batch's one ADD when it holds nothing else and is small (`lone_add_frame`)."""
    if len(b.adds) != 1 or b.delivered or b.removes or b.notes:
        return None
    for op in b.adds.values():
        if len(op.body) + len(op.properties) <= LONE_ADD_MAX:
            return op
    return None


def encode_batch(b: WriteBatch, synced: int, base: int,
                 placed: list[tuple[PendingAdd, int]]) -> tuple[bytearray, int, int]:
    """Any batch's frames (a SYNCED record first when `synced` >= 0); each ADD with its
    file offset into `placed`. Returns the bytes, the ADD records' size, the records."""
    fw = FrameWriter(one_frame=bool(b.notes))
    out = fw.out
    if synced >= 0:
        fw.begin_record()
        encode_synced(out, synced)
    add_bytes = 0
    for op in b.adds.values():
        start = fw.begin_record()
        placed.append((op, base + start))
        encode_add(out, op.qid, op.seq, op.count, op.exchange.encode(),
                   op.routing_key.encode(), op.properties, op.body)
        add_bytes += len(out) - start
    for (qid, seq), count in b.delivered.items():
        fw.begin_record()
        encode_delivered(out, qid, seq, count)
    for qid, seq in b.removes:
        fw.begin_record()
        encode_remove(out, qid, seq)
    for nop, note in b.notes:  # after the ADDs, in their frame: both or neither
        fw.begin_record()
        encode_note(out, nop, note)
    return fw.finish(), add_bytes, fw.records
