"""The stream log on real files (store/streamlog.py, R1/R3): seeks across segments,
timestamps, a torn tail after a crash, index files, retention by size and by age."""

from __future__ import annotations

import time
from pathlib import Path

from ackmq.store.streamlog import (
    BODY,
    EXCHANGE,
    OFFSET,
    PROPERTIES,
    ROUTING_KEY,
    StreamLog,
    StreamStore,
)

PROPS = b"\x10\x00\x02"


def fill(lg: StreamLog, n: int, start: int = 0, size: int = 100) -> None:
    for i in range(start, start + n):
        assert lg.append("amq.direct", "rk", PROPS, str(i).encode().ljust(size, b".")) == i
    lg.flush()
    lg.sync()


def bodies(lg: StreamLog, offset: int, limit: int) -> list[int]:
    out: list[int] = []
    while len(out) < limit:
        recs = lg.read(offset, limit - len(out))
        if not recs:
            break
        out += [int(r[BODY].rstrip(b".")) for r in recs]
        offset = recs[-1][OFFSET] + 1
    return out


def test_R3_seek_any_offset_across_segments(tmp_path: Path) -> None:
    lg = StreamLog(tmp_path / "s", segment_bytes=5000)
    fill(lg, 1000)
    assert len(list((tmp_path / "s").glob("*.seg"))) > 10
    for off in (0, 1, 63, 64, 65, 500, 998, 999):
        assert bodies(lg, off, 3) == list(range(off, min(off + 3, 1000)))
    assert lg.read(1000, 5) == []
    r = lg.read(7, 1)[0]
    assert (r[OFFSET], r[EXCHANGE], r[ROUTING_KEY], r[PROPERTIES]) == (7, "amq.direct", "rk",
                                                                      PROPS)
    # unwritten records read back too, in order after the written ones
    for i in range(1000, 1010):
        lg.append("", "q", PROPS, str(i).encode())
    assert bodies(lg, 995, 15) == list(range(995, 1010))


def test_R2_timestamp_seek(tmp_path: Path) -> None:
    lg = StreamLog(tmp_path / "s", segment_bytes=3000)
    fill(lg, 200)
    time.sleep(0.05)
    mid = int(time.time() * 1000)
    time.sleep(0.05)
    fill(lg, 100, start=200)
    assert lg.offset_for_timestamp(0) == 0
    assert lg.offset_for_timestamp(mid) == 200
    assert lg.offset_for_timestamp(int(time.time() * 1000) + 60_000) == 300


def test_R1_torn_tail_truncated_and_appends_go_on(tmp_path: Path) -> None:
    lg = StreamLog(tmp_path / "s", segment_bytes=4000)
    fill(lg, 300)
    lg.close()
    newest = sorted((tmp_path / "s").glob("*.seg"))[-1]
    size = newest.stat().st_size
    with open(newest, "ab") as f:  # half a record, as a crash mid-write leaves it
        f.write(b"\x40\x00\x00\x00\x12\x34")
    lg = StreamLog(tmp_path / "s", segment_bytes=4000)
    assert newest.stat().st_size == size
    assert (lg.first_offset, lg.next_offset) == (0, 300)
    fill(lg, 5, start=300)
    assert bodies(lg, 290, 20) == list(range(290, 305))


def test_R1_index_files_used_and_checked(tmp_path: Path) -> None:
    lg = StreamLog(tmp_path / "s", segment_bytes=4000)
    fill(lg, 300)
    lg.close()
    idx = sorted((tmp_path / "s").glob("*.idx"))
    assert len(idx) == len(list((tmp_path / "s").glob("*.seg"))) - 1  # not the newest
    idx[0].write_bytes(idx[0].read_bytes()[:-1] + b"\x00")  # damaged: rescanned instead
    lg = StreamLog(tmp_path / "s", segment_bytes=4000)
    assert bodies(lg, 0, 300) == list(range(300))


def test_R1_retention_by_size_drops_whole_oldest_segments(tmp_path: Path) -> None:
    lg = StreamLog(tmp_path / "s", segment_bytes=2000, max_bytes=6000)
    fill(lg, 400)
    assert lg.bytes <= 6000 + 2000
    first = lg.first_offset
    assert first > 0 and lg.next_offset == 400
    assert bodies(lg, 0, 1000) == list(range(first, 400))  # below first: from first
    names = sorted(p.name for p in (tmp_path / "s").iterdir() if p.suffix == ".seg")
    assert names[0] == f"{first:020d}.seg"


