"""U5 resource alarms and the B3 publish flood: memory high watermark and disk free limit,
set at run time with rabbitmqctl's verbs (`ackmq ctl set_vm_memory_high_watermark`,
`set_disk_free_limit`); publishing connections blocked (`connection.blocked` to clients
with the capability, reads stopped for all), consumers draining, nothing confirmed lost.
Where the scenario can run on the reference RabbitMQ 3.10 too, it does (parametrized
`rabbitmq`, alarm windows of a few seconds, the watermark restored to 0.4 and the disk
limit to 50MB afterwards); what needs ackmq's process (its RSS, its log) is ackmq only.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pika
import pytest
from conftest import BrokerProcess, rabbitmq_url
from pamqp import commands
from support.pikahelp import drain_ints
from support.rawamqp import RawConnection
from support.stomphelp import RABBITMQ_STOMP, Raw

from ackmq.server.alarms import Limit, Limits, parse_disk_limit, parse_watermark

MiB = 1024 * 1024


@dataclass
class Target:
    """One broker under test and how to set its alarms (ackmq ctl / rabbitmqctl)."""

    name: str
    url: str
    ctl: Callable[..., subprocess.CompletedProcess[str]]
    stomp: tuple[str, int]
    broker: BrokerProcess | None = None
    # alarms that may still be set: the fixture clears these (a rabbitmqctl call each)
    maybe_on: set[str] = field(default_factory=set)

    def memory_alarm(self, on: bool) -> None:
        self._set("memory", on, "set_vm_memory_high_watermark", "0.0000001" if on else "0.4")

    def disk_alarm(self, on: bool) -> None:
        # on: a real reading, more free space asked for than the filesystem has
        self._set("disk", on, "set_disk_free_limit", "100000GB" if on else "50MB")

    def _set(self, alarm: str, on: bool, *args: str) -> None:
        if on:
            self.maybe_on.add(alarm)
        r = self.ctl(*args)
        assert r.returncode == 0, r.stderr
        if not on:
            self.maybe_on.discard(alarm)

    def pika(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.URLParameters(self.url))


def _actl(data_dir: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ackmq", "ctl", "--data-dir",
                               str(data_dir), *args], capture_output=True, text=True,
                              timeout=60)
    return ctl


def _rctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["rabbitmqctl", *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def ackmq(tmp_path: Path) -> Iterator[Target]:
    b = BrokerProcess(tmp_path / "data")
    b.start()
    try:
        yield Target("ackmq", b.url, _actl(b.data_dir), ("127.0.0.1", b.stomp_port), b)
    finally:
        b.stop()


@pytest.fixture(params=["ackmq", "rabbitmq"])
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    if request.param == "ackmq":
        yield request.getfixturevalue("ackmq")
        return
    url = rabbitmq_url()
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("no rabbitmqctl to set RabbitMQ's alarms")
    t = Target("rabbitmq", url, _rctl, RABBITMQ_STOMP)
    try:
        yield t
    finally:  # other tests (and other people) use this broker: never leave an alarm
        if "memory" in t.maybe_on:
            t.memory_alarm(False)
        if "disk" in t.maybe_on:
            t.disk_alarm(False)


def _queue(t: Target, name: str, fill: int = 0, durable: bool = False) -> None:
    conn = t.pika()
    ch = conn.channel()
    ch.queue_delete(name)
    ch.queue_declare(name, durable=durable)
    for i in range(fill):
        ch.basic_publish("", name, str(i).encode())
    conn.close()


def _depth(t: Target, name: str) -> int:
    conn = t.pika()
    try:
        return conn.channel().queue_declare(name, passive=True).method.message_count
    finally:
        conn.close()


def _delete(t: Target, name: str) -> None:
    conn = t.pika()
    conn.channel().queue_delete(name)
    conn.close()


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


# -- the rules, without sockets ------------------------------------------------------------

def test_U5_watermark_and_disk_limit_parse_as_rabbitmq() -> None:
    assert parse_watermark("0.4") == Limit(relative=0.4)
    assert parse_watermark("2GiB") == Limit(absolute=2 * 1024 ** 3)
    assert parse_watermark("512MB") == Limit(absolute=512_000_000)  # MB: powers of 1000
    assert parse_watermark("absolute:1G") == Limit(absolute=1024 ** 3)
    assert parse_disk_limit("50MB") == Limit(absolute=50_000_000)  # RabbitMQ's default
    assert parse_disk_limit("mem_relative:1.5") == Limit(relative=1.5)
    for bad in ("1.5", "-1", "lots", "5XB"):
        with pytest.raises(ValueError):
            parse_watermark(bad)
    lim = Limits(Limit(relative=0.5), Limit(relative=1.0), total_ram=1000)
    assert lim.check_memory(400) is None and lim.check_memory(501) is True
    assert lim.check_memory(600) is None and lim.reason() == "low on memory"
    assert lim.check_disk(999) is True and lim.reason() == "low on disk & memory"
    assert lim.check_memory(500) is False and lim.check_disk(1000) is False
    assert not lim.active


# -- connection.blocked, on both brokers -------------------------------------------------

def test_U5_blocked_method_only_to_clients_with_the_capability(target: Target) -> None:
    """A publish during an alarm blocks its connection: nothing more is read from it
    (the passive declare after the publish gets no answer). Only a client that announced
    `connection.blocked` is told so, with RabbitMQ's reason; both resume on clear."""
    q = f"alarm-cap-{target.name}"
    _queue(target, q)
    with_cap = RawConnection.open(target.url, capabilities={"connection.blocked": True})
    no_cap = RawConnection.open(target.url)
    idle = RawConnection.open(target.url, capabilities={"connection.blocked": True})
    for c in (with_cap, no_cap, idle):
        c.open_channel(1)
    try:
        target.memory_alarm(True)
        try:
            for c in (with_cap, no_cap):
                c.publish(1, "", q, b"during")
                c.send(1, commands.Queue.Declare(queue=q, passive=True))
            blocked = with_cap.expect(commands.Connection.Blocked, timeout=10)
            assert blocked.reason == "low on memory"
            assert with_cap.drain(1.0) == []     # no declare-ok: not read any more
            assert no_cap.drain(0.5) == []       # neither told nor read
            assert idle.drain(0.1) == []         # never published: not blocked, not told
            assert idle.rpc(1, commands.Queue.Declare(queue=q, passive=True),
                            commands.Queue.DeclareOk).message_count == 0
        finally:
            target.memory_alarm(False)
        with_cap.expect(commands.Connection.Unblocked, timeout=10)
        with_cap.expect(commands.Queue.DeclareOk, timeout=10)  # read again
        no_cap.expect(commands.Queue.DeclareOk, timeout=10)  # no connection.unblocked first
        deadline = time.monotonic() + 5  # RabbitMQ's queue takes the message a bit later
        while _depth(target, q) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _depth(target, q) == 2
        assert idle.drain(0.3) == []
    finally:
        for c in (with_cap, no_cap, idle):
            c.abort()
        _delete(target, q)


