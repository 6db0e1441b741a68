"""Space reclamation: compaction of the oldest segments (a prefix of the log).

Why a prefix: a REMOVE record may only be dropped when no ADD of that message is left
anywhere. ADDs always come before their REMOVE/DELIVERED in log order, so every record
in the prefix [first .. K] refers to a message whose ADDs are all in the prefix too.
Rewriting the prefix as ONE new file holding only its live ADD records (copied verbatim,
checksums included) plus the delivery counts of those messages is therefore exact, and
it frees the space of any dead segment, however long a single unacked message lives:
that message is simply copied (once per compaction that covers it).

Crash safety: the output is written to `K.compact.tmp`, fsynced, renamed to `K.compact`
(the commit point), then the prefix files are unlinked and `K.compact` is renamed to
`K.seg`. `finish_interrupted` redoes the last two steps on open.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .defs import fsync_dir
from .format import (
    ADD,
    ADD_HDR,
    DELIVERED,
    DELIVERED_REC,
    REC_HDR,
    FrameWriter,
    encode_delivered,
    file_header,
    iter_records,
    log,
    valid_length,
)
from .index import DEAD

if TYPE_CHECKING:
    from .segments import SegmentStore

FLUSH_BYTES = 8 << 20


def finish_interrupted(data_dir: Path) -> None:
    """Complete a compaction that passed its commit point; drop unfinished temp files."""
    for tmp in data_dir.glob("*.tmp"):
        tmp.unlink()
    for done in sorted(data_dir.glob("*.compact")):
        k = int(done.name.split(".")[0])
        for p in data_dir.glob("*.seg"):
            if int(p.name.split(".")[0]) <= k:
                p.unlink()
        fsync_dir(data_dir)
        os.replace(done, data_dir / f"{k:08d}.seg")
        fsync_dir(data_dir)
        log.info("%s: finished an interrupted compaction", done)


def compactor_main(st: SegmentStore) -> None:
    while True:
        st._compact_wake.wait(st.compact_interval)
        st._compact_wake.clear()
        if st._closing:
            return
        try:
            maybe_compact(st)
        except Exception:
            log.exception("compaction failed (will retry later)")


def choose_prefix(st: SegmentStore) -> list[int]:
    """Longest prefix of closed segments that is at least half garbage (and at least one
    segment's worth of it): copying its live part costs at most what it frees."""
    with st._lock:
        closed = sorted(s for s in st._segs if s < st._active)
        infos = [(s, st._segs[s].size, st._segs[s].live_bytes()) for s in closed]
    best = -1
    total = live = 0.0
    for s, size, lb in infos:
        total += size
        live += lb
        garbage = total - live
        if garbage >= st.segment_bytes and live <= garbage:
            best = s
    return [s for s in closed if s <= best]


def maybe_compact(st: SegmentStore) -> bool:
    prefix = choose_prefix(st)
    if not prefix:
        return False
    compact_prefix(st, prefix)
    return True


def compact_prefix(st: SegmentStore, prefix: list[int]) -> None:
    k = prefix[-1]
    tmp = st.dir / f"{k:08d}.compact.tmp"
    done = st.dir / f"{k:08d}.compact"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    moved: list[tuple[int, int, int, int]] = []  # qid, seq, old position, new position
    copied = 0
    try:
        head = file_header(k)
        os.write(fd, head)
        pos = len(head)
        fw = FrameWriter()
        counts: dict[tuple[int, int], int] = {}
        for s in prefix:
            with st._lock:
                path = st._paths[s]
            data = path.read_bytes()
            end = valid_length(data, str(path), s, newest=False)
            cands: list[tuple[int, int, int, int, int]] = []
            for off, rec in iter_records(data, 16, end):
                if rec[0] == ADD:
                    _, qid, seq = ADD_HDR.unpack_from(rec)[:3]
                    cands.append((qid, seq, (s << 32) | off, off, len(rec)))
                elif rec[0] == DELIVERED:
                    _, qid, seq, c = DELIVERED_REC.unpack_from(rec)
                    if c > counts.get((qid, seq), 0):
                        counts[(qid, seq)] = c
            with st._lock:
                live = [c for c in cands if st._is_live(c[0], c[1], c[2])]
            for qid, seq, old, off, size in live:
                new = (k << 32) | (pos + fw.begin_record())
                fw.out += data[off:off + REC_HDR.size + size]
                moved.append((qid, seq, old, new))
                copied += REC_HDR.size + size
                if len(fw.out) >= FLUSH_BYTES:
                    pos += _write_all(fd, fw.finish())
                    fw = FrameWriter()
        keys = {(qid, seq) for qid, seq, _, _ in moved}
        for key, c in counts.items():
            if key in keys:
                fw.begin_record()
                encode_delivered(fw.out, key[0], key[1], c)
        pos += _write_all(fd, fw.finish())
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    if not moved:
        tmp.unlink()
        _drop(st, prefix, None)
    else:
        os.replace(tmp, done)
        fsync_dir(st.dir)  # commit point: from here on the prefix is replaced
        _drop(st, prefix, (k, done, pos, moved, copied))
    st.stats.compactions += 1
    st.stats.segments_deleted += len(prefix)
    st.stats.bytes_copied += copied
    log.info("compacted segments %d..%d: %d live messages (%d bytes) kept",
             prefix[0], k, len(moved), copied)


def _write_all(fd: int, data: bytearray) -> int:
    view = memoryview(data)
    done = 0
    while done < len(data):
        done += os.write(fd, view[done:])
    return done


def _drop(st: SegmentStore, prefix: list[int],
          new: tuple[int, Path, int, list[tuple[int, int, int, int]], int] | None) -> None:
    """Switch the index to the new file (if any), then delete the prefix files."""
    from .segments import SegInfo, seg_name

    with st._lock:
        st._forget_read_ahead()
        if new is not None:
            k, path, size, moved, copied = new
            info = SegInfo(size=size, adds=len(moved), add_bytes=copied)
            for qid, seq, old, pos in moved:
                idx = st._index.get(qid)
                if idx is not None and idx.replace(seq, old, pos):
                    info.live += 1
                elif st._unwritten_removes.get((qid, seq)) == old:
                    st._unwritten_removes[(qid, seq)] = pos
        for s in prefix:
            fd = st._rfds.pop(s, None)
            if fd is not None:
                os.close(fd)
            st._segs.pop(s, None)
            st._paths.pop(s, None)
        if new is not None:
            st._segs[k] = info
            st._paths[k] = path
    for s in prefix:  # oldest first: a crash part way leaves a consistent shorter log
        (st.dir / seg_name(s)).unlink(missing_ok=True)
    fsync_dir(st.dir)
    if new is not None:
        with st._lock:
            os.replace(new[1], st.dir / seg_name(new[0]))
            st._paths[new[0]] = st.dir / seg_name(new[0])
        fsync_dir(st.dir)


def is_live(st: SegmentStore, qid: int, seq: int, pos: int) -> bool:
    """Still needed on disk: live in the index, or removed but the REMOVE not written yet."""
    idx = st._index.get(qid)
    if idx is not None and idx.get(seq) == pos and pos != DEAD:
        return True
    return st._unwritten_removes.get((qid, seq)) == pos
