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

This module reads and writes files; it sees the store only through its compaction API
(compact_api.py: `closed_segments`, `segment_path`, `live_adds`, `sync_written`,
`replace_prefix`, `wait_compaction`, plus `stats`, `dir`, `segment_bytes`), never its index or locks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from . import fileio
from .format import (
    ADD,
    ADD_HDR,
    DELIVERED,
    DELIVERED_REC,
    NOTE_PUT,
    REC_HDR,
    FrameWriter,
    encode_delivered,
    encode_note,
    file_header,
    iter_records,
    log,
    valid_length,
)

if TYPE_CHECKING:
    from .compact_api import CompactionMixin as SegmentStore

FLUSH_BYTES = 8 << 20
# ADD records checked against the index per hold of the store's lock: the broker thread's
# add/remove/delivered wait for that lock, and a whole 64 MiB segment of 1 KiB messages
# (60,000 records) held it for 44 ms
LIVE_CHUNK = 1024


def finish_interrupted(data_dir: Path) -> None:
    """Complete a compaction that passed its commit point; drop unfinished temp files."""
    for tmp in data_dir.glob("*.tmp"):
        fileio.unlink(tmp)
    for done in sorted(data_dir.glob("*.compact")):
        k = int(done.name.split(".")[0])
        for p in data_dir.glob("*.seg"):
            if int(p.name.split(".")[0]) <= k:
                fileio.unlink(p)
        fileio.fsync_dir(data_dir)
        fileio.replace(done, data_dir / f"{k:08d}.seg")
        fileio.fsync_dir(data_dir)
        log.info("%s: finished an interrupted compaction", done)


def compactor_main(st: SegmentStore) -> None:
    while st.wait_compaction():
        try:
            maybe_compact(st)
        except Exception:
            log.exception("compaction failed (will retry later)")


def choose_prefix(st: SegmentStore) -> list[int]:
    """Longest prefix of closed segments that is at least half garbage (and at least one
    segment's worth of it): copying its live part costs at most what it frees."""
    infos = st.closed_segments()
    closed = [s for s, _size, _live in infos]
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
    fd = fileio.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    moved: list[tuple[int, int, int, int]] = []  # qid, seq, old position, new position
    copied = 0
    try:
        head = file_header(k)
        pos = fileio.write_all(fd, head)
        fw = FrameWriter()
        counts: dict[tuple[int, int], int] = {}
        for s in prefix:
            path = st.segment_path(s)
            data = path.read_bytes()
            end = valid_length(data, str(path), s, newest=False)
            # candidates are checked LIVE_CHUNK at a time while the segment is read, so
            # the working set stays a chunk of tuples, not one per ADD of the segment
            # (hundreds of thousands for small messages, whose memory the allocator kept)
            cands: list[tuple[int, int, int, int, int]] = []
            records = iter_records(data, 16, end)
            while True:
                for off, rec in records:
                    if rec[0] == ADD:
                        _, qid, seq = ADD_HDR.unpack_from(rec)[:3]
                        cands.append((qid, seq, (s << 32) | off, off, len(rec)))
                        if len(cands) >= LIVE_CHUNK:
                            break
                    elif rec[0] == DELIVERED:
                        _, qid, seq, c = DELIVERED_REC.unpack_from(rec)
                        if c > counts.get((qid, seq), 0):
                            counts[(qid, seq)] = c
                if not cands:
                    break
                # the broker thread gets in between the chunks
                for qid, seq, old, off, size in st.live_adds(cands):
                    new = (k << 32) | (pos + fw.begin_record())
                    fw.out += data[off:off + REC_HDR.size + size]
                    moved.append((qid, seq, old, new))
                    copied += REC_HDR.size + size
                    if len(fw.out) >= FLUSH_BYTES:
                        pos += fileio.write_all(fd, fw.finish())
                        fw = FrameWriter()
                cands = []
        keys = {(qid, seq) for qid, seq, _, _ in moved}
        for key, c in counts.items():
            if key in keys:
                fw.begin_record()
                encode_delivered(fw.out, key[0], key[1], c)
        notes = st.notes_in(prefix)  # only notes already written: none becomes durable early
        st.sync_written()  # what made the dropped records dead is durable before they go
        for note in notes:
            fw.begin_record()
            encode_note(fw.out, NOTE_PUT, note)
        pos += fileio.write_all(fd, fw.finish())
        fileio.fsync(fd)
    except BaseException:
        fileio.close(fd)
        fileio.unlink(tmp, missing_ok=True)
        raise
    fileio.close(fd)
    if not moved and not notes:
        fileio.unlink(tmp)
        st.replace_prefix(prefix, None)
    else:
        fileio.replace(tmp, done)
        fileio.fsync_dir(st.dir)  # commit point: from here on the prefix is replaced
        st.replace_prefix(prefix, (k, done, pos, moved, copied), notes)
    st.stats.compactions += 1
    st.stats.segments_deleted += len(prefix)
    st.stats.bytes_copied += copied
    log.info("compacted segments %d..%d: %d live messages (%d bytes) kept",
             prefix[0], k, len(moved), copied)