def test_U5_consumers_keep_draining_and_a_publishing_consumer_stops(target: Target) -> None:
    """During an alarm a consumer-only connection gets every message and its acks are
    read (prefetch 10, 300 messages). A connection that consumes and publishes is blocked
    whole, as RabbitMQ's reader: its acks wait too, so it gets no more than its prefetch."""
    q, q2 = f"alarm-drain-{target.name}", f"alarm-mixed-{target.name}"
    _queue(target, q, fill=300)
    _queue(target, q2, fill=50)
    consumer = target.pika()
    mixed = RawConnection.open(target.url, capabilities={"connection.blocked": True})
    try:
        target.memory_alarm(True)
        try:
            ch = consumer.channel()
            ch.basic_qos(prefetch_count=10)
            got = 0
            for method, _props, _body in ch.consume(q, inactivity_timeout=10):
                assert method is not None, f"stalled after {got} messages"
                ch.basic_ack(method.delivery_tag)
                got += 1
                if got == 300:
                    break
            ch.cancel()
            mixed.open_channel(1)
            mixed.rpc(1, commands.Basic.Qos(prefetch_count=5), commands.Basic.QosOk)
            mixed.rpc(1, commands.Basic.Consume(queue=q2, consumer_tag="m"),
                      commands.Basic.ConsumeOk)
            tags = [mixed.expect(commands.Basic.Deliver, timeout=10).delivery_tag
                    for _ in range(5)]
            mixed.publish(1, "", q, b"from the consumer")  # now it publishes: blocked
            mixed.expect(commands.Connection.Blocked, timeout=10)
            for tag in tags:
                mixed.send(1, commands.Basic.Ack(delivery_tag=tag))
            assert mixed.drain(1.0) == []  # its acks are not read: no more deliveries
        finally:
            target.memory_alarm(False)
        mixed.expect(commands.Connection.Unblocked, timeout=10)
        mixed.expect(commands.Basic.Deliver, timeout=10)  # acks read: deliveries again
    finally:
        mixed.abort()
        consumer.close()
        _delete(target, q)
        _delete(target, q2)


