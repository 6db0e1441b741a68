"""The stream protocol's tracking in the store (X3, X4; store/streamtrack.py), in
process: publisher sequences and stored offsets come back after a reopen, an entry whose
records were lost (a power cut kept the tracking file's page, not the segment's; a kill
-9 between the two writes) is ignored, a torn tail is cut, superseded entries are
compacted away; a named publisher's sequence kept in its records' trailers survives a
power cut between the records' sync and the tracking file's, and rebuilds the file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from ackmq.store.streamlog import BODY, StreamLog, StreamStore
from ackmq.store.streamtrack import OFFSET, PUBLISHER


def _store(root: Path) -> StreamStore:
    return StreamStore(root, fsync=True)  # no loop: commit syncs in the caller


def _commit(store: StreamStore) -> None:
    errors: list[BaseException | None] = []
    store.commit(errors.append)
    assert errors == [None]


def test_X3_X4_tracking_survives_a_reopen(tmp_path: Path) -> None:
    store = _store(tmp_path)
    lg = store.open("/", "s", True, 0, None, None)
    for i in range(10):
        lg.append("", "s", b"\x00\x00", f"m{i}".encode())
    lg.track(PUBLISHER, "app", 10)
    lg.track(OFFSET, "reader", 4)
    store.appended("/", "s", lg)
    _commit(store)
    lg.track(OFFSET, "reader", 7)  # a later value of the same entry wins
    store.appended("/", "s", lg)
    _commit(store)
    store.close()
    lg = _store(tmp_path).open("/", "s", False, 0, None, None)
    assert (lg.tracked(PUBLISHER, "app"), lg.tracked(OFFSET, "reader")) == (10, 7)
    assert lg.tracked(PUBLISHER, "nobody") is None
    # every entry at once (list_stream_tracking), the latest values
    assert lg.tracked_all() == [(PUBLISHER, "app", 10), (OFFSET, "reader", 7)]


def test_X3_an_entry_whose_records_were_lost_is_ignored(tmp_path: Path) -> None:
    """The entry for ids 11..20 covers offsets up to 20; the segment loses its last
    records (cut back to 10 records, as a power cut before their fdatasync): the
    sequence comes back as 10, so the resent 11..20 are taken, not dropped."""
    store = _store(tmp_path)
    lg = store.open("/", "s", True, 0, None, None)
    for i in range(10):
        lg.append("", "s", b"\x00\x00", f"m{i}".encode())
    lg.track(PUBLISHER, "app", 10)
    store.appended("/", "s", lg)
    _commit(store)
    size_at_10 = lg.segments[-1].size
    for i in range(10, 20):
        lg.append("", "s", b"\x00\x00", f"m{i}".encode())
    lg.track(PUBLISHER, "app", 20)
    store.appended("/", "s", lg)
    _commit(store)
    seg = lg.segments[-1].path
    store.close()
    os.truncate(seg, size_at_10)
    lg = _store(tmp_path).open("/", "s", False, 0, None, None)
    assert lg.next_offset == 10
    assert lg.tracked(PUBLISHER, "app") == 10


def test_X3_a_torn_tracking_tail_is_cut(tmp_path: Path) -> None:
    store = _store(tmp_path)
    lg = store.open("/", "s", True, 0, None, None)
    lg.append("", "s", b"\x00\x00", b"m")
    lg.track(PUBLISHER, "app", 1)
    store.appended("/", "s", lg)
    _commit(store)
    lg.track(PUBLISHER, "app", 2)
    store.appended("/", "s", lg)
    _commit(store)
    path = lg.dir / "tracking"
    store.close()
    os.truncate(path, path.stat().st_size - 3)
    lg = _store(tmp_path).open("/", "s", False, 0, None, None)
    assert lg.tracked(PUBLISHER, "app") == 1
    lg.track(PUBLISHER, "app", 3)  # and the file takes new entries after the cut
    _store_close(lg)
    lg = _store(tmp_path).open("/", "s", False, 0, None, None)
    assert lg.tracked(PUBLISHER, "app") == 3


def _store_close(lg: object) -> None:
    lg.close()  # type: ignore[attr-defined]


def test_X4_superseded_entries_are_compacted(tmp_path: Path) -> None:
    store = _store(tmp_path)
    lg = store.open("/", "s", True, 0, None, None)
    for i in range(500):
        lg.track(OFFSET, "reader", i)
        store.appended("/", "s", lg)
        _commit(store)
    path = lg.dir / "tracking"
    big = path.stat().st_size
    store.close()
    lg = _store(tmp_path).open("/", "s", False, 0, None, None)
    assert lg.tracked(OFFSET, "reader") == 499
    assert path.stat().st_size < big // 100


class _Disk:
    """What a disk holds under a stream's directory: each file's bytes as of its last
    fsync/fdatasync (the real files play the page cache), recorded after every sync, so
    `cut(k)` can put the directory back as a power cut after the k-th sync leaves it
    (and `torn` as one that kept part of the next sync's writes). The real syncs still
    run; only their moments are noted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
        self.root = str(root)
        self.images: list[dict[str, bytes]] = [{}]
        self.synced: list[str] = [""]  # the file each image's sync made durable
        real_fdatasync, real_fsync = os.fdatasync, os.fsync

        def noted(real: Any) -> Any:
            def sync(fd: int) -> None:
                real(fd)
                path = os.readlink(f"/proc/self/fd/{fd}")
                if path.startswith(self.root) and os.path.isfile(path):
                    image = dict(self.images[-1])
                    image[path] = Path(path).read_bytes()
                    self.images.append(image)
                    self.synced.append(path)
            return sync

        real_replace = os.replace

        def replace(src: Any, dst: Any) -> None:  # a synced file renamed (an index file)
            real_replace(src, dst)
            image = self.images[-1]
            if str(src) in image:
                image[str(dst)] = image.pop(str(src))

        monkeypatch.setattr(os, "fdatasync", noted(real_fdatasync))
        monkeypatch.setattr(os, "fsync", noted(real_fsync))
        monkeypatch.setattr(os, "replace", replace)

    def cut(self, k: int, into: Path, torn: tuple[str, int] | None = None) -> Path:
        """`into`: a copy of the tree with every file as the k-th image has it (a file
        never synced by then: absent); `torn` (path, size): that file holds its first
        `size` bytes of the next image's. The stream's directory in it."""
        shutil.rmtree(into, ignore_errors=True)
        image = dict(self.images[k])
        if torn is not None:
            image[torn[0]] = self.images[k + 1][torn[0]][:torn[1]]
        for src, data in image.items():
            dst = into / os.path.relpath(src, self.root)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(data)
        return next(p for p in into.iterdir() if p.is_dir())


def _ids(lg: StreamLog) -> list[int]:
    """The ids of the messages in the stream, from the first."""
    ids: list[int] = []
    while lg.first_offset + len(ids) < lg.next_offset:
        ids += [int(r[BODY][1:]) for r in lg.read(lg.first_offset + len(ids), 10_000)]
    return ids


def _publish(lg: StreamLog, ids: range, ref: str = "app") -> None:
    """A named publisher's Publish frame, as publishing.py appends it."""
    first = lg.append_many("", "s", [(b"\x00\x00", f"m{i}".encode()) for i in ids])
    lg.track_publish(first, ref, ids[-1])


def _after_cut(d: Path) -> None:
    """The publisher's resend of ids 1..80 (dropped at or below its sequence, as
    publishing.py drops them) leaves each id in the stream once; the sequence is the
    last id kept, never below (a resend stored twice) nor above (one dropped, lost)."""
    lg = StreamLog(d, 150)
    kept = _ids(lg)
    assert kept == list(range(1, len(kept) + 1)), kept
    assert len(kept) % 5 == 0, kept  # whole publishes
    seq = lg.tracked(PUBLISHER, "app")
    assert (seq or 0) == len(kept), (seq, len(kept))
    for i in range(1, 81):
        if i > (seq or 0):
            lg.append("", "s", b"\x00\x00", f"m{i}".encode())
    assert _ids(lg) == list(range(1, 81))
    lg.close()


def _named_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> _Disk:
    """A named publisher's frames (5 ids each, two a turn), each turn committed
    (records synced, then the tracking file), segments rolled between a turn's frames,
    a stored offset now and then: what the disk held after each sync."""
    live = tmp_path / "live"
    disk = _Disk(monkeypatch, live)
    store = _store(live)
    lg = store.open("/", "s", True, 150, None, None)  # small segments: rolls mid-turn
    for turn in range(8):
        _publish(lg, range(turn * 10 + 1, turn * 10 + 6))
        _publish(lg, range(turn * 10 + 6, turn * 10 + 11))
        if turn % 3 == 1:
            lg.track(OFFSET, "reader", turn)  # a stored offset in the same commit
        store.appended("/", "s", lg)
        _commit(store)
    store.close()
    assert len(lg.segments) > 2
    monkeypatch.undo()
    return disk


def test_X3_power_cut_between_records_and_tracking_keeps_the_sequence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A power cut after any sync of `_named_turns`, then the publisher's resend of
    every id: every id is in the stream once. Before the sequence travelled in the
    records' trailers, a cut after a turn's records and before its tracking file's sync
    kept the records and lost their entry, and the resend stored them again. (Some cuts
    keep closed segments with their index files: their trailers past the tracking
    file's point are read from them.)"""
    disk = _named_turns(tmp_path, monkeypatch)
    for k in range(1, len(disk.images)):
        _after_cut(disk.cut(k, tmp_path / "after"))
    assert len(disk.images) > 16
    assert any(p.endswith(".idx") for p in disk.images[-1])


def test_X3_torn_publish_is_cut_whole_with_its_sequence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A power cut keeping part of a segment's unsynced writes (any length: whole
    records of a frame but not all, a record torn): opening keeps whole publishes only
    (the rest was never synced, so never confirmed) and the sequence matches them, so
    the resend stores each id once."""
    disk = _named_turns(tmp_path, monkeypatch)
    torn = 0
    for k in range(1, len(disk.images) - 1):
        nxt = disk.synced[k + 1]
        if nxt.endswith(".seg"):
            for size in range(len(disk.images[k].get(nxt, b"")),
                              len(disk.images[k + 1][nxt]), 23):
                _after_cut(disk.cut(k, tmp_path / "after", (nxt, size)))
                torn += 1
    assert torn > 50


def test_X3_trailers_in_closed_segments_rebuild_a_lost_tracking_file(tmp_path: Path) -> None:
    """The tracking file gone (never synced before the cut), the log rolled over several
    segments, their index files written: opening reads the publishers' trailers from the
    closed segments too (marked by their index), and the newest of each publisher wins."""
    store = _store(tmp_path)
    lg = store.open("/", "s", True, 500, None, None)
    for turn in range(6):
        _publish(lg, range(turn * 10, turn * 10 + 10), "a" if turn < 3 else "b")
        store.appended("/", "s", lg)
        _commit(store)
    d = lg.dir
    store.close()
    assert len(list(d.glob("*.idx"))) >= 2
    (d / "tracking").unlink()
    lg = _store(tmp_path).open("/", "s", False, 500, None, None)
    assert (lg.tracked(PUBLISHER, "a"), lg.tracked(PUBLISHER, "b")) == (29, 59)
    lg.close()  # and written back into the tracking file
    assert StreamLog(d, 500).tracked_all() == [(PUBLISHER, "a", 29), (PUBLISHER, "b", 59)]


def test_X3_X4_a_log_written_before_trailers_opens_with_its_tracking_file(
        tmp_path: Path) -> None:
    """A data dir of the format before trailers: records without one, closed segments'
    index files of magic ACKMQSI1, the sequences and offsets in the tracking file only:
    it opens with the file's values, and later publishes add trailers."""
    store = _store(tmp_path)
    lg = store.open("/", "s", True, 500, None, None)
    for turn in range(4):
        for i in range(turn * 10, turn * 10 + 10):
            lg.append("", "s", b"\x00\x00", f"m{i}".encode())
        lg.track(PUBLISHER, "app", turn * 10 + 9)  # the file's entry only, as then
        lg.track(OFFSET, "reader", turn)
        store.appended("/", "s", lg)
        _commit(store)
    d = lg.dir
    store.close()
    assert all(p.read_bytes()[:8] == b"ACKMQSI1" for p in d.glob("*.idx"))
    assert all(b"app" not in p.read_bytes() for p in d.glob("*.seg"))
    lg = _store(tmp_path).open("/", "s", False, 500, None, None)
    assert (lg.tracked(PUBLISHER, "app"), lg.tracked(OFFSET, "reader")) == (39, 3)
    _publish(lg, range(40, 41))
    lg.close()
    (d / "tracking").unlink()  # the trailer alone has it now
    lg = StreamLog(d, 500)
    assert lg.tracked(PUBLISHER, "app") == 40
    assert _ids(lg) == list(range(41))
    lg.close()


def test_X3_a_clean_close_snapshots_the_whole_log(tmp_path: Path) -> None:
    """A named publish, then unnamed ones filling segments: the tracking file's point
    would stay at the named one, and every open would read the segment holding it for
    trailers; a clean close writes the publishers' entries again covering the whole
    log, so the next open starts from its end."""
    store = _store(tmp_path)
    lg = store.open("/", "s", True, 2000, None, None)
    _publish(lg, range(1, 6))
    store.appended("/", "s", lg)
    _commit(store)
    assert lg.tracking.point == 5
    for i in range(100):
        lg.append("", "s", b"\x00\x00", f"m{i}".encode())
        store.appended("/", "s", lg)
        _commit(store)
    assert len(lg.segments) > 1 and lg.tracking.point == 5
    d = lg.dir
    store.close()
    lg = StreamLog(d, 2000)
    assert lg.tracking.point == lg.next_offset == 105
    assert lg.tracked(PUBLISHER, "app") == 5
    lg.close()
