"""Power cuts simulated under the store's file operations (tools/crashsim/faultfs.py,
tools/crashsim/crashsim.py): seeds run in CI, each planted bug is caught, and the issue-23
bug (a --no-fsync broker on a fresh data dir that would not come back) is gone."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.seed import run_seed

from ackmq.broker.access import AccessModel
from ackmq.store import QueueDef, compact, fileio
from ackmq.store.accessfile import AccessFile
from ackmq.store.segments import SegmentStore
from tools.crashsim import crashsim, faultfs, kvsim

PERSISTENT = b"\x10\x00\x02"  # property flags: delivery-mode 2

#: Each seed test runs a fixed stretch and a second one of the same length that moves
#: with the run's seed (ACKMQ_TEST_SEED replays one): more seeds over runs, few per run.
#: A failure names its seed; replay it with
#: `python -m tools.crashsim.crashsim --seeds 1 --seed-start N`.
MOVING = 1_000_000 + run_seed() % 1_000_000 * 1_000

#: Seeds moving runs found failing, each fixed since: run every time.
FOUND = {
    952_545_035: "compaction dropped a moved message's old copy before its new one was durable",
    952_552_014: "the same",
    952_534_115: "a policy set under way at the cut (the simulator's oracle)",
    952_559_690: "the same",
}


@contextlib.contextmanager
def _simulated_disk(root: Path) -> Iterator[faultfs.FaultFS]:
    """The store's file operations on the simulated disk; the power goes at the block's end."""
    fs = faultfs.FaultFS(root)
    fileio.install(fs)
    try:
        yield fs
        fs.cut_power(raise_=False)
    finally:
        fs.close_all()
        fileio.uninstall()


def _nothing_unsynced_kept(fs: faultfs.FaultFS, at: Path) -> Path:
    """Write to `at` the disk a power cut leaves when nothing unsynced reached it."""
    faultfs.materialize(fs.image(random.Random(1), unsynced="none"), at)
    return at


def _second(fixed: int, n: int) -> int:
    return MOVING + fixed


def _seeds(fixed: int, n: int, run: Callable[..., tuple[int, list[tuple[int, str]]]]
           = crashsim.run_seeds, **kw: Any) -> tuple[int, list[tuple[int, str]]]:
    """`run` over n seeds from `fixed` and n from `_second`: (seeds run, failures)."""
    ran_a, fail_a = run(fixed, n, **kw)
    ran_b, fail_b = run(_second(fixed, n), n, **kw)
    return ran_a + ran_b, fail_a + fail_b


def test_P9_power_cuts_keep_every_promise() -> None:
    """120 seeds (60 fixed, 60 moving) of the broker model + store + access file, power
    cut at a random operation (and again inside the recovery): nothing confirmed lost, no
    synced ack undone, no committed definition/user/permission lost, no corrupt message
    served, no refused start."""
    ran, failures = _seeds(0, 60)
    assert ran == 120
    assert failures == []


@pytest.mark.parametrize("seed", sorted(FOUND))
def test_P9_seeds_found_failing_once_pass(seed: int, tmp_path: Path) -> None:
    failure, _ = crashsim.run_seed(seed, tmp_path)
    assert failure is None, f"seed {seed} ({FOUND[seed]}): {failure}"


def test_L2_power_cuts_deliver_each_confirmed_delayed_message_once_never_early(
        tmp_path: Path) -> None:
    """The simulator's workload publishes through a durable x-delayed-message exchange
    (delays from 0 to past the paging threshold) and fires its timer store at random
    steps; after each cut every confirmed delayed message is delivered exactly once,
    none before its due time (checked at the cut's clock, then past every due time).
    The plants `delayed-remove-apart` and `delayed-early` (test above) show both checks
    can fail."""
    delayed_pending = 0
    for seed in [*range(20_000, 20_040), *range(_second(20_000, 40), _second(20_000, 40) + 40)]:
        failure, facts = crashsim.run_seed(seed, tmp_path, fsync=True)
        assert failure is None, f"seed {seed}: {failure}"
        delayed_pending += facts.get("delayed", 0)
    assert delayed_pending >= 40  # confirmed delayed messages the checks covered


def test_P9_no_fsync_keeps_metadata_and_always_starts() -> None:
    """--no-fsync gives up messages, never definitions, users or permissions, and never
    the ability to start."""
    ran, failures = _seeds(10_000, 30, fsync=False)
    assert ran == 60
    assert failures == []


@pytest.mark.parametrize("plant", sorted(crashsim.PLANTS))
def test_P9_simulator_catches_planted_bug(plant: str) -> None:
    """Each planted bug (a skipped directory fsync of a new segment or of access.json,
    confirms sent before their fdatasync, access.json or defs.log not fsynced under
    --no-fsync)
    makes some seed fail: the simulator can see what it is meant to see."""
    ran, failures = crashsim.run_seeds(0, 500, plant, stop_after=1,
                                       fsync=False if plant.endswith("-nofsync") else None)
    assert failures, f"{plant}: {ran} seeds and no failure"


def test_P9_damage_inside_synced_data_is_refused_with_file_and_offset(tmp_path: Path) -> None:
    """A byte flipped inside an older segment or inside defs.log before its last frame
    (synced data, not a torn tail): recovery refuses, naming the file and the offset.
    defs.log used to take such damage for a torn tail and silently drop every definition
    after it."""
    checked = 0
    for seed in range(60):
        failure, what = crashsim.run_damage_seed(seed, tmp_path)
        assert failure is None, f"seed {seed}: {failure}"
        checked += bool(what)
    assert checked == 60


def test_P9_a_seed_replays_the_same_run(tmp_path: Path) -> None:
    for seed in (3, 77):
        a = crashsim.run_seed(seed, tmp_path / "a")
        b = crashsim.run_seed(seed, tmp_path / "b")
        assert a == b


def test_P9_no_fsync_fresh_data_dir_comes_back_after_power_cut(tmp_path: Path) -> None:
    """Issue 23: a broker started with --no-fsync on a fresh data dir, a user added and a
    durable queue declared, then the power goes and the disk keeps nothing unsynced: it
    starts again with its users, vhost and queue (it used to find an empty access.json
    and refuse: "data directory ... is damaged")."""
    root = tmp_path / "data"
    root.mkdir()
    with _simulated_disk(root) as fs:
        store = SegmentStore(root, fsync=False, auto_compact=False, sync_thread=False)
        store.open()
        access = AccessModel.seeded({"guest": "guest"}, AccessFile(root, fsync=False).save)
        access.add_user("alice", "pw")
        access.set_permissions("alice", "/", ".*", ".*", ".*")
        store.save_queue(QueueDef("orders"))
    image = _nothing_unsynced_kept(fs, tmp_path / "image")
    data = AccessFile(image).load()
    assert data is not None
    back = AccessModel.load(data, None)
    assert {"guest", "alice"} <= set(back.users)
    assert back.permission("alice", "/") is not None
    st = SegmentStore(image, fsync=False, auto_compact=False)
    rec = st.open()
    try:
        assert [q.name for q in rec.queues] == ["orders"]
    finally:
        st.close()


def test_P9_store_works_without_fallocate(tmp_path: Path) -> None:
    """A filesystem that refuses fallocate (LazyFS, some FUSE and network filesystems):
    commits just append."""
    root = tmp_path / "data"
    root.mkdir()
    fs = faultfs.FaultFS(root, fallocate=False)
    fileio.install(fs)
    try:
        st = SegmentStore(root, auto_compact=False, sync_thread=False)
        rec = st.open()
        st.save_queue(QueueDef("q"))
        got: list[BaseException | None] = []
        st.add("q", (rec.epoch << 40) | 1, "", "q", b"\x10\x00\x02", b"x" * 100)
        st.commit(got.append)
        st.sync_round()
        assert got == [None]
        assert st.stats.preallocated == 0
        st.close()
    finally:
        fs.close_all()
        fileio.uninstall()
    st = SegmentStore(root, auto_compact=False)
    rec = st.open()
    try:
        assert len(rec.messages["q"]) == 1
    finally:
        st.close()


def test_N3_N5_power_cuts_keep_mqtt_retained_and_qos2_state() -> None:
    """MQTT's state beside the queues (retained messages, QoS 2 ids in and out, over
    store/kvlog.py, its log rewrites included), power cut at a random operation and
    again inside the reopening: every change a sync acknowledged is there, nothing
    that never was appears (tools/crashsim/kvsim.py)."""
    ran, failures = _seeds(0, 16, kvsim.run_seeds)
    assert ran == 32
    assert failures == []


def test_N3_kv_simulator_catches_an_unsynced_acknowledgement() -> None:
    """The planted bug (KVLog's sync does nothing) makes a seed fail."""
    ran, failures = kvsim.run_seeds(0, 100, "kvlog-nofsync", stop_after=1)
    assert failures, f"{ran} seeds and no failure"


def test_P9_compaction_does_not_make_an_unsynced_move_durable(tmp_path: Path) -> None:
    """A confirmed message moved to another queue (a delayed message firing, a dead-letter)
    is a REMOVE of the old copy and an ADD of the new one in one batch. Compaction drops
    the old copy's ADD once that REMOVE is written; if the prefix is unlinked before the
    batch is fdatasynced, a power cut then leaves neither copy (found by crash-simulator
    seeds 952,545,035 and 952,552,014). Compaction now syncs what was written first."""
    root = tmp_path / "data"
    root.mkdir()
    with _simulated_disk(root) as fs:
        st = SegmentStore(root, auto_compact=False, sync_thread=False, segment_bytes=2048)
        rec = st.open()
        st.save_queue(QueueDef("a"))
        st.save_queue(QueueDef("b"))
        seq = (rec.epoch << 40) | 1
        st.add("a", seq, "", "a", PERSISTENT, b"kept" * 50)
        for i in range(2, 40):  # garbage: published and acked, rolling segments over
            st.add("a", seq + i, "", "a", PERSISTENT, b"g" * 200)
            st.commit(lambda e: None)
            st.sync_round()
            st.remove("a", seq + i)
        st.commit(lambda e: None)
        st.sync_round()
        st.remove("a", seq)  # the move, written and not synced
        st.add("b", seq, "", "b", PERSISTENT, b"kept" * 50)
        st.commit(lambda e: None)
        assert compact.maybe_compact(st)
    st = SegmentStore(_nothing_unsynced_kept(fs, tmp_path / "image"), auto_compact=False)
    rec = st.open()
    try:
        held = {q: len(m) for q, m in rec.messages.items()}
        assert held.get("a", 0) + held.get("b", 0) == 1, held
    finally:
        st.close()
