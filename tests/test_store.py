"""The embedded store, driven directly (no broker): ackmq/store."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from ackmq.store import (
    BindingDef,
    CorruptStore,
    ExchangeDef,
    QueueDef,
    Recovered,
    SegmentStore,
    StoreError,
    open_store,
)
from ackmq.store import compact as compact_mod
from ackmq.store.format import valid_length

PROPS = b"\x10\x00\x02"  # delivery-mode 2


def commit_sync(st: SegmentStore, timeout: float = 10.0) -> BaseException | None:
    done = threading.Event()
    box: list[BaseException | None] = []

    def cb(exc: BaseException | None) -> None:
        box.append(exc)
        done.set()

    st.commit(cb)
    assert done.wait(timeout), "commit callback never came"
    return box[0]


def fresh(path: Path, **kw) -> tuple[SegmentStore, int]:
    st = open_store(path, **kw)
    rec = st.open()
    return st, rec.epoch


def seg_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.seg"))


def hold_sync_thread(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Make the sync thread's fdatasyncs wait: returns (inside one, let them go)."""
    real, inside, release = os.fdatasync, threading.Event(), threading.Event()

    def held(fd: int) -> None:
        if threading.current_thread().name == "ackmq-store-sync" and not release.is_set():
            inside.set()
            release.wait(10)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", held)
    return inside, release


