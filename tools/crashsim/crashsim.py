"""Power-cut simulation of the broker model + store, one reproducible run per seed.

    python -m tools.crashsim.crashsim --seeds 1000 [--seed-start N] [--plant NAME] [-v]

Each seed drives a `BrokerModel` over a `SegmentStore` and the access file, with the
store's file operations on a `FaultFS` (faultfs.py): durable queues and exchanges
declared and deleted, persistent messages published with confirms, fetched and acked,
users, vhosts and permissions changed, group commits, sync rounds (the sync thread's
work, run on this thread so the interleaving is the seed's), rollovers of small
segments, compactions. At a random operation the power goes; the disk image the
simulator derives (a random subset of the unsynced writes and directory operations, the
last write torn) is recovered — once more with a power cut inside that recovery — and
checked:

- the broker starts (no refusal because of a torn unsynced tail);
- every confirmed message not acked is there, no message whose ack was synced is;
- every message served is one that was published, once;
- every confirmed delayed message (a durable `x-delayed-message` exchange, SPEC L2) is
  delivered exactly once, none before its due time: the simulator keeps its own
  millisecond clock (it moves on with each step, and the timer stores fire at random
  steps, as the loop's timer would), checks what the recovered queues hold at the cut's
  clock, then runs the clock past every due time and fires the rest;
- every definition, user, vhost, permission and policy whose call returned is there
  (and what was durably deleted or cleared is not), in every mode, --no-fsync included;
- the epoch went up.

`--plant` puts a known bug in, to show the simulator catches it (see PLANTS).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ackmq.broker import BrokerModel, NullScheduler, delayed
from ackmq.broker.access import AccessModel
from ackmq.broker.policy import policy_from_json
from ackmq.broker.storage import CorruptStore
from ackmq.protocol.amqp.properties import properties_with_header
from ackmq.store import compact, fileio
from ackmq.store.accessfile import AccessFile
from ackmq.store.defs import DefsLog
from ackmq.store.policyfile import PolicyFile
from ackmq.store.segments import SegmentStore
from tools.crashsim import faultfs
from tools.crashsim.crashplants import PLANTS

__all__ = ["PLANTS", "run_damage_seed", "run_seed", "run_seeds"]

PERSISTENT = b"\x10\x00\x02"  # property flags: delivery-mode present; delivery-mode 2
DELAYED_X = "xd"  # a durable x-delayed-message exchange, every queue bound by its name
# x-delay values drawn (ms): 0 routes at once; past NEAR_MS the message is paged (read back
# from the store when its bucket comes near)
DELAYS = (0, 1, 40, 300, 1500, delayed.NEAR_MS + 2000, delayed.NEAR_MS + 9000)


class _Clock:
    """The timer stores' clock (`delayed.now_ms`) while a seed runs: a seed's run is the
    same on any machine at any speed."""

    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now

    @contextlib.contextmanager
    def installed(self) -> Iterator[_Clock]:
        real = delayed.now_ms
        delayed.now_ms = self
        try:
            yield self
        finally:
            delayed.now_ms = real


class _Output:
    """The ChannelOutput of the simulated client: records confirms."""

    writable = True
    number = 1

    def __init__(self, sim: _Run) -> None:
        self.sim = sim

    def confirm(self, ack: bool, delivery_tag: int, multiple: bool) -> None:
        self.sim.confirmed(ack, delivery_tag, multiple)

    def close(self, code: int, text: str) -> None:
        raise AssertionError(f"channel closed by the model: {code} {text}")

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *a, **kw: None


class _Oracle:
    """What must be (and must not be) on the disk, as far as callers were told."""

    def __init__(self) -> None:
        self.bodies: dict[bytes, tuple[str, int]] = {}  # body -> (queue, message id)
        self.must: dict[str, set[int]] = {}   # queue -> confirmed, not acked
        self.gone: dict[str, set[int]] = {}   # queue -> acked, the ack synced
        self.queues_in: set[str] = set()      # declared, the call returned
        self.queues_out: set[str] = set()     # deleted, the call returned
        self.exchanges_in: set[str] = set()
        self.users_in: set[str] = set()
        self.users_out: set[str] = set()
        self.vhosts_in: set[str] = set()
        self.perms_in: dict[tuple[str, str], tuple[str, str, str]] = {}
        self.policies_in: dict[str, dict[str, Any]] = {}  # set, the call returned
        self.policies_out: set[str] = set()  # cleared, the call returned
        # the set (name, definition) or clear (name, None) under way: either outcome holds
        self.policy_flight: tuple[str, dict[str, Any] | None] | None = None
        self.due: dict[bytes, int] = {}  # delayed message body -> due time (ms)
        self.epoch = 0

    def copy(self) -> _Oracle:
        o = _Oracle()
        o.bodies = self.bodies
        o.must = {q: set(s) for q, s in self.must.items()}
        o.gone = {q: set(s) for q, s in self.gone.items()}
        for name in ("queues_in", "queues_out", "exchanges_in", "users_in", "users_out",
                     "vhosts_in"):
            setattr(o, name, set(getattr(self, name)))
        o.perms_in = dict(self.perms_in)
        o.policies_in = dict(self.policies_in)
        o.policies_out = set(self.policies_out)
        o.policy_flight = self.policy_flight
        o.due = self.due
        o.epoch = self.epoch
        return o


class _Run:
    """One seed: the workload up to the power cut."""

    def __init__(self, seed: int, root: Path, clock: _Clock, fsync: bool | None = None
                 ) -> None:
        self.rng = random.Random(seed)
        self.root = root
        self.clock = clock
        rng = self.rng
        mixed = rng.random() < 0.85  # drawn either way: a seed's run is the same
        self.fsync = mixed if fsync is None else fsync
        self.segment_bytes = rng.choice((2048, 8192, 65536))
        self.fallocate = rng.random() < 0.7
        self.steps = rng.randrange(10, 70)
        self.crash_at: int | None = rng.randrange(1, 6 * self.steps)
        if rng.random() < 0.1:
            self.crash_at = None  # the power goes after the last step
        self.oracle = _Oracle()
        self.frozen: _Oracle | None = None
        # confirm tag -> (queue, id, the queue's incarnation: deleted and declared again,
        # it must not inherit the promise made for the old one's messages)
        self.published: dict[int, tuple[str, int, int]] = {}
        self.incarnation: dict[str, int] = {}
        self.acked: set[int] = set()  # ids acked (a confirm may come after the ack)
        self.confirmed_tags: set[int] = set()
        self.unacked: list[tuple[int, str, int]] = []  # (delivery tag, queue, id)
        self.next_id = 0
        self.store: SegmentStore | None = None
        self.broker: Any = None

    # -- oracle updates ---------------------------------------------------------------
    def confirmed(self, ack: bool, tag: int, multiple: bool) -> None:
        if not ack:
            return
        tags = [t for t in self.published if t <= tag and t not in self.confirmed_tags] \
            if multiple else [tag]
        for t in tags:
            self.confirmed_tags.add(t)
            q, mid, inc = self.published[t]
            if self.fsync and q in self.oracle.must and self.incarnation.get(q) == inc \
                    and mid not in self.acked:
                self.oracle.must[q].add(mid)

    def freeze(self) -> None:
        """The power cut: what callers were told up to here is the promise."""
        self.frozen = self.oracle.copy()

    # -- the workload --------------------------------------------------------------------
    def start(self) -> tuple[BrokerModel, AccessModel]:
        store = SegmentStore(self.root, fsync=self.fsync, auto_compact=False,
                             sync_thread=False, segment_bytes=self.segment_bytes)
        self.store = store
        af = AccessFile(self.root)
        access = AccessModel.seeded({"guest": "guest"}, af.save)
        self.oracle.users_in.add("guest")
        self.oracle.vhosts_in.add("/")
        broker = BrokerModel(NullScheduler(), store)
        broker.policies.save = PolicyFile(self.root).save
        broker.start(list(access.vhosts))
        self.oracle.epoch = broker.epoch
        self.broker = broker
        broker.vhosts["/"].declare_exchange(DELAYED_X, delayed.EXCHANGE_TYPE, False, True,
                                            False, False, {delayed.TYPE_ARG: "direct"})
        self.oracle.exchanges_in.add(DELAYED_X)
        return broker, access

    def run(self, broker: BrokerModel, access: AccessModel) -> None:
        rng, o = self.rng, self.oracle
        vh = broker.vhosts["/"]
        ch = broker.open_channel(vh, object(), _Output(self))
        ch.confirm_select()
        store = self.store
        assert store is not None
        for _ in range(self.steps):
            what = rng.random()
            queues = sorted(vh.queues)
            if what < 0.1 or not queues:
                name = f"q{rng.randrange(5)}"
                if name not in vh.queues:
                    o.queues_out.discard(name)  # from here on it may be back
                    vh.declare_queue(name, False, True, False, False, {}, None)
                    vh.bind(DELAYED_X, vh.queues[name], name, {})
                    o.queues_in.add(name)
                    o.must[name] = set()
                    o.gone[name] = set()
                    self.incarnation[name] = self.incarnation.get(name, 0) + 1
            elif what < 0.13 and len(queues) > 1:
                name = rng.choice(queues)
                o.queues_in.discard(name)
                o.must.pop(name, None)
                o.gone.pop(name, None)
                self.unacked = [u for u in self.unacked if u[1] != name]
                vh.delete_queue(vh.queues[name])
                o.queues_out.add(name)
            elif what < 0.5:
                for _ in range(rng.randrange(1, 6)):
                    q = rng.choice(queues)
                    self.next_id += 1
                    mid = self.next_id
                    body = f"{q}/{mid}/".encode() + rng.randbytes(rng.choice((0, 50, 700, 3000)))
                    o.bodies[body] = (q, mid)
                    if rng.random() < 0.3:  # through the delayed exchange (L2)
                        delay = rng.choice(DELAYS)
                        o.due[body] = self.clock.now + delay
                        seq, _ = ch.basic_publish(DELAYED_X, q, False, False,
                                                  properties_with_header(
                                                      PERSISTENT, delayed.HEADER, delay), body)
                    else:
                        seq, _ = ch.basic_publish("", q, False, False, PERSISTENT, body)
                    self.published[seq] = (q, mid, self.incarnation[q])
            elif what < 0.62:
                q = rng.choice(queues)
                got = ch.basic_get(q, False)
                if got is not None:
                    tag, entry, _ = got
                    assert entry.message is not None
                    qq, mid = o.bodies[entry.message.body]
                    self.unacked.append((tag, q, mid))
            elif what < 0.72 and self.unacked:
                tag, q, mid = self.unacked.pop(rng.randrange(len(self.unacked)))
                ch.basic_ack(tag, False)
                self.acked.add(mid)
                if q in o.must:
                    o.must[q].discard(mid)

                def acked(exc: BaseException | None, q: str = q, mid: int = mid) -> None:
                    if exc is None and self.fsync and q in o.gone:
                        o.gone[q].add(mid)
                broker.await_commit_callback(acked)
            elif what < 0.76:
                self._access_change(access)
            elif what < 0.79:
                name = f"x{rng.randrange(3)}"
                vh.declare_exchange(name, "direct", False, True, False, False, {})
                o.exchanges_in.add(name)
            elif what < 0.82:
                compact.maybe_compact(store)
            self.clock.now += rng.randrange(0, 600)
            if rng.random() < 0.3:  # the store's loop timer, whenever it would have run
                x = vh.exchanges[DELAYED_X]
                assert isinstance(x, delayed.Delaying) and x.timers is not None
                x.timers.fire()
            if rng.random() < 0.6:
                broker.end_of_turn()
            if rng.random() < 0.5:
                store.sync_round()
                broker.end_of_turn()  # the confirms the sync round released

    def _access_change(self, access: AccessModel) -> None:
        rng, o = self.rng, self.oracle
        user = f"u{rng.randrange(4)}"
        what = rng.random()
        if what < 0.4:
            if user not in access.users:
                o.users_out.discard(user)
                access.add_user(user, "pw")
                o.users_in.add(user)
        elif what < 0.6:
            if user in access.users:
                o.users_in.discard(user)
                o.perms_in = {k: v for k, v in o.perms_in.items() if k[0] != user}
                access.delete_user(user)
                o.users_out.add(user)
        elif what < 0.8:
            vhost = f"v{rng.randrange(2)}"
            if access.add_vhost(vhost):
                o.vhosts_in.add(vhost)
        elif what < 0.9:
            self._policy_change()
        elif user in access.users:
            perm = (rng.choice((".*", "^q")), ".*", rng.choice((".*", "")))
            o.perms_in.pop((user, "/"), None)
            access.set_permissions(user, "/", *perm)
            o.perms_in[(user, "/")] = perm


    def _policy_change(self) -> None:
        """Set or clear a policy (policies.json, written as access.json is)."""
        rng, o, book = self.rng, self.oracle, self.broker.policies
        name = f"p{rng.randrange(3)}"
        if rng.random() < 0.7:
            definition = {"message-ttl": rng.randrange(1000, 10**6)}
            o.policies_out.discard(name)
            o.policy_flight = (name, definition)
            book.set(policy_from_json("/", name, {"pattern": "^q", "definition": definition}))
            o.policies_in[name] = definition
        else:
            o.policy_flight = (name, None)
            if book.clear("/", name):
                o.policies_in.pop(name, None)
                o.policies_out.add(name)
        o.policy_flight = None


def _check(root: Path, promise: _Oracle, fsync: bool, seg: int, crash_at: int | None,
           rng: random.Random, clock: _Clock) -> tuple[str | None, int]:
    """Recover `root` (a power cut inside that recovery first, at a random point) and
    check the promise; returns (the failure or None, operations recovery made)."""
    # a power cut during recovery: the image of that is recovered again
    fs = faultfs.FaultFS(root, crash_at=rng.randrange(1, 40), fallocate=True)
    fileio.install(fs)
    try:
        with contextlib.suppress(faultfs.SimulatedCrash):
            _open(root, fsync, seg)
    except CorruptStore as e:
        return f"refused to start: {e}", fs.ops
    except Exception as e:  # noqa: BLE001 - every failure is a finding, with its seed
        return f"recovery failed: {e!r}", fs.ops
    finally:
        fs.close_all()
        fileio.uninstall()
    if fs.crashed:
        again = root.with_name(root.name + "-again")
        faultfs.materialize(fs.image(rng), again)
        shutil.rmtree(root)
        again.rename(root)
    fs = faultfs.FaultFS(root)
    fileio.install(fs)
    try:
        return _verify(root, promise, fsync, seg, clock), fs.ops
    except CorruptStore as e:
        return f"refused to start: {e}", fs.ops
    except Exception as e:  # noqa: BLE001
        return f"recovery failed: {e!r}", fs.ops
    finally:
        fs.close_all()
        fileio.uninstall()


def _open(root: Path, fsync: bool, seg: int) -> tuple[BrokerModel, AccessModel]:
    af = AccessFile(root)
    data = af.load()  # None: the first start never finished; the server seeds it again
    access = AccessModel.seeded({"guest": "guest"}, af.save) if data is None \
        else AccessModel.load(data, af.save)
    store = SegmentStore(root, fsync=fsync, auto_compact=False, sync_thread=False,
                         segment_bytes=seg)
    broker = BrokerModel(NullScheduler(), store)
    pf = PolicyFile(root)
    saved = pf.load()
    if saved:
        broker.policies.load(saved)
    broker.policies.save = pf.save
    broker.start(list(access.vhosts))
    return broker, access


def _verify(root: Path, p: _Oracle, fsync: bool, seg: int, clock: _Clock) -> str | None:
    try:
        data = AccessFile(root).load()
    except ValueError as e:
        return f"access.json unreadable: {e}"
    if data is None and p.users_in:
        return "access.json is missing"
    broker, access = _open(root, fsync, seg)
    try:
        problems = []
        if broker.epoch <= p.epoch:
            problems.append(f"epoch went back: {broker.epoch} after {p.epoch}")
        problems += [f"user {u} lost" for u in sorted(p.users_in - set(access.users))]
        problems += [f"deleted user {u} is back" for u in sorted(p.users_out & set(access.users))]
        problems += [f"vhost {v} lost" for v in sorted(p.vhosts_in - set(access.vhosts))]
        for (u, v), perm in sorted(p.perms_in.items()):
            got = access.permission(u, v)
            if got is None or (got.configure, got.write, got.read) != perm:
                problems.append(f"permission of {u} on {v} lost: {got}")
        vh = broker.vhosts["/"]
        problems += [f"queue {q} lost" for q in sorted(p.queues_in - set(vh.queues))]
        problems += [f"deleted queue {q} is back" for q in sorted(p.queues_out & set(vh.queues))]
        problems += [f"exchange {x} lost" for x in sorted(p.exchanges_in - set(vh.exchanges))]
        flight = p.policy_flight  # a change under way at the cut: done or not, both hold
        for name, definition in sorted(p.policies_in.items()):
            pol = broker.policies.get("/", name)
            ok = pol is not None and pol.definition == definition
            if not ok and flight is not None and flight[0] == name:
                ok = pol is None if flight[1] is None else (
                    pol is not None and pol.definition == flight[1])
            if not ok:
                problems.append(f"policy {name} lost: {pol}")
        problems += [f"cleared policy {n} is back" for n in sorted(p.policies_out)
                     if broker.policies.get("/", n) is not None]
        ch = broker.open_channel(vh, object(), _Output(None))  # type: ignore[arg-type]
        seen: dict[str, set[int]] = {q: set() for q in vh.queues}

        def drain(when: str) -> None:
            for q in sorted(vh.queues):
                while (got := ch.basic_get(q, True)) is not None:
                    body = got[1].message.body  # type: ignore[union-attr]
                    who = p.bodies.get(body)
                    if who is None or who[0] != q:
                        problems.append(f"queue {q}: served a message never published to "
                                        f"it ({body[:40]!r})")
                        continue
                    if who[1] in seen[q]:
                        problems.append(f"queue {q}: message {who[1]} served twice")
                    due = p.due.get(body)
                    if due is not None and due > clock.now:
                        problems.append(f"queue {q}: delayed message {who[1]} served "
                                        f"{due - clock.now} ms before its time ({when})")
                    seen[q].add(who[1])

        drain("at the cut's clock")  # what fired before the cut, or was never delayed
        x = vh.exchanges.get(DELAYED_X)
        timers = x.timers if isinstance(x, delayed.Delaying) else None
        if timers is not None:
            clock.now += 10 * delayed.NEAR_MS + 60_000  # past every due time
            for _ in range(1000):
                timers.fire()
                if not timers.message_count:
                    break
            drain("after every due time")
        for q in sorted(vh.queues):
            if fsync:
                lost = p.must.get(q, set()) - seen[q]
                if lost:
                    problems.append(f"queue {q}: confirmed messages lost: {sorted(lost)}")
            back = p.gone.get(q, set()) & seen[q]
            if back:
                problems.append(f"queue {q}: messages whose ack was synced are back: "
                                f"{sorted(back)}")
        return "; ".join(problems) or None
    finally:
        broker.close()


def run_seed(seed: int, workdir: Path, fsync: bool | None = None
             ) -> tuple[str | None, dict[str, Any]]:
    """One seed: workload, power cut, recovery (with a second cut), checks. `fsync`
    None: the seed picks (85% on). Returns (failure text or None, facts about the run)."""
    with _Clock().installed() as clock:
        return _run_seed(seed, workdir, fsync, clock)


def _run_seed(seed: int, workdir: Path, fsync: bool | None, clock: _Clock
              ) -> tuple[str | None, dict[str, Any]]:
    root = workdir / f"s{seed}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    run = _Run(seed, root, clock, fsync)
    fs = faultfs.FaultFS(root, crash_at=run.crash_at, fallocate=run.fallocate)
    fs.on_crash = run.freeze
    fileio.install(fs)
    failure = None
    try:
        broker, access = run.start()
        run.run(broker, access)
        fs.cut_power(raise_=False)
    except faultfs.SimulatedCrash:
        pass
    except Exception as e:  # noqa: BLE001 - a failure of the run itself, with its seed
        import traceback
        failure = "workload failed: " + "".join(traceback.format_exception(e))[-1500:]
        if not fs.crashed:
            fs.cut_power(raise_=False)
    finally:
        fs.close_all()
        fileio.uninstall()
    unsynced = fs.unsynced()
    facts: dict[str, Any] = {"ops": fs.ops, "fsync": run.fsync, "crash_at": run.crash_at,
                             "unsynced": unsynced}
    if failure is None:
        assert run.frozen is not None
        image_dir = workdir / f"s{seed}-image"
        shutil.rmtree(image_dir, ignore_errors=True)
        faultfs.materialize(fs.image(run.rng), image_dir)
        failure, facts["recovery_ops"] = _check(image_dir, run.frozen, run.fsync,
                                                run.segment_bytes, run.crash_at, run.rng,
                                                run.clock)
        facts["confirmed"] = sum(len(s) for s in run.frozen.must.values())
        facts["delayed"] = sum(1 for body in run.frozen.due
                               if run.frozen.bodies[body][1] in
                               run.frozen.must.get(run.frozen.bodies[body][0], ()))
        shutil.rmtree(image_dir, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    return failure, facts


def run_damage_seed(seed: int, workdir: Path) -> tuple[str | None, str]:
    """Damage inside synced data is refused, naming the file and offset: run the seed's
    workload to its end (no cut), keep everything, flip one byte inside a frame of an
    older segment or of defs.log (not its last frame, the only one that may be torn),
    recover. Returns (failure or None, what was damaged; "" when nothing qualified)."""
    with _Clock().installed() as clock:
        return _run_damage_seed(seed, workdir, clock)


def _run_damage_seed(seed: int, workdir: Path, clock: _Clock) -> tuple[str | None, str]:
    root = workdir / f"d{seed}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    run = _Run(seed, root, clock, fsync=True)
    fs = faultfs.FaultFS(root, crash_at=None, fallocate=run.fallocate)
    fileio.install(fs)
    try:
        broker, access = run.start()
        run.run(broker, access)
        fs.cut_power(raise_=False)
    finally:
        fs.close_all()
        fileio.uninstall()
    image = fs.image(run.rng, unsynced="all")
    shutil.rmtree(root, ignore_errors=True)
    segs = sorted(n for n in image if n.endswith(".seg"))
    targets = [(n, len(image[n])) for n in segs[:-1] if len(image[n]) > 16]
    defs = image.get(DefsLog.NAME, b"")
    off, last = 16, 16
    while off + 16 <= len(defs):  # the start of defs.log's last frame
        last, off = off, off + 16 + int.from_bytes(defs[off + 4:off + 8], "little")
    if last > 16:
        targets.append((DefsLog.NAME, last))
    if not targets:
        return None, ""
    name, stop = run.rng.choice(targets)
    at = run.rng.randrange(16, stop)
    data = bytearray(image[name])
    data[at] ^= 0xFF
    image[name] = bytes(data)
    faultfs.materialize(image, root)
    what = f"{name} byte {at}"
    try:
        broker, _ = _open(root, True, run.segment_bytes)
        broker.close()
        return f"damage at {what} not reported", what
    except CorruptStore as e:
        if name not in str(e) or "offset" not in str(e):
            return f"damage at {what} reported without file and offset: {e}", what
        return None, what
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_seeds(start: int, count: int, plant: str | None = None, workdir: Path | None = None,
              progress: Callable[[str], None] | None = None, stop_after: int = 0,
              fsync: bool | None = None, damage: bool = False
              ) -> tuple[int, list[tuple[int, str]]]:
    """Run seeds [start, start + count) (`damage`: run_damage_seed instead of the power
    cuts); returns (seeds run, failures as (seed, text))."""
    failures: list[tuple[int, str]] = []
    own = workdir is None
    base = Path(tempfile.mkdtemp(prefix="ackmq-crashsim-",
                                 dir="/dev/shm" if Path("/dev/shm").is_dir() else None)
                ) if workdir is None else workdir
    quiet = logging.getLogger("ackmq")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # torn tails are expected here, by the thousand
    t0 = time.monotonic()
    ran = 0
    try:
        with PLANTS[plant]() if plant else contextlib.nullcontext():
            for i, seed in enumerate(range(start, start + count)):
                failure = run_damage_seed(seed, base)[0] if damage \
                    else run_seed(seed, base, fsync)[0]
                ran = i + 1
                if failure is not None:
                    failures.append((seed, failure))
                    if progress:
                        progress(f"FAIL seed {seed}: {failure}")
                    if stop_after and len(failures) >= stop_after:
                        break
                if progress and (i + 1) % 1000 == 0:
                    rate = (i + 1) / (time.monotonic() - t0) * 60
                    progress(f"{i + 1} seeds ({seed}), {len(failures)} failures, "
                             f"{rate:,.0f} seeds/min")
    finally:
        quiet.setLevel(level)
        if own:
            shutil.rmtree(base, ignore_errors=True)
    return ran, failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.crashsim.crashsim",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument("--seed-start", type=int, default=0)
    ap.add_argument("--plant", choices=sorted(PLANTS), help="put a known bug in")
    ap.add_argument("--stop-after", type=int, default=0, help="stop after N failures")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--no-fsync", dest="fsync", action="store_false", default=None,
                      help="every seed with fsync off (default: 15%% of them)")
    mode.add_argument("--fsync", dest="fsync", action="store_true",
                      help="every seed with fsync on")
    ap.add_argument("--damage", action="store_true",
                    help="flip a byte inside synced data instead: it must be refused")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    ran, failures = run_seeds(a.seed_start, a.seeds, a.plant,
                              progress=lambda s: print(s, flush=True),
                              stop_after=a.stop_after, fsync=a.fsync, damage=a.damage)
    dt = time.monotonic() - t0
    print(f"{ran} {'damage ' if a.damage else ''}seeds from {a.seed_start}"
          f"{' with ' + a.plant if a.plant else ''}"
          f"{'' if a.fsync is None else ', fsync ' + ('on' if a.fsync else 'off')}: "
          f"{len(failures)} failed, {dt:.1f} s ({ran / dt * 60:,.0f} seeds/min)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