def test_U5_nothing_confirmed_is_lost_across_block_and_unblock(target: Target) -> None:
    """A confirming publisher of persistent messages, blocked mid-stream and unblocked:
    no confirm arrives while blocked, and every confirmed message is consumed after."""
    q = f"alarm-confirm-{target.name}"
    _queue(target, q, durable=True)
    confirmed: list[int] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def publish() -> None:
        try:
            conn = target.pika()
            ch = conn.channel()
            ch.confirm_delivery()
            n = 0
            while not stop.is_set():
                ch.basic_publish("", q, str(n).encode(),
                                 pika.BasicProperties(delivery_mode=2))
                confirmed.append(n)  # basic_publish returns once the broker confirmed
                n += 1
            conn.close()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    t = threading.Thread(target=publish, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while len(confirmed) < 200 and time.monotonic() < deadline and not errors:
            time.sleep(0.02)
        target.memory_alarm(True)
        try:
            time.sleep(0.5)
            before = len(confirmed)
            time.sleep(1.0)
            during = len(confirmed) - before
        finally:
            target.memory_alarm(False)
        deadline = time.monotonic() + 30
        while len(confirmed) < before + 200 and time.monotonic() < deadline and not errors:
            time.sleep(0.02)
    finally:
        stop.set()
        t.join(30)
    assert not errors, errors
    assert during == 0, f"{during} confirms while blocked"
    assert len(confirmed) >= before + 200, "the publisher did not resume"
    conn = target.pika()
    ch = conn.channel()
    seen = set()
    while True:
        m, _p, body = ch.basic_get(q, auto_ack=True)
        if m is None:
            break
        seen.add(int(body))
    conn.close()
    _delete(target, q)
    assert set(confirmed) <= seen, f"lost: {sorted(set(confirmed) - seen)[:10]}"


def test_U5_aio_pika_publisher_waits_while_blocked(target: Target) -> None:
    """aio-pika (aiormq) holds its publishes after connection.blocked until
    connection.unblocked: the confirm of a publish during the alarm comes after it."""
    import asyncio

    import aio_pika

    q = f"alarm-aio-{target.name}"
    _queue(target, q)

    async def run() -> tuple[bool, bool]:
        conn = await aio_pika.connect(target.url)
        ch = await conn.channel(publisher_confirms=True)
        await ch.default_exchange.publish(aio_pika.Message(b"before"), routing_key=q)
        await asyncio.to_thread(target.memory_alarm, True)
        try:
            first = asyncio.ensure_future(
                ch.default_exchange.publish(aio_pika.Message(b"during"), routing_key=q))
            await asyncio.sleep(0.3)
            second = asyncio.ensure_future(  # after connection.blocked: held in the client
                ch.default_exchange.publish(aio_pika.Message(b"after"), routing_key=q))
            done, _ = await asyncio.wait({first, second}, timeout=1.5)
            waited = not done
        finally:
            await asyncio.to_thread(target.memory_alarm, False)
        await asyncio.wait_for(asyncio.gather(first, second), 15)
        await conn.close()
        return waited, True

    waited, resumed = asyncio.run(run())
    try:
        assert waited, "a publish was confirmed during the alarm"
        assert resumed
        deadline = time.monotonic() + 5
        while _depth(target, q) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _depth(target, q) == 3
    finally:
        _delete(target, q)


def test_U5_disk_free_limit_blocks_publishers(target: Target) -> None:
    """The disk alarm from a real reading: a limit above the free space of the data
    dir's filesystem, then lowered again (ctl)."""
    q = f"alarm-disk-{target.name}"
    _queue(target, q)
    pub = RawConnection.open(target.url, capabilities={"connection.blocked": True})
    pub.open_channel(1)
    try:
        target.disk_alarm(True)
        try:
            pub.publish(1, "", q, b"x")
            assert pub.expect(commands.Connection.Blocked, timeout=15).reason == "low on disk"
            if target.broker is not None:
                alarms = target.ctl("-q", "alarms").stdout
                assert re.search(r"^disk\t\d+\t100000000000000$", alarms, re.M), alarms
        finally:
            target.disk_alarm(False)
        pub.expect(commands.Connection.Unblocked, timeout=15)
        assert _depth(target, q) == 1
    finally:
        pub.abort()
        _delete(target, q)
    if target.broker is not None:  # RabbitMQ's log lines
        log = "".join(target.broker.log)
        assert "Disk free limit set to 100000000MB" in log
        assert "Free disk space is insufficient. Free bytes: " in log
        assert "disk resource limit alarm set on node ackmq@" in log
        assert "*** Publishers will be blocked until this alarm clears ***" in log
        assert "disk resource limit alarm cleared on node ackmq@" in log


def test_U5_stomp_send_is_blocked_too(target: Target) -> None:
    """STOMP: a SEND during an alarm is handled (its RECEIPT comes), then reads from that
    connection stop (the next SEND's RECEIPT waits for the clear), as RabbitMQ's STOMP
    reader; a STOMP consumer keeps receiving and its ACKs are read."""
    q, q_sent = f"alarm-stomp-{target.name}", f"alarm-stomp-sent-{target.name}"
    _queue(target, q, fill=20)
    _queue(target, q_sent)
    dest, sent_dest = f"/amq/queue/{q}", f"/amq/queue/{q_sent}"
    sender, consumer = Raw.open(*target.stomp), Raw.open(*target.stomp)
    try:
        sender.connect()
        consumer.connect()
        target.memory_alarm(True)
        try:
            consumer.subscribe(dest, "s1", ack="client-individual")
            for _ in range(10):
                consumer.ack(consumer.recv(timeout=10))
            sender.send("SEND", {"destination": sent_dest, "receipt": "r1"}, b"one")
            time.sleep(0.3)
            sender.send("SEND", {"destination": sent_dest, "receipt": "r2"}, b"two")
            frames = sender.frames(timeout=1.5)
            receipts = [f.headers.get("receipt-id") for f in frames]
            assert receipts == ["r1"], frames  # the SEND that blocked was handled, not r2
            for _ in range(10):  # the consumer still drains, and its ACKs are read
                consumer.ack(consumer.recv(timeout=10))
            consumer.receipt("UNSUBSCRIBE", {"id": "s1"}, receipt="u1")
        finally:
            target.memory_alarm(False)
        deadline = time.monotonic() + 10
        got = {f.headers.get("receipt-id") for f in frames}
        while "r2" not in got and time.monotonic() < deadline:
            got.add(sender.recv(timeout=10).headers.get("receipt-id"))
        assert "r2" in got
        assert _depth(target, q_sent) == 2
    finally:
        sender.close()
        consumer.close()
        _delete(target, q)
        _delete(target, q_sent)


# -- ackmq only: its RSS, its ctl --------------------------------------------------------

def test_U5_publisher_flood_blocked_below_the_watermark_then_resumes(ackmq: Target) -> None:
    """A pika publisher floods 64 KiB messages (no confirms, no consumer).

    1. Watermark set at run time 16 MiB above the broker's idle RSS: the flood gets
       connection.blocked ("low on memory"), the broker pages its queue out to disk and
       unblocks it by itself (as RabbitMQ); 200 MB go through while its RSS stays under
       the watermark + 32 MiB (0.1 s sampling at this machine's rate, plus one read).
    2. Watermark set below the RSS now: blocked again, and this time it stays blocked
       (paging cannot clear it): the broker reads nothing more (the queue stops growing)
       until the watermark is raised; then it resumes, and every message sent is queued.
    """
    assert ackmq.broker is not None and ackmq.broker.proc is not None
    pid = ackmq.broker.proc.pid
    q = "alarm-flood"
    _queue(ackmq, q)
    watermark = _rss(pid) + 16 * MiB
    assert ackmq.ctl("set_vm_memory_high_watermark", "absolute", str(watermark)).returncode == 0
    events: list[str] = []
    blocked, unblocked, stop = threading.Event(), threading.Event(), threading.Event()
    sent = [0]
    errors: list[BaseException] = []
    peak = [0]

    def on_blocked(_c: object, m: object) -> None:
        events.append(m.method.reason)  # type: ignore[attr-defined]
        unblocked.clear()
        blocked.set()

    def on_unblocked(_c: object, _m: object) -> None:
        events.append("unblocked")
        blocked.clear()
        unblocked.set()

    def flood() -> None:
        try:
            conn = ackmq.pika()
            # pika's own callbacks run only in process_data_events, which a publisher
            # stuck in a full socket never reaches: listen on the connection underneath
            conn._impl.add_on_connection_blocked_callback(on_blocked)
            conn._impl.add_on_connection_unblocked_callback(on_unblocked)
            ch = conn.channel()
            body = b"\x00" * 65536
            while not stop.is_set():
                ch.basic_publish("", q, body)
                sent[0] += 1
            conn.close()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss(pid))
            time.sleep(0.02)

    t = threading.Thread(target=flood, daemon=True)
    sampler = threading.Thread(target=sample, daemon=True)
    t.start()
    sampler.start()
    try:
        deadline = time.monotonic() + 60  # phase 1: blocked, paged out, unblocked
        while (sent[0] < 3200 or "unblocked" not in events) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert events[:2] == ["low on memory", "unblocked"], events
        assert sent[0] >= 3200, sent[0]  # 200 MiB through a watermark 16 MiB above idle
        assert peak[0] <= watermark + 32 * MiB, (peak[0] - watermark) / MiB
        low = _rss(pid) - 8 * MiB  # phase 2: below the RSS: stays blocked
        assert ackmq.ctl("set_vm_memory_high_watermark", "absolute", str(low)).returncode == 0
        assert blocked.wait(30), events
        time.sleep(0.5)
        first = _depth(ackmq, q)
        time.sleep(1.0)
        assert blocked.is_set(), events
        assert _depth(ackmq, q) == first, "the broker kept reading a blocked publisher"
        assert ackmq.ctl("set_vm_memory_high_watermark", "0.4").returncode == 0
        assert unblocked.wait(15), events
        deadline = time.monotonic() + 30
        while _depth(ackmq, q) < first + 100 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _depth(ackmq, q) >= first + 100, "the publisher did not resume"
    finally:
        stop.set()
        t.join(60)
        sampler.join(5)
    assert not errors, errors
    assert not t.is_alive()
    assert _depth(ackmq, q) == sent[0]
    log = "".join(ackmq.broker.log)
    assert "memory resource limit alarm set on node ackmq@" in log
    assert "vm_memory_high_watermark set. Memory used:" in log
    assert "ready messages out to disk" in log
    assert "memory resource limit alarm cleared on node ackmq@" in log