def publish(st: SegmentStore, queue: str, seqs: list[int], size: int = 100) -> list[int]:
    return [st.add(queue, s, "ex", "rk", PROPS, s.to_bytes(8, "little") * (size // 8))
            for s in seqs]


def body_of(seq: int, size: int = 100) -> bytes:
    return seq.to_bytes(8, "little") * (size // 8)


def low(rec: Recovered, queue: str, mask: int = 0xFF) -> list[int]:
    """The recovered seqs of `queue` in iteration order, epoch bits masked off."""
    return [seq & mask for seq, _, _ in rec.messages[queue]]


def test_round_trip_definitions_and_messages(tmp_path: Path) -> None:
    st, epoch = fresh(tmp_path)
    st.save_exchange(ExchangeDef("ex", "topic", arguments={"alternate-exchange": "ae"}))
    st.save_exchange(ExchangeDef("gone", "fanout"))
    st.delete_exchange("gone")
    st.save_queue(QueueDef("q", arguments={"x-max-length": 10, "b": b"\x00\x01"}))
    st.save_queue(QueueDef("q2"))
    st.save_binding(BindingDef("ex", "q", "queue", "a.#", {"k": [1, "two"]}))
    st.save_binding(BindingDef("ex", "q2", "queue", "b"))
    st.delete_binding(BindingDef("ex", "q2", "queue", "b"))
    seqs = [(epoch << 40) | i for i in range(5)]
    locs = publish(st, "q", seqs)
    assert st.pending
    assert commit_sync(st) is None
    assert not st.pending
    assert [st.read_body(x) for x in locs] == [body_of(s) for s in seqs]
    st.close()

    st3 = open_store(tmp_path)
    rec = st3.open()
    assert rec.epoch > epoch
    assert [e.name for e in rec.exchanges] == ["ex"]
    assert rec.exchanges[0].arguments == {"alternate-exchange": "ae"}
    assert {q.name: q.arguments for q in rec.queues} == {
        "q": {"x-max-length": 10, "b": b"\x00\x01"}, "q2": {}}
    assert rec.bindings == [BindingDef("ex", "q", "queue", "a.#", {"k": [1, "two"]})]
    q = rec.messages["q"]
    assert len(q) == 5
    assert list(q) == [(s, loc, 0) for s, loc in zip(seqs, locs, strict=True)]
    msgs = [st3.read_message(loc) for _, loc, _ in q]
    assert [m.seq for m in msgs] == seqs
    assert [m.location for m in msgs] == locs
    assert all(m.exchange == "ex" and m.routing_key == "rk" and m.properties == PROPS
               and m.delivery_count == 0 for m in msgs)
    assert [m.body for m in msgs] == [body_of(s) for s in seqs]
    assert [st3.read_body(x) for x in locs] == [body_of(s) for s in seqs]
    assert len(rec.messages["q2"]) == 0 and list(rec.messages["q2"]) == []  # empty: present
    st3.close()


def test_read_message_from_the_unwritten_batch_and_from_disk(tmp_path: Path) -> None:
    st, e = fresh(tmp_path)
    st.save_queue(QueueDef("q"))
    loc = st.add("q", (e << 40) | 1, "amq.topic", "a.b", PROPS, b"hello")
    st.delivered("q", (e << 40) | 1, 2)
    m = st.read_message(loc)  # not committed yet: served from memory
    assert (m.seq, m.exchange, m.routing_key, m.properties, m.body, m.delivery_count,
            m.location) == ((e << 40) | 1, "amq.topic", "a.b", PROPS, b"hello", 2, loc)
    assert commit_sync(st) is None
    assert st.read_message(loc) == m  # now preaded from the segment
    st.remove("q", (e << 40) | 1)
    with pytest.raises(StoreError):
        st.read_message(loc)
    st.close()


def test_identical_redeclare_writes_nothing(tmp_path: Path) -> None:
    st, _ = fresh(tmp_path)
    st.save_queue(QueueDef("q", arguments={"x-max-length": 5}))
    st.save_exchange(ExchangeDef("ex", "direct"))
    st.save_binding(BindingDef("ex", "q", "queue", "k"))
    size = (tmp_path / "defs.log").stat().st_size
    st.save_queue(QueueDef("q", arguments={"x-max-length": 5}))
    st.save_exchange(ExchangeDef("ex", "direct"))
    st.save_binding(BindingDef("ex", "q", "queue", "k"))
    assert (tmp_path / "defs.log").stat().st_size == size
    st.save_queue(QueueDef("q", arguments={"x-max-length": 6}))  # changed: journaled
    assert (tmp_path / "defs.log").stat().st_size > size
    st.close()
    st = open_store(tmp_path)
    assert st.open().queues == [QueueDef("q", arguments={"x-max-length": 6})]
    st.close()


def test_newest_segment_with_zeroed_header_is_dropped(tmp_path: Path) -> None:
    st, e = fresh(tmp_path)
    st.save_queue(QueueDef("q"))
    publish(st, "q", [(e << 40) | 1])
    assert commit_sync(st) is None
    st.close()
    newest = seg_files(tmp_path)[-1]
    (tmp_path / f"{int(newest.stem) + 1:08d}.seg").write_bytes(bytes(4096))  # crash at create
    st = open_store(tmp_path)
    assert low(st.open(), "q") == [1]
    st.close()


def test_epoch_is_bumped_durably_on_every_open(tmp_path: Path) -> None:
    epochs = []
    for _ in range(4):
        st, epoch = fresh(tmp_path)
        epochs.append(epoch)
        st.close()
    assert epochs == sorted(set(epochs)) and len(epochs) == 4


def test_P5_add_and_remove_in_one_batch_cancel_out(tmp_path: Path) -> None:
    st, epoch = fresh(tmp_path)
    st.save_queue(QueueDef("q"))
    size_before = sum(p.stat().st_size for p in seg_files(tmp_path))
    publish(st, "q", [(epoch << 40) | 1, (epoch << 40) | 2])
    st.remove("q", (epoch << 40) | 1)
    st.remove("q", (epoch << 40) | 2)
    assert not st.pending
    assert commit_sync(st) is None
    assert st.stats.cancelled == 2
    assert st.stats.records_written == 0 and st.stats.fsyncs == 0
    assert sum(p.stat().st_size for p in seg_files(tmp_path)) == size_before
    st.close()
    st, _ = fresh(tmp_path)
    st.close()


def test_recovery_keeps_seq_order_per_queue_minus_removed(tmp_path: Path) -> None:
    st, e = fresh(tmp_path)
    for q in ("a", "b"):
        st.save_queue(QueueDef(q))
    for i in range(0, 30, 3):  # interleave queues and commits
        publish(st, "a", [(e << 40) | i, (e << 40) | (i + 1)])
        publish(st, "b", [(e << 40) | (i + 2)])
        assert commit_sync(st) is None
    for i in (0, 4, 28):
        st.remove("a", (e << 40) | i)
    st.remove("b", (e << 40) | 5)
    assert commit_sync(st) is None
    st.close()
    st = open_store(tmp_path)
    rec = st.open()
    a = low(rec, "a", 0xFFFF)
    b = low(rec, "b", 0xFFFF)
    assert (len(rec.messages["a"]), len(rec.messages["b"])) == (len(a), len(b))
    want_a = [i for k in range(0, 30, 3) for i in (k, k + 1) if i not in (0, 4, 28)]
    assert a == want_a
    assert b == [k + 2 for k in range(0, 30, 3) if k + 2 != 5]
    st.close()


def test_delivered_counts_survive_restart(tmp_path: Path) -> None:
    st, e = fresh(tmp_path)
    st.save_queue(QueueDef("q"))
    s = [(e << 40) | i for i in range(4)]
    publish(st, "q", s[:3])
    st.delivered("q", s[0], 1)           # same batch as the add: rides in the ADD record
    assert commit_sync(st) is None
    st.delivered("q", s[1], 1)
    st.delivered("q", s[1], 3)
    publish(st, "q", s[3:])
    assert commit_sync(st) is None
    fsyncs = st.stats.fsyncs
    st.delivered("q", s[2], 2)           # buffered only: no fsync of its own
    assert st.stats.fsyncs == fsyncs
    st.close()                           # close flushes it
    st = open_store(tmp_path)
    rec = st.open()
    assert [c for _, _, c in rec.messages["q"]] == [1, 3, 2, 0]
    assert [st.read_message(loc).delivery_count for _, loc, _ in rec.messages["q"]] == [1, 3, 2, 0]
    st.close()


def test_delete_queue_forgets_messages_and_redeclare_starts_empty(tmp_path: Path) -> None:
    st, e = fresh(tmp_path)
    st.save_queue(QueueDef("q"))
    publish(st, "q", [(e << 40) | 1, (e << 40) | 2])
    assert commit_sync(st) is None
    st.delete_queue("q")
    st.save_queue(QueueDef("q"))
    publish(st, "q", [(e << 40) | 3])
    assert commit_sync(st) is None
    st.close()
    st = open_store(tmp_path)
    rec = st.open()
    assert low(rec, "q") == [3]
    st.close()


def test_second_open_of_same_dir_is_refused(tmp_path: Path) -> None:
    st, _ = fresh(tmp_path)
    with pytest.raises(StoreError, match="in use"):
        open_store(tmp_path).open()
    st.close()


def test_torn_tail_of_newest_file_is_dropped_with_a_log_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    st, e = fresh(tmp_path)
    st.save_queue(QueueDef("q"))
    publish(st, "q", [(e << 40) | 1])
    assert commit_sync(st) is None
    good = st._woff  # where the second frame starts (the file itself is preallocated)
    publish(st, "q", [(e << 40) | 2, (e << 40) | 3])
    assert commit_sync(st) is None
    st.close()
    newest = seg_files(tmp_path)[-1]
    full = newest.read_bytes()
    newest.write_bytes(full[:good + (len(full) - good) // 2])  # cut the last frame in half
    with caplog.at_level(logging.WARNING, logger="ackmq.store"):
        st = open_store(tmp_path)
        rec = st.open()
    assert low(rec, "q") == [1]
    assert any("torn tail" in r.getMessage() and newest.name in r.getMessage()
               for r in caplog.records)
    publish(st, "q", [(rec.epoch << 40) | 4])
    assert commit_sync(st) is None
    st.close()
    st = open_store(tmp_path)  # the truncated file is now an older segment: still valid
    rec = st.open()
    assert low(rec, "q") == [1, 4]
    st.close()


def test_corrupt_last_frame_payload_is_a_torn_tail(tmp_path: Path) -> None:
    st, e = fresh(tmp_path)
    st.save_queue(QueueDef("q"))
    publish(st, "q", [(e << 40) | 1])
    assert commit_sync(st) is None
    publish(st, "q", [(e << 40) | 2])
    assert commit_sync(st) is None
    st.close()
    newest = seg_files(tmp_path)[-1]
    data = bytearray(newest.read_bytes())
    data[-3] ^= 0xFF
    newest.write_bytes(bytes(data))
    st = open_store(tmp_path)
    rec = st.open()
    assert low(rec, "q") == [1]
    st.close()


def test_corruption_in_the_middle_raises_CorruptStore(tmp_path: Path) -> None:
    st, e = fresh(tmp_path)
    st.save_queue(QueueDef("q"))
    for i in range(3):
        publish(st, "q", [(e << 40) | i], size=200)
        assert commit_sync(st) is None
    st.close()
    newest = seg_files(tmp_path)[-1]
    data = bytearray(newest.read_bytes())
    off = 16 + 16 + 8 + 60  # inside the first record of the first frame
    data[off] ^= 0x01
    newest.write_bytes(bytes(data))
    with pytest.raises(CorruptStore, match=rf"{newest.name}.*offset 16"):
        open_store(tmp_path).open()


def _power_loss_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[int]]:
    """Three commits into one segment: the first fdatasynced, the next two written while
    the second one's fdatasync hangs (a power cut then). Returns a copy of the data dir
    as the page cache held it, and the frames' start offsets."""
    live = tmp_path / "live"
    st, e = fresh(live)
    st.save_queue(QueueDef("q"))
    starts = []
    publish(st, "q", [(e << 40) | 1])
    starts.append(st._woff)
    assert commit_sync(st) is None
    held, cut = hold_sync_thread(monkeypatch)
    for seq in (2, 3):
        publish(st, "q", [(e << 40) | seq])
        starts.append(st._woff)
        st.commit(lambda exc: None)
        assert held.wait(10)
    image = tmp_path / "image"
    image.mkdir()
    for f in live.iterdir():
        if f.is_file() and f.name != "LOCK":
            (image / f.name).write_bytes(f.read_bytes())
    cut.set()
    st.close()
    return image, starts


def test_P9_power_loss_torn_frame_followed_by_unsynced_frames_is_a_torn_tail(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    image, (_, second, third) = _power_loss_image(tmp_path, monkeypatch)
    newest = seg_files(image)[-1]
    data = bytearray(newest.read_bytes())
    data[second:third] = bytes(third - second)  # its page never reached the disk
    newest.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="ackmq.store"):
        st = open_store(image)
        rec = st.open()  # not CorruptStore: the third frame was never reported durable
    assert low(rec, "q") == [1]
    assert f"dropped torn tail at offset {second}" in caplog.text
    st.close()


def test_P9_power_loss_damage_in_a_frame_a_later_frame_says_was_synced_is_corruption(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    image, (first, second, _) = _power_loss_image(tmp_path, monkeypatch)
    newest = seg_files(image)[-1]
    data = bytearray(newest.read_bytes())
    data[first + 40] ^= 0x01  # the fdatasynced frame: the next one says so
    newest.write_bytes(bytes(data))
    with pytest.raises(CorruptStore, match=rf"offset {first} .*offset {second} says it had been fdatasynced"):
        open_store(image).open()


def test_damaged_older_segment_raises_CorruptStore(tmp_path: Path) -> None:
    st, e = fresh(tmp_path)
    st.save_queue(QueueDef("q"))
    publish(st, "q", [(e << 40) | 1])
    assert commit_sync(st) is None
    st.close()
    st, e = fresh(tmp_path)  # opens a new segment: the first one is now "older"
    publish(st, "q", [(e << 40) | 1])
    assert commit_sync(st) is None
    st.close()
    older = seg_files(tmp_path)[0]
    older.write_bytes(older.read_bytes()[:-5])  # a torn tail is NOT fine in an older file
    with pytest.raises(CorruptStore, match=older.name):
        open_store(tmp_path).open()


def test_missing_defs_with_segments_raises_CorruptStore(tmp_path: Path) -> None:
    st, e = fresh(tmp_path)
    st.save_queue(QueueDef("q"))
    publish(st, "q", [(e << 40) | 1])
    assert commit_sync(st) is None
    st.close()
    (tmp_path / "defs.log").unlink()
    with pytest.raises(CorruptStore, match="defs.log"):
        open_store(tmp_path).open()


def test_read_body_and_read_message_detect_corruption(tmp_path: Path) -> None:
    st, e = fresh(tmp_path)
    st.save_queue(QueueDef("q"))
    loc1 = publish(st, "q", [(e << 40) | 1], size=400)[0]
    loc2 = publish(st, "q", [(e << 40) | 2], size=400)[0]
    assert commit_sync(st) is None
    seg = seg_files(tmp_path)[-1]
    with open(seg, "r+b") as f:  # inside the second body (the file is preallocated)
        f.seek(st._woff - 100)
        f.write(b"X")
    assert st.read_body(loc1) == body_of((e << 40) | 1, 400)
    with pytest.raises(CorruptStore, match=seg.name):
        st.read_body(loc2)
    assert st.read_message(loc1).body == body_of((e << 40) | 1, 400)
    with pytest.raises(CorruptStore, match=seg.name):
        st.read_message(loc2)
    st.close()


def test_read_ahead_never_serves_bytes_written_after_it(tmp_path: Path) -> None:
    """A read of the active segment buffers READ_AHEAD bytes: past the data end those
    are the preallocated zeros. A message appended later into that range must be read
    from the file, not from the stale buffer (it was: "bad record at offset N" for a
    delayed message paged and read back while newer ones were appended, seen as
    test_L3_paged_messages_fire_in_due_order_never_early failing one run in three)."""
    st, e = fresh(tmp_path)
    st.save_queue(QueueDef("q"))
    first = publish(st, "q", [(e << 40) | 1])
    assert commit_sync(st) is None
    assert st.read_body(first[0]) == body_of((e << 40) | 1)  # read-ahead of the tail
    later = publish(st, "q", [(e << 40) | 2, (e << 40) | 3])
    assert commit_sync(st) is None
    assert [st.read_message(loc).body for loc in later] == [body_of((e << 40) | 2),
                                                            body_of((e << 40) | 3)]
    assert st.read_body(later[1]) == body_of((e << 40) | 3)
    st.close()


def test_read_message_in_file_order_and_after_compaction(tmp_path: Path) -> None:
    st, e = fresh(tmp_path, segment_bytes=64 << 10, auto_compact=False)
    st.save_queue(QueueDef("q"))
    seqs = [(e << 40) | i for i in range(300)]
    for i in range(0, 300, 30):
        publish(st, "q", seqs[i:i + 30], size=1000)
        assert commit_sync(st) is None
    st.close()
    st = open_store(tmp_path, segment_bytes=64 << 10, auto_compact=False)
    msgs = list(st.open().messages["q"])
    assert [st.read_message(loc).body for _, loc, _ in msgs] == [body_of(s, 1000) for s in seqs]
    for s in seqs[1:250]:
        st.remove("q", s)
    assert commit_sync(st) is None
    publish(st, "q", [(e << 40) | 999], size=1000)
    assert commit_sync(st) is None
    live = [msgs[0]] + msgs[250:]
    qid = st._qids["q"]
    last = max(live, key=lambda m: st._index[qid].get(m[0]) >> 32)
    st.read_body(last[1])  # read-ahead now holds segment K, which compaction replaces
    assert compact_mod.maybe_compact(st)
    assert [st.read_message(loc).body for _, loc, _ in live] == [body_of(s, 1000)
                                                                 for s, _, _ in live]
    assert [st.read_body(loc) for _, loc, _ in live] == [body_of(s, 1000) for s, _, _ in live]
    st.close()


def test_compaction_checks_liveness_in_chunks_the_broker_can_get_between(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compaction asks which ADDs are live under the store's lock, which the broker
    thread's add/remove need too: never a whole segment's records in one hold."""
    st, e = fresh(tmp_path, segment_bytes=256 << 10, auto_compact=False)
    st.save_queue(QueueDef("q"))
    seqs = [(e << 40) | i for i in range(3000)]
    for i in range(0, 3000, 500):
        publish(st, "q", seqs[i:i + 500], size=100)
        assert commit_sync(st) is None
    for s in seqs[:2900]:
        st.remove("q", s)
    assert commit_sync(st) is None
    sizes: list[int] = []
    real = st.live_adds
    monkeypatch.setattr(st, "live_adds", lambda cands: (sizes.append(len(cands)), real(cands))[1])
    assert compact_mod.maybe_compact(st)
    assert sum(sizes) > compact_mod.LIVE_CHUNK and max(sizes) <= compact_mod.LIVE_CHUNK
    st.close()
    st = open_store(tmp_path)
    assert low(st.open(), "q", 0xFFFF) == list(range(2900, 3000))
    st.close()


def test_P8_group_commit_merges_commits_made_during_an_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st, e = fresh(tmp_path)
    st.save_queue(QueueDef("q"))
    in_fsync, release = hold_sync_thread(monkeypatch)
    fired: list[BaseException | None] = []
    all_done = threading.Event()

    def cb(exc: BaseException | None) -> None:
        fired.append(exc)
        if len(fired) == 101:
            all_done.set()

    publish(st, "q", [(e << 40)])
    st.commit(cb)
    assert in_fsync.wait(10)
    for i in range(1, 101):            # 100 commits while the first fsync runs
        publish(st, "q", [(e << 40) | i])
        st.commit(cb)
    assert len(fired) == 0             # nothing is reported before its fsync
    release.set()
    assert all_done.wait(10)
    assert fired == [None] * 101
    assert st.stats.commits == 101
    # each commit is written at once (kill -9 loses none), the 100 shared one fsync
    assert st.stats.writes == 101 and st.stats.fsyncs == 2
    st.close()


def test_P8_lone_commit_is_flushed_without_waiting_for_more(tmp_path: Path) -> None:
    st, e = fresh(tmp_path)
    st.save_queue(QueueDef("q"))
    publish(st, "q", [(e << 40) | 1])
    assert commit_sync(st) is None  # no timer, no second commit needed
    assert st.stats.fsyncs == 1
    st.close()


def wait_for(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def test_P8_a_batch_no_one_waits_on_is_written_now_and_synced_lazily(tmp_path: Path) -> None:
    """`write()` (acks, delivery marks: no confirm waits on them) writes at once — a
    kill -9 keeps it — and leaves the fdatasync to the next commit or to the sync thread
    LAZY_SYNC_S later, so an ack's fsync never runs in front of a publish's."""
    from ackmq.store.writer import LAZY_SYNC_S

    st, e = fresh(tmp_path / "live")
    st.save_queue(QueueDef("q"))
    publish(st, "q", [(e << 40) | s for s in (1, 2, 3)])
    assert commit_sync(st) is None
    fsyncs = st.stats.fsyncs
    st.remove("q", (e << 40) | 1)
    st.delivered("q", (e << 40) | 2, 1)
    t0 = time.monotonic()
    assert st.write() is None
    synced_at_once = st.stats.fsyncs != fsyncs
    if time.monotonic() - t0 < LAZY_SYNC_S / 2:  # (a stalled test machine proves nothing)
        assert not synced_at_once
    copy = open_store(_copy_dir(tmp_path / "live", tmp_path / "killed"))
    got = {seq & 0xFF: count for seq, _loc, count in copy.open().messages["q"]}
    copy.close()
    assert got == {2: 1, 3: 0}  # in the OS: kill -9 loses neither the ack nor the mark
    assert wait_for(lambda: st.stats.lazy_syncs == 1)  # the thread's, after LAZY_SYNC_S
    assert time.monotonic() - t0 >= LAZY_SYNC_S * 0.9
    assert st.stats.fsyncs == fsyncs + 1 and st.stats.lazy_writes == 1
    # a commit's fdatasync covers a lazy write made before it: no second one
    st.remove("q", (e << 40) | 2)
    assert st.write() is None
    publish(st, "q", [(e << 40) | 4])
    assert commit_sync(st) is None
    time.sleep(LAZY_SYNC_S * 3)
    assert st.stats.fsyncs == fsyncs + 2 and st.stats.lazy_syncs == 1
    st.close()
    rec = open_store(tmp_path / "live")
    assert low(rec.open(), "q") == [3, 4]
    rec.close()


def test_P8_a_lazy_write_is_synced_by_the_next_round_without_a_sync_thread(
        tmp_path: Path) -> None:
    """With no sync thread (the crash simulator drives the rounds), a round with no
    commit queued syncs what was written lazily (the thread's timer, in one step)."""
    st, e = fresh(tmp_path / "fsync", sync_thread=False)
    st.save_queue(QueueDef("q"))
    publish(st, "q", [(e << 40) | 1])
    st.commit(lambda exc: None)
    st.sync_round()
    fsyncs = st.stats.fsyncs
    st.remove("q", (e << 40) | 1)
    assert st.write() is None and st.stats.fsyncs == fsyncs
    st.sync_round()
    assert st.stats.fsyncs == fsyncs + 1 and st.stats.lazy_syncs == 1
    st.sync_round()  # nothing new: no fdatasync
    assert st.stats.fsyncs == fsyncs + 1
    st.close()
    # --no-fsync: a round syncs nothing (the simulator's power cut keeps it unsynced)
    nf, e = fresh(tmp_path / "nofsync", fsync=False, sync_thread=False)
    nf.save_queue(QueueDef("q"))
    publish(nf, "q", [(e << 40) | 1])
    nf.commit(lambda exc: None)
    nf.remove("q", (e << 40) | 1)
    assert nf.write() is None
    nf.sync_round()
    assert nf.stats.fsyncs == 0 and nf.stats.lazy_syncs == 0
    nf.close()


def test_callbacks_go_through_call_soon_threadsafe(tmp_path: Path) -> None:
    calls: list[tuple] = []
    st, e = fresh(tmp_path, call_soon_threadsafe=lambda f, *a: calls.append((f, a)) or f(*a))
    st.save_queue(QueueDef("q"))
    publish(st, "q", [(e << 40) | 1])
    assert commit_sync(st) is None  # the callback got None: synced
    assert len(calls) == 1  # one hand-over to the broker's thread per fdatasync
    st.close()


def test_no_fsync_mode_skips_fsync_but_keeps_data(tmp_path: Path) -> None:
    st, e = fresh(tmp_path, fsync=False)
    st.save_queue(QueueDef("q"))
    publish(st, "q", [(e << 40) | 1])
    assert commit_sync(st) is None
    assert st.stats.fsyncs == 0 and st.stats.writes == 1
    st.close()
    st = open_store(tmp_path)
    assert low(st.open(), "q") == [1]
    st.close()


def test_removal_of_an_in_flight_add_and_read_body_of_unwritten(tmp_path: Path) -> None:
    st, e = fresh(tmp_path)
    st.save_queue(QueueDef("q"))
    locs = publish(st, "q", [(e << 40) | 1, (e << 40) | 2])
    assert st.read_body(locs[0]) == body_of((e << 40) | 1)  # served from memory
    done = threading.Event()
    st.commit(lambda exc: done.set())
    st.remove("q", (e << 40) | 1)  # add may be in flight: a REMOVE record is written
    assert done.wait(10)
    assert commit_sync(st) is None
    with pytest.raises(StoreError):
        st.read_body(locs[0])
    st.close()
    st = open_store(tmp_path)
    assert low(st.open(), "q") == [2]
    st.close()


def _fill(st: SegmentStore, e: int, start: int, n: int, keep: set[int]) -> None:
    for i in range(start, start + n):
        publish(st, "q", [(e << 40) | i], size=1000)
        if i % 10 == 9:
            assert commit_sync(st) is None
            for j in range(i - 9, i + 1):
                if j not in keep:
                    st.remove("q", (e << 40) | j)
    assert commit_sync(st) is None


def test_space_is_reclaimed_and_a_long_lived_message_pins_nothing(tmp_path: Path) -> None:
    st, e = fresh(tmp_path, segment_bytes=64 << 10, auto_compact=False)
    st.save_queue(QueueDef("q"))
    long_lived = (e << 40) | 0
    _fill(st, e, 0, 400, keep={0})
    st.delivered("q", long_lived, 2)
    _fill(st, e, 400, 400, keep=set())
    files_before = len(seg_files(tmp_path))
    assert files_before >= 8
    assert compact_mod.maybe_compact(st)
    loc = (st._qids["q"] << 64) | long_lived
    assert st.read_body(loc) == body_of(long_lived, 1000)  # location survives the move
    _fill(st, e, 800, 400, keep=set())
    while compact_mod.maybe_compact(st):
        pass
    assert st.read_body(loc) == body_of(long_lived, 1000)
    assert st.stats.compactions >= 2
    assert len(seg_files(tmp_path)) <= 3
    assert not list(tmp_path.glob("*.compact*"))
    st.close()
    st = open_store(tmp_path)
    rec = st.open()
    assert list(rec.messages["q"]) == [(long_lived, loc, 2)]
    assert st.read_message(loc).delivery_count == 2
    st.close()


def test_background_compaction_deletes_dead_segments(tmp_path: Path) -> None:
    st, e = fresh(tmp_path, segment_bytes=32 << 10, compact_interval=0.05)
    st.save_queue(QueueDef("q"))
    _fill(st, e, 0, 600, keep={5})
    deadline = time.monotonic() + 20
    while len(seg_files(tmp_path)) > 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(seg_files(tmp_path)) <= 3
    st.close()
    st = open_store(tmp_path)
    assert low(st.open(), "q", 0xFFFF) == [5]
    st.close()


def test_crash_inside_compaction_after_commit_point_recovers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st, e = fresh(tmp_path, segment_bytes=32 << 10, auto_compact=False)
    st.save_queue(QueueDef("q"))
    _fill(st, e, 0, 200, keep={3, 150})

    def crash(*a, **k):
        raise RuntimeError("simulated crash after the commit point")

    monkeypatch.setattr(st, "replace_prefix", crash)  # the step after the commit point
    with pytest.raises(RuntimeError):
        compact_mod.maybe_compact(st)
    assert list(tmp_path.glob("*.compact"))
    monkeypatch.undo()
    st.close()
    st = open_store(tmp_path)
    rec = st.open()
    assert low(rec, "q", 0xFFFF) == [3, 150]
    assert not list(tmp_path.glob("*.compact"))
    st.close()


def test_index_overhead_is_small(tmp_path: Path) -> None:
    st, e = fresh(tmp_path, fsync=False)
    st.save_queue(QueueDef("q"))
    n = 20000
    for i in range(n):
        st.add("q", (e << 40) | i, "ex", "rk", PROPS, b"x")
    assert commit_sync(st) is None
    assert st.index_bytes() / n <= 24  # two uint64 arrays (+ growth slack)
    st.close()


def test_open_keeps_no_per_message_objects(tmp_path: Path) -> None:
    """open() of 20,000 x 1 KiB (20 MiB on disk) allocates about the index, not bodies
    (20 MiB) nor an object per message (~300 bytes each = 6 MB)."""
    st, e = fresh(tmp_path, fsync=False)
    st.save_queue(QueueDef("q"))
    n = 20000
    for i in range(n):
        st.add("q", (e << 40) | i, "ex", f"rk{i}", PROPS + i.to_bytes(4, "little"), b"x" * 1024)
        if i % 100 == 99:
            st.delivered("q", (e << 40) | i, 1)
    assert commit_sync(st) is None
    st.close()
    st = open_store(tmp_path, auto_compact=False)
    tracemalloc.start()
    try:
        rec = st.open()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(rec.messages["q"]) == n
    assert peak < 1_500_000, f"open() peaked at {peak} bytes for {n} messages"
    got = list(rec.messages["q"])
    assert [s & 0xFFFF for s, _, _ in got] == list(range(n))
    assert sum(c for _, _, c in got) == n // 100
    m = st.read_message(got[4321][1])
    assert (m.routing_key, m.properties) == ("rk4321", PROPS + (4321).to_bytes(4, "little"))
    st.close()


def test_recovered_queue_iterates_lazily_while_the_store_is_used(tmp_path: Path) -> None:
    st, e = fresh(tmp_path, fsync=False)
    st.save_queue(QueueDef("q"))
    n = 3 * 4096 + 10  # several chunks
    for i in range(n):
        st.add("q", (e << 40) | i, "ex", "rk", PROPS, b"x")
    assert commit_sync(st) is None
    st.close()
    st = open_store(tmp_path, auto_compact=False)
    rec = st.open()
    q = rec.messages["q"]
    it = iter(q)
    first = [next(it) for _ in range(100)]
    for s, _, _ in first:  # the broker consumes what it read...
        st.remove("q", s)
    for i in range(5000, 12000):  # ...and acks ahead: the index arrays are shrunk
        st.remove("q", (e << 40) | i)
    e2 = rec.epoch
    st.add("q", (e2 << 40) | 1, "ex", "rk", PROPS, b"new")  # added after open: not yielded
    assert commit_sync(st) is None
    rest = [s & 0xFFFF for s, _, _ in it]
    assert rest == [i for i in range(100, n) if not 5000 <= i < 12000]
    assert len(q) == n  # what open() found
    assert [s & 0xFFFF for s, _, _ in q] == rest  # a second pass sees the live index
    st.close()


def test_adds_out_of_seq_order_are_recovered_in_seq_order(tmp_path: Path) -> None:
    st, e = fresh(tmp_path)
    st.save_queue(QueueDef("q"))
    for i in (5, 9, 3, 7, 1):
        publish(st, "q", [(e << 40) | i])
        assert commit_sync(st) is None
    st.delivered("q", (e << 40) | 3, 4)
    st.remove("q", (e << 40) | 9)
    assert commit_sync(st) is None
    st.close()
    st = open_store(tmp_path)
    rec = st.open()
    assert [(s & 0xFF, c) for s, _, c in rec.messages["q"]] == [(1, 0), (3, 4), (5, 0), (7, 0)]
    assert [st.read_message(loc).body for _, loc, _ in rec.messages["q"]] == [
        body_of((e << 40) | i) for i in (1, 3, 5, 7)]
    st.close()


def test_P8_inline_commit_is_synced_before_commit_returns(tmp_path: Path) -> None:
    """A lone waiter (commit(inline=True), sync thread idle): fdatasync on the caller's
    thread, callback before commit() returns, no hand-over through the loop."""
    calls: list[tuple] = []
    st, e = fresh(tmp_path, call_soon_threadsafe=lambda f, *a: calls.append((f, a)) or f(*a))
    st.save_queue(QueueDef("q"))
    publish(st, "q", [(e << 40) | 1])
    fired: list[tuple[str, BaseException | None]] = []
    st.commit(lambda exc: fired.append((threading.current_thread().name, exc)), inline=True)
    assert fired == [(threading.current_thread().name, None)]
    assert st.stats.fsyncs == 1 and st.stats.inline_syncs == 1 and calls == []
    st.close()
    st = open_store(tmp_path)
    assert low(st.open(), "q") == [1]
    st.close()


def test_P8_inline_commit_queues_behind_the_sync_thread_in_commit_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the sync thread holds a batch (syncing, or its callbacks not run yet), an
    inline commit joins its group commit: callbacks still run in commit order."""
    st, e = fresh(tmp_path)
    st.save_queue(QueueDef("q"))
    in_fsync, release = hold_sync_thread(monkeypatch)
    fired: list[int] = []
    done = threading.Event()
    publish(st, "q", [(e << 40) | 1])
    st.commit(lambda exc: fired.append(1))
    assert in_fsync.wait(10)
    publish(st, "q", [(e << 40) | 2])
    st.commit(lambda exc: (fired.append(2), done.set()), inline=True)
    assert fired == [] and st.stats.inline_syncs == 0  # not synced ahead of batch 1
    release.set()
    assert done.wait(10)
    assert fired == [1, 2]
    publish(st, "q", [(e << 40) | 3])
    st.commit(lambda exc: fired.append(3), inline=True)  # the thread is idle again
    assert fired == [1, 2, 3] and st.stats.inline_syncs == 1
    st.close()


def test_P6_inline_commit_reports_a_failed_fdatasync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st, e = fresh(tmp_path)
    st.save_queue(QueueDef("q"))

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", eio)
    publish(st, "q", [(e << 40) | 1])
    fired: list[BaseException | None] = []
    st.commit(fired.append, inline=True)
    assert len(fired) == 1 and isinstance(fired[0], StoreError)
    assert "fdatasync failed" in str(fired[0])
    publish(st, "q", [(e << 40) | 2])
    st.commit(fired.append, inline=True)  # disabled from then on (nothing claims durability)
    assert isinstance(fired[1], StoreError)
    st.close()


def test_P8_broker_syncs_a_lone_waiter_inline_and_many_through_group_commit(
        tmp_path: Path) -> None:
    """The broker asks for an inline sync only when few publishes wait on the commit and
    few did lately: one waiter is confirmed within its own turn; more, or a lone one
    among crowded commits, share the sync thread's fsync."""
    from ackmq.broker import BrokerModel, NullScheduler
    store = open_store(tmp_path / "data")
    b = BrokerModel(NullScheduler(), store=store)
    b.start()
    vh = b.vhosts["/"]
    vh.declare_queue("q", False, True, False, False, {}, None)
    fired: list[BaseException | None] = []
    all_fired = threading.Event()

    def waiter(exc: BaseException | None) -> None:
        fired.append(exc)
        if len(fired) == 1 + 20:
            all_fired.set()

    b.await_commit_callback(waiter)
    b.end_of_turn()
    assert fired == [None] and store.stats.inline_syncs == 1  # within the turn
    for _ in range(20):  # a crowded commit (20 > INLINE_SYNC_WAITERS)
        b.await_commit_callback(waiter)
    b.end_of_turn()
    assert all_fired.wait(10) and fired == [None] * 21
    assert store.stats.inline_syncs == 1  # the second turn went through the sync thread
    # right after a crowded commit a lone waiter still shares the thread's group commit
    # (many publishers: an inline fsync would stall the loop between their batches)
    lone = threading.Event()
    b.await_commit_callback(lambda exc: lone.set())
    b.end_of_turn()
    assert lone.wait(10) and store.stats.inline_syncs == 1
    for _ in range(10):  # quiet again: lone waiters are synced inline once more
        b.await_commit_callback(lambda exc: None)
        b.end_of_turn()
        deadline = time.monotonic() + 10
        while store._in_thread and time.monotonic() < deadline:
            time.sleep(0.001)
    assert store.stats.inline_syncs > 1
    b.close()


def test_P8_broker_writes_a_turn_no_one_waits_on_without_a_commit(tmp_path: Path) -> None:
    """A turn that only acked or delivered (no confirm, tx.commit or receipt waits)
    writes its records (`write()`) and asks for no fdatasync; a turn with a waiter
    commits as before."""
    from ackmq.broker import BrokerModel, NullScheduler
    store = open_store(tmp_path / "data")
    b = BrokerModel(NullScheduler(), store=store)
    b.start()
    b.vhosts["/"].declare_queue("q", False, True, False, False, {}, None)
    store.add("q", 1, "", "q", PROPS, b"x")
    fired: list[BaseException | None] = []
    b.await_commit_callback(fired.append)
    b.end_of_turn()
    assert wait_for(lambda: fired == [None])
    commits, fsyncs = store.stats.commits, store.stats.fsyncs
    store.remove("q", 1)  # an ack's turn
    b.end_of_turn()
    assert store.stats.lazy_writes == 1 and store.stats.commits == commits
    assert not store.pending and store.stats.writes >= 2
    b.close()  # close syncs what was written lazily
    assert store.stats.fsyncs == fsyncs + 1


def test_P8_an_inline_sync_sends_the_turns_output_before_its_fdatasync(tmp_path: Path) -> None:
    """A commit synced inline (a lone waiter) calls the broker's hook after its write and
    before its fdatasync: the turn's deliveries go out then and do not wait for an fsync
    only the confirm needs (at 500 messages a second, deliver p50 0.25 vs 0.52 ms)."""
    from ackmq.broker import BrokerModel

    store = open_store(tmp_path / "data")

    class Sched:
        def __init__(self) -> None:
            self.at_send: list[tuple[int, int]] = []  # (writes, fsyncs) when called

        def request_flush(self) -> None:
            pass

        def send_output(self) -> None:
            self.at_send.append((store.stats.writes, store.stats.fsyncs))

    sched = Sched()
    b = BrokerModel(sched, store=store)
    b.start()
    b.vhosts["/"].declare_queue("q", False, True, False, False, {}, None)
    fired: list[int] = []
    writes, fsyncs = store.stats.writes, store.stats.fsyncs
    store.add("q", 1, "", "q", PROPS, b"x" * 100)
    b.await_commit_callback(lambda exc: fired.append(store.stats.fsyncs))
    b.end_of_turn()
    assert store.stats.inline_syncs == 1
    assert sched.at_send == [(writes + 1, fsyncs)]  # written, not yet synced
    assert fired == [fsyncs + 1]
    for _ in range(20):  # a crowded commit goes to the sync thread: no hook
        b.await_commit_callback(lambda exc: fired.append(store.stats.fsyncs))
    store.add("q", 2, "", "q", PROPS, b"x" * 100)
    b.end_of_turn()
    assert wait_for(lambda: len(fired) == 21)
    assert len(sched.at_send) == 1
    b.close()


def _copy_dir(src: Path, dst: Path) -> Path:
    """The data dir as a crash leaves it (the store still open: nothing cut back)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.is_file() and f.name != "LOCK":
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_P9_preallocated_space_is_cut_at_close_and_dropped_quietly_after_a_crash(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Commits write into space fallocated ahead (a data-only fdatasync). A clean close
    cuts the file back to its last frame; after a crash recovery drops the zeros without
    calling them a torn tail, and keeps every committed message."""
    from ackmq.store.segments import PREALLOC_CHUNK
    live = tmp_path / "live"
    st, e = fresh(live)
    st.save_queue(QueueDef("q"))
    for i in range(1, 4):
        publish(st, "q", [(e << 40) | i])
        assert commit_sync(st) is None
    newest = seg_files(live)[-1]
    assert newest.stat().st_size >= PREALLOC_CHUNK > st._woff
    assert st.stats.preallocated > 0
    crashed = _copy_dir(live, tmp_path / "crashed")
    data_end, file_end = st._woff, newest.stat().st_size
    st.close()
    assert newest.stat().st_size == data_end  # cut back at close
    with caplog.at_level(logging.INFO, logger="ackmq.store"):
        st = open_store(crashed)
        rec = st.open()
    assert low(rec, "q") == [1, 2, 3]
    assert "torn tail" not in caplog.text
    assert f"cut {file_end - data_end} bytes of preallocated space" in caplog.text
    assert seg_files(crashed)[0].stat().st_size == data_end
    st.close()


def test_P9_torn_frame_before_preallocated_space_is_still_a_torn_tail(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    live = tmp_path / "live"
    st, e = fresh(live)
    st.save_queue(QueueDef("q"))
    publish(st, "q", [(e << 40) | 1])
    assert commit_sync(st) is None
    second = st._woff
    publish(st, "q", [(e << 40) | 2])
    assert commit_sync(st) is None
    crashed = _copy_dir(live, tmp_path / "crashed")
    end = st._woff
    st.close()
    newest = seg_files(crashed)[-1]
    data = bytearray(newest.read_bytes())
    data[(second + end) // 2:end] = bytes(end - (second + end) // 2)  # half of it lost
    newest.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="ackmq.store"):
        st = open_store(crashed)
        rec = st.open()
    assert low(rec, "q") == [1]
    assert f"dropped torn tail at offset {second}" in caplog.text
    st.close()


def test_P9_older_segments_end_with_their_last_frame(tmp_path: Path) -> None:
    """Rollover cuts the preallocated space off before the next segment starts: only
    the newest file may ever hold anything but frames (recovery relies on it)."""
    st, e = fresh(tmp_path, segment_bytes=64 << 10, auto_compact=False)
    st.save_queue(QueueDef("q"))
    for i in range(1, 41):
        publish(st, "q", [(e << 40) | i], size=4000)
        assert commit_sync(st) is None
    files = seg_files(tmp_path)
    assert len(files) >= 3
    for f in files[:-1]:  # each older file: a valid frame sequence up to its very end
        data = f.read_bytes()
        assert valid_length(data, str(f), int(f.name.split(".")[0]), False) == len(data)
    st.close()
    st = open_store(tmp_path)
    assert low(st.open(), "q") == list(range(1, 41))
    st.close()
