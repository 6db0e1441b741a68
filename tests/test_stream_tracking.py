"""The stream protocol's tracking in the store (X3, X4; store/streamtrack.py), in
process: publisher sequences and stored offsets come back after a reopen, an entry whose
records were lost (a power cut kept the tracking file's page, not the segment's; a kill
-9 between the two writes) is ignored, a torn tail is cut, superseded entries are
compacted away."""

from __future__ import annotations

import os
from pathlib import Path

from ackmq.store.streamlog import StreamStore
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