def test_R1_retention_by_age(tmp_path: Path) -> None:
    lg = StreamLog(tmp_path / "s", segment_bytes=2000, max_age_ms=1000)
    fill(lg, 60)
    time.sleep(1.5)
    fill(lg, 60, start=60)  # rolls: segments whose newest record is older than 1 s go
    assert 0 < lg.first_offset <= 60  # whole segments: the one holding 59 and 60 stays


def test_stream_store_commit_and_remove(tmp_path: Path) -> None:
    st = StreamStore(tmp_path)
    lg = st.open("/", "events", True, 0, None, None)
    lg.append("", "events", PROPS, b"x")
    st.appended("/", "events", lg)
    assert st.pending
    done: list[object] = []
    st.commit(done.append)
    assert done == [None] and not st.pending
    st.close()
    again = StreamStore(tmp_path).open("/", "events", False, 0, None, None)
    assert again.next_offset == 1
    st2 = StreamStore(tmp_path)
    assert st2.open("/", "events", True, 0, None, None).next_offset == 0  # fresh: wiped
    st2.remove("/", "events")
    assert not any(tmp_path.iterdir())


def test_P6_failed_write_leaves_the_log_consistent(tmp_path: Path) -> None:
    """A write that fails (here: the descriptor refuses writes, EBADF) raises, cuts
    nothing written into the index, and the next appends reuse the lost offsets."""
    import os

    import pytest

    lg = StreamLog(tmp_path / "s", segment_bytes=1 << 20)
    fill(lg, 10)
    good = lg._wfd
    lg._wfd = os.open(lg.segments[-1].path, os.O_RDONLY)
    for i in range(10, 15):
        lg.append("", "q", PROPS, str(i).encode())
    with pytest.raises(OSError):
        lg.flush()
    os.close(lg._wfd)
    lg._wfd = good
    assert lg.next_offset == 10 and bodies(lg, 0, 20) == list(range(10))
    fill(lg, 3, start=10)
    assert bodies(lg, 0, 20) == list(range(13))
    lg.close()
    assert bodies(StreamLog(tmp_path / "s"), 0, 20) == list(range(13))


def test_R3_damaged_record_is_not_delivered(tmp_path: Path) -> None:
    lg = StreamLog(tmp_path / "s", segment_bytes=1 << 20)
    fill(lg, 20)
    seg = lg.segments[-1].path
    data = bytearray(seg.read_bytes())
    data[data.index(b"10....")] ^= 0xFF  # flip a byte in record 10's body
    seg.write_bytes(bytes(data))
    assert bodies(lg, 0, 20) == list(range(10))  # stops before the damaged record


def test_R3_reads_from_any_offset_past_records_larger_than_one_read(tmp_path: Path) -> None:
    """Records larger than a read (256 KiB) between small ones: a seek into the middle of
    an index stride steps over them, and a read returns them whole, checksums checked;
    a read stops at its byte budget after at least one record."""
    lg = StreamLog(tmp_path / "s")
    sizes = [100 if i % 7 else 300_000 for i in range(150)]
    for i, n in enumerate(sizes):
        lg.append("", "rk", PROPS, str(i).encode().ljust(n, b"."))
    lg.flush()
    for off in (0, 1, 6, 7, 8, 63, 64, 70, 71, 100, 140, 149):
        assert bodies(lg, off, 9) == list(range(off, min(off + 9, 150)))
        recs = lg.read(off, 9)
        assert [len(r[BODY]) for r in recs] == sizes[off:off + len(recs)]
    assert len(lg.read(7, 100, max_bytes=1)) == 1
    assert [r[OFFSET] for r in lg.read(1, 100, max_bytes=250_000)] == list(range(1, 8))


def test_R1_checksums_are_zlibs_crc32_whichever_computes_them(tmp_path: Path) -> None:
    """The log's checksums are computed by ISA-L where `isal` is installed
    (ackmq/protocol/crc.py) and must stay zlib's CRC-32: a log written by an install
    without it (or before it) reads back, and the other way round."""
    import struct
    import zlib

    from ackmq.protocol.crc import crc32
    from ackmq.store.format import REC_HDR

    data = bytes(range(256)) * 40
    for n in (0, 1, 7, 64, 1000, len(data)):
        assert crc32(data[:n]) == zlib.crc32(data[:n])
        assert crc32(data[n:], crc32(data[:n])) == zlib.crc32(data)
    lg = StreamLog(tmp_path / "s")
    fill(lg, 50)
    raw = next((tmp_path / "s").glob("*.seg")).read_bytes()
    p, seen = 16, 0  # past the segment header
    while p < len(raw):
        n, crc = REC_HDR.unpack_from(raw, p)
        assert zlib.crc32(raw[p + 8:p + 8 + n]) == crc
        p += 8 + n
        seen += 1
    assert seen == 50 and struct.calcsize("<8sQ") == 16
