"""store/kvlog.py, the durable key-value log under MQTT's retained messages and QoS 2
packet ids (N3, N5): what was put and synced comes back; a torn tail (a crash mid-append)
is dropped, not an error; the log is rewritten compactly."""

from __future__ import annotations

from pathlib import Path

from ackmq.store.kvlog import KVLog, read_records


def test_N5_puts_and_deletes_come_back(tmp_path: Path) -> None:
    kv = KVLog(tmp_path, "t")
    kv.put(b"a", b"1")
    kv.put(b"b", b"2")
    kv.put(b"a", b"3")
    kv.delete(b"b")
    kv.sync()
    kv.close()
    assert KVLog(tmp_path, "t").items == {b"a": b"3"}


def test_N5_a_torn_tail_is_dropped(tmp_path: Path) -> None:
    kv = KVLog(tmp_path, "t")
    kv.put(b"kept", b"x" * 100)
    kv.put(b"torn", b"y" * 100)
    kv.close()
    path = tmp_path / "t.log"
    data = path.read_bytes()
    path.write_bytes(data[:-7])  # the last record cut short
    assert KVLog(tmp_path, "t").items == {b"kept": b"x" * 100}
    # a flipped byte in a record ends the log there, too (its CRC)
    bad = bytearray(data)
    bad[20] ^= 0xFF
    assert read_records(bytes(bad)) == {}


def test_N5_the_log_is_compacted(tmp_path: Path) -> None:
    kv = KVLog(tmp_path, "t")
    for i in range(5000):
        kv.put(b"same", b"%d" % i)
    kv.close()
    assert (tmp_path / "t.log").stat().st_size < 100_000
    assert KVLog(tmp_path, "t").items == {b"same": b"4999"}