def test_U5_memory_alarm_pages_queues_out_keeping_their_order(ackmq: Target) -> None:
    """In a memory alarm the broker pages ready messages out of memory (as RabbitMQ, so
    the alarm can clear without consumers); they come back in the same order, priority
    levels included."""
    assert ackmq.broker is not None
    plain, prio = "alarm-page-plain", "alarm-page-prio"
    conn = ackmq.pika()
    ch = conn.channel()
    ch.queue_declare(plain)
    ch.queue_declare(prio, arguments={"x-max-priority": 5})
    for i in range(300):
        ch.basic_publish("", plain, str(i).encode())
        ch.basic_publish("", prio, str(i).encode(), pika.BasicProperties(priority=i % 3))
    conn.close()
    ackmq.memory_alarm(True)
    try:
        deadline = time.monotonic() + 10
        while not any("ready messages out to disk" in line for line in ackmq.broker.log) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        ackmq.memory_alarm(False)
    assert any("paged 600 ready messages out to disk" in line for line in ackmq.broker.log)
    conn = ackmq.pika()
    ch = conn.channel()
    assert drain_ints(ch, plain) == list(range(300))
    assert drain_ints(ch, prio) == sorted(range(300), key=lambda i: (-(i % 3), i))
    conn.close()


def test_B3_unconfirmed_flood_is_bounded(tmp_path: Path) -> None:
    """The flood command's short run: 150 MB unconfirmed at an ackmq with a 160 MiB
    watermark. Every message is taken and the broker's RSS never passes the watermark +
    32 MiB (queues page to the spill past half of it; the alarm blocks the rest)."""
    from tools.robustness.flood import flood
    b = BrokerProcess(tmp_path / "data", "--no-stomp", "--memory-high-watermark", "160MiB")
    b.start()
    try:
        assert b.proc is not None
        res = flood(b.url, b.proc.pid, 150_000_000, progress=False)
    finally:
        b.stop()
    assert res.queued == res.messages
    assert res.peak_rss <= 160 * MiB + 32 * MiB, res.peak_rss / MiB


def test_U5_bad_limits_are_answered_with_what_to_fix(ackmq: Target, tmp_path: Path) -> None:
    r = ackmq.ctl("set_vm_memory_high_watermark", "1.5")
    assert r.returncode == 65 and "fraction between 0.0 and 1.0" in r.stderr, r.stderr
    r = ackmq.ctl("set_disk_free_limit", "lots")
    assert r.returncode == 65 and "not an amount" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "ackmq", "serve", "--data-dir",
                        str(tmp_path / "d2"), "--memory-high-watermark", "2XB"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--memory-high-watermark" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr + "".join(ackmq.broker.log if ackmq.broker else [])


def test_U5_lowlevel_on_blocked_sees_blocked_and_unblocked(target: Target) -> None:
    """ackmq.client.lowlevel's `on_blocked` hook (the flood's view of the alarm): a
    publish during an alarm gets (True, RabbitMQ's reason), the clear (False, "")."""
    import asyncio

    from ackmq.client.lowlevel import open_connection

    q = f"alarm-lowlevel-{target.name}"
    _queue(target, q)

    async def run() -> tuple[list[tuple[bool, str]], bool]:
        conn = await open_connection(target.url)
        seen: list[tuple[bool, str]] = []
        conn.on_blocked = lambda blocked, reason: seen.append((blocked, reason))
        ch = await conn.channel()

        async def until(n: int) -> None:
            deadline = time.monotonic() + 10
            while len(seen) < n and time.monotonic() < deadline:
                await asyncio.sleep(0.05)

        await asyncio.to_thread(target.memory_alarm, True)
        try:
            conn.write(ch.publish_bytes("", q, b"during"))
            await until(1)
            during = conn.blocked
        finally:
            await asyncio.to_thread(target.memory_alarm, False)
        await until(2)
        await conn.close()
        return seen, during

    try:
        seen, during = asyncio.run(run())
        assert seen == [(True, "low on memory"), (False, "")]
        assert during
    finally:
        _delete(target, q)
