"""Scheduled delivery bounded (issue 34 item 3; SPEC L5, B1, U6): what one STOMP SEND with
ActiveMQ's AMQ_SCHEDULED_* headers may ask for, when its schedule ends, and how the jobs
are listed and cancelled (ctl, /api/scheduled, ActiveMQ.Scheduler.Management over STOMP).

Against c35dcba: `AMQ_SCHEDULED_DELAY:0` + `AMQ_SCHEDULED_REPEAT:50000` made 50,001
messages, `AMQ_SCHEDULED_PERIOD:1` + a huge repeat fired ~1,000 a second for ever, a
schedule outlived its queue, exchange and user (and a restart), and nothing listed or
cancelled it. Each test here fails there. The model's rules have unit tests at the end.
"""

from __future__ import annotations

import html
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
import stomp
from conftest import BrokerProcess
from support.mgmthelp import Target, q
from support.uihelp import ui_call

from ackmq.broker import BrokerModel, NullScheduler, scheduled
from ackmq.broker.errors import SoftError
from ackmq.broker.scheduled import Bounds, ScheduleError, parse
from ackmq.protocol.amqp.properties import encode_fields

QUIET = 2.6  # > 2 periods of 1 s: a schedule still alive fires at least twice in this


class Listener(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.msgs: list[tuple[dict[str, str], str]] = []
        self.errors: list[tuple[dict[str, str], str]] = []

    def on_message(self, frame: Any) -> None:
        self.msgs.append((dict(frame.headers), frame.body))

    def on_error(self, frame: Any) -> None:
        self.errors.append((dict(frame.headers), frame.body))


class Broker:
    def __init__(self, proc: BrokerProcess) -> None:
        self.proc = proc
        self.http = ""
        self.started()

    def started(self) -> None:
        line = next(x for x in reversed(self.proc.log) if "listening on" in x)
        self.http = self.http_url = line.split(" and ")[-1].split(" ")[0]
        self.api = Target("ackmq", self.http, self.proc.url)

    def stomp(self, user: str = "guest", pw: str = "guest", vhost: str = "/"
              ) -> tuple[Any, Listener]:
        c = stomp.Connection12([("127.0.0.1", self.proc.stomp_port)], vhost=vhost)
        lst = Listener()
        c.set_listener("", lst)
        c.connect(user, pw, wait=True)
        return c, lst

    def pika(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.URLParameters(self.proc.url))

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ackmq", "ctl", "--data-dir",
                               str(self.proc.data_dir), *args], capture_output=True,
                              text=True, timeout=60)


def _start(data: Path) -> Broker:
    p = BrokerProcess(data, "--http-port", "0", "--prometheus-port", "0")
    p.start()
    return Broker(p)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = _start(tmp_path_factory.mktemp("sched-bounds"))
    yield b
    b.proc.stop()


def _name(prefix: str) -> str:
    return f"{prefix}.{time.time_ns()}"


def _wait(pred: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return bool(pred())


def _drain(ch: Any, queue: str) -> int:
    n = 0
    while ch.basic_get(queue, auto_ack=True)[0] is not None:
        n += 1
    return n


REPEATING = {"AMQ_SCHEDULED_DELAY": "0", "AMQ_SCHEDULED_PERIOD": "1000",
             "AMQ_SCHEDULED_REPEAT": "100"}


# -- the bounds (B1) ------------------------------------------------------------------

@pytest.mark.parametrize("headers, text", [
    ({"AMQ_SCHEDULED_DELAY": "0", "AMQ_SCHEDULED_REPEAT": "50000"},
     "AMQ_SCHEDULED_REPEAT 50000 is above this broker's limit of 1000 repeats"),
    ({"AMQ_SCHEDULED_PERIOD": "1", "AMQ_SCHEDULED_REPEAT": "9223372036854775806"},
     "AMQ_SCHEDULED_REPEAT 9223372036854775806 is above this broker's limit of 1000"),
    ({"AMQ_SCHEDULED_PERIOD": "1", "AMQ_SCHEDULED_REPEAT": "10"},
     "AMQ_SCHEDULED_PERIOD 1 is below this broker's minimum of 1000 ms"),
    ({"AMQ_SCHEDULED_DELAY": "0", "AMQ_SCHEDULED_REPEAT": "10"},
     "AMQ_SCHEDULED_PERIOD 0 is below this broker's minimum of 1000 ms"),
], ids=["repeat_50000", "period_1_repeat_max_long", "period_1", "repeat_without_period"])
def test_L5_B1_unbounded_schedule_is_refused_and_nothing_is_sent(
        broker: Broker, headers: dict[str, str], text: str) -> None:
    """The issue's two SENDs (and a fast or period-less repeat): ERROR "Bad header" with
    the bound in its text, the connection closed, not one message made."""
    queue = _name("sched.refused")
    sub, got = broker.stomp()
    sub.subscribe(f"/queue/{queue}", id="1", ack="auto")
    time.sleep(0.2)
    c, lst = broker.stomp()
    c.send(f"/queue/{queue}", "x", headers=headers)
    assert _wait(lambda: lst.errors)
    assert lst.errors[0][0]["message"] == "Bad header"
    assert text in lst.errors[0][1]
    assert _wait(lambda: not c.is_connected())
    time.sleep(1.5)
    sub.disconnect()
    assert got.msgs == []


def test_L5_bounded_repeat_is_accepted(broker: Broker) -> None:
    """At the bounds (1,000 ms apart) a repeated SEND is scheduled as ActiveMQ does."""
    queue = _name("sched.ok")
    c, lst = broker.stomp()
    c.subscribe(f"/queue/{queue}", id="1", ack="auto")
    c.send(f"/queue/{queue}", "x", headers={"AMQ_SCHEDULED_DELAY": "0",
                                             "AMQ_SCHEDULED_PERIOD": "1000",
                                             "AMQ_SCHEDULED_REPEAT": "1"})
    assert _wait(lambda: len(lst.msgs) == 2)
    c.disconnect()
    assert not lst.errors
    assert "x-ackmq-scheduled-by" not in lst.msgs[0][0]  # the broker's mark stays inside


# -- a schedule ends with its destination or its user --------------------------------

def test_L5_schedule_ends_when_its_queue_is_deleted(broker: Broker) -> None:
    queue = _name("sched.q")
    c, lst = broker.stomp()
    c.subscribe(f"/queue/{queue}", id="1", ack="auto")
    c.send(f"/queue/{queue}", "tick", headers=REPEATING)
    assert _wait(lambda: lst.msgs)
    c.disconnect()
    assert broker.api.call("DELETE", f"/api/queues/%2F/{q(queue)}").status == 204
    conn = broker.pika()
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)  # the same name again: the schedule is gone
    time.sleep(QUIET)
    n = _drain(ch, queue)
    conn.close()
    assert n == 0
    assert broker.api.call("GET", "/api/scheduled/%2F").body == []


def test_L5_schedule_ends_when_its_exchange_is_deleted(broker: Broker) -> None:
    x, queue = _name("sched.x"), _name("sched.xq")
    conn = broker.pika()
    ch = conn.channel()
    ch.exchange_declare(x, "direct")
    ch.queue_declare(queue)
    ch.queue_bind(queue, x, "k")
    c, _ = broker.stomp()
    c.send(f"/exchange/{x}/k", "tick", headers=REPEATING)
    assert _wait(lambda: ch.basic_get(queue, auto_ack=True)[0] is not None)
    c.disconnect()
    ch.exchange_delete(x)
    ch.exchange_declare(x, "direct")  # the same name again, bound again
    ch.queue_bind(queue, x, "k")
    time.sleep(QUIET)
    n = _drain(ch, queue)
    conn.close()
    assert n == 0


def test_L5_schedule_ends_when_its_user_is_deleted(broker: Broker) -> None:
    user, queue = _name("sched-user"), _name("sched.uq")
    assert broker.api.call("PUT", f"/api/users/{user}",
                           {"password": "pw", "tags": ""}).status == 201
    assert broker.api.call("PUT", f"/api/permissions/%2F/{user}",
                           {"configure": ".*", "write": ".*", "read": ".*"}).status == 201
    conn = broker.pika()
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    c, _ = broker.stomp(user, "pw")
    c.send(f"/queue/{queue}", "tick", headers=REPEATING)
    assert _wait(lambda: ch.basic_get(queue, auto_ack=True)[0] is not None)
    assert broker.api.call("DELETE", f"/api/users/{user}").status == 204
    _drain(ch, queue)
    time.sleep(QUIET)
    n = _drain(ch, queue)
    conn.close()
    assert n == 0


def test_L5_restart_does_not_resume_a_schedule_whose_queue_was_deleted(
        tmp_path: Path) -> None:
    """A persistent schedule survives restarts (L2) — but not once its queue is gone."""
    b = _start(tmp_path / "data")
    try:
        queue = _name("sched.restart")
        c, _ = b.stomp()
        c.send(f"/queue/{queue}", "tick", headers={
            "AMQ_SCHEDULED_DELAY": "3000", "AMQ_SCHEDULED_PERIOD": "1000",
            "AMQ_SCHEDULED_REPEAT": "100", "persistent": "true"}, receipt="r1")
        time.sleep(0.3)
        c.disconnect()
        assert b.api.call("DELETE", f"/api/queues/%2F/{q(queue)}").status == 204
        b.proc.kill()
        b.proc.start()
        b.started()
        conn = b.pika()
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        time.sleep(3.0 + QUIET)
        n = _drain(ch, queue)
        conn.close()
        assert n == 0
        assert b.api.call("GET", "/api/scheduled/%2F").body == []
    finally:
        b.proc.stop()


# -- listed and cancelled ---------------------------------------------------------------

def _scheduled_job(broker: Broker, queue: str, user: str = "guest", pw: str = "guest",
                   delay: str = "0") -> tuple[Any, Listener, str]:
    """A repeating job on `queue` whose first copy (delay 0) gave away its id."""
    c, lst = broker.stomp(user, pw)
    c.subscribe(f"/queue/{queue}", id="1", ack="auto")
    c.send(f"/queue/{queue}", "tick", headers={**REPEATING, "AMQ_SCHEDULED_DELAY": delay})
    assert _wait(lambda: lst.msgs)
    return c, lst, lst.msgs[0][0]["scheduledJobId"]


def _quiet_after(c: Any, lst: Listener) -> int:
    """How many copies still arrive in QUIET once the job is cancelled."""
    time.sleep(0.3)
    before = len(lst.msgs)
    time.sleep(QUIET)
    c.disconnect()
    return len(lst.msgs) - before


def test_L5_ctl_lists_and_deletes_a_scheduled_message(broker: Broker) -> None:
    queue = _name("sched.ctl")
    c, lst, job = _scheduled_job(broker, queue)
    r = broker.ctl("list_scheduled_messages", "-p", "/")
    assert r.returncode == 0, r.stderr
    assert 'Listing scheduled messages for vhost "/" ...' in r.stdout
    row = next(line for line in r.stdout.splitlines() if job in line)
    assert queue in row and "guest" in row
    r = broker.ctl("delete_scheduled_message", "-p", "/", job)
    assert r.returncode == 0, r.stderr
    assert _quiet_after(c, lst) == 0
    assert job not in broker.ctl("list_scheduled_messages").stdout
    r = broker.ctl("delete_scheduled_message", job)
    assert r.returncode == 69
    assert "does not exist" in r.stderr


def test_L5_api_lists_and_deletes_a_scheduled_message(broker: Broker) -> None:
    queue = _name("sched.api")
    c, lst, job = _scheduled_job(broker, queue)
    jobs = broker.api.call("GET", "/api/scheduled/%2F").body
    mine = [j for j in jobs if j["id"] == job]
    assert len(mine) == 1
    assert mine[0]["routing_key"] == queue and mine[0]["exchange"] == ""
    assert mine[0]["user"] == "guest" and mine[0]["period"] == 1000
    assert mine[0]["repeat"] == 100 and mine[0]["vhost"] == "/"
    assert any(j["id"] == job for j in broker.api.call("GET", "/api/scheduled").body)
    assert broker.api.call("DELETE", f"/api/scheduled/%2F/{q(job)}").status == 204
    assert _quiet_after(c, lst) == 0
    assert broker.api.call("DELETE", f"/api/scheduled/%2F/{q(job)}").status == 404
    assert not [j for j in broker.api.call("GET", "/api/scheduled/%2F").body
                if j["id"] == job]


def test_L5_ui_lists_and_cancels_a_scheduled_message(broker: Broker) -> None:
    """Admin → Scheduled messages: the job with its id, a Cancel button that ends it."""
    queue = _name("sched.ui")
    c, lst = broker.stomp()
    c.send(f"/queue/{queue}", "later", headers={"AMQ_SCHEDULED_DELAY": "60000"},
           receipt="u1")
    time.sleep(0.3)
    c.disconnect()
    job = next(j["id"] for j in broker.api.call("GET", "/api/scheduled/%2F").body
               if j["routing_key"] == queue)
    assert 'href="/scheduled"' in ui_call(broker, "GET", "/admin")[2]
    status, _, page = ui_call(broker, "GET", "/scheduled")
    assert status == 200 and 'id="scheduled"' in page
    assert html.escape(job) in page and queue in page
    status, headers, _ = ui_call(broker, "POST", "/scheduled/delete",
                                 form={"vhost": "/", "id": job})
    assert status == 303
    done = html.unescape(ui_call(broker, "GET", headers["location"])[2])
    assert f"Scheduled message {job} cancelled" in done
    assert not [j for j in broker.api.call("GET", "/api/scheduled/%2F").body
                if j["id"] == job]


MANAGEMENT = "/topic/ActiveMQ.Scheduler.Management"


def test_L5_stomp_scheduler_management_browse_and_remove(broker: Broker) -> None:
    """ActiveMQ's BROWSE (each job to the reply-to, with scheduledJobId) and REMOVE."""
    queue, reply = _name("sched.mgmt"), _name("sched.reply")
    c, lst = broker.stomp()
    c.subscribe(f"/queue/{reply}", id="r", ack="auto")
    c.send(f"/queue/{queue}", "later", headers={"AMQ_SCHEDULED_DELAY": "60000",
                                                 "custom": "kept"}, receipt="s1")
    c.send(MANAGEMENT, "", headers={"AMQ_SCHEDULER_ACTION": "BROWSE",
                                    "reply-to": f"/queue/{reply}"}, receipt="b1")
    assert _wait(lambda: lst.msgs)
    time.sleep(0.3)
    assert len(lst.msgs) == 1
    h, body = lst.msgs[0]
    assert body == "later" and h["custom"] == "kept"
    assert h["AMQ_SCHEDULED_DELAY"] == "60000"  # as ActiveMQ: the job as it was sent
    job = h["scheduledJobId"]
    assert job
    c.send(MANAGEMENT, "", headers={"AMQ_SCHEDULER_ACTION": "REMOVE",
                                    "scheduledJobId": job}, receipt="d1")
    time.sleep(0.3)
    assert not [j for j in broker.api.call("GET", "/api/scheduled/%2F").body
                if j["id"] == job]
    c.send(MANAGEMENT, "", headers={"AMQ_SCHEDULER_ACTION": "BROWSE",
                                    "reply-to": f"/queue/{reply}"}, receipt="b2")
    time.sleep(0.5)
    c.disconnect()
    assert len(lst.msgs) == 1 and not lst.errors


def test_L5_stomp_scheduler_management_removeall_takes_only_the_callers_jobs(
        broker: Broker) -> None:
    """REMOVEALL cancels the caller's jobs; another user's job in the vhost stays (a
    STOMP client manages only what it scheduled)."""
    user, queue = _name("sched-other"), _name("sched.all")
    broker.api.call("PUT", f"/api/users/{user}", {"password": "pw", "tags": ""})
    broker.api.call("PUT", f"/api/permissions/%2F/{user}",
                    {"configure": ".*", "write": ".*", "read": ".*"})
    try:
        other, _ = broker.stomp(user, "pw")
        other.send(f"/queue/{queue}", "theirs", headers={"AMQ_SCHEDULED_DELAY": "60000"},
                   receipt="o1")
        c, lst = broker.stomp()
        for i in range(2):
            c.send(f"/queue/{queue}", f"mine{i}", headers={"AMQ_SCHEDULED_DELAY": "60000"},
                   receipt=f"m{i}")
        time.sleep(0.3)

        def users() -> list[str]:
            return sorted(j["user"] for j in broker.api.call("GET", "/api/scheduled/%2F").body
                          if j["routing_key"] == queue)
        assert users() == sorted(["guest", "guest", user])
        c.send(MANAGEMENT, "", headers={"AMQ_SCHEDULER_ACTION": "REMOVEALL"}, receipt="x")
        assert _wait(lambda: users() == [user])
        c.send(MANAGEMENT, "", headers={"AMQ_SCHEDULER_ACTION": "REMOVE",
                                        "scheduledJobId": "ID:nothing"}, receipt="y")
        time.sleep(0.3)
        assert not lst.errors
        c.disconnect()
        other.disconnect()
    finally:
        broker.api.call("DELETE", f"/api/users/{user}")


# -- the vhost limit (U6) -----------------------------------------------------------------

def test_U6_max_scheduled_messages_vhost_limit_refuses_the_next_schedule(
        broker: Broker) -> None:
    vhost = _name("sched-vh")
    assert broker.api.call("PUT", f"/api/vhosts/{vhost}").status == 201
    try:
        broker.api.call("PUT", f"/api/permissions/{vhost}/guest",
                        {"configure": ".*", "write": ".*", "read": ".*"})
        r = broker.api.call("PUT", f"/api/vhost-limits/{vhost}/max-scheduled-messages",
                            {"value": 1})
        assert r.status == 204, r.body
        c, lst = broker.stomp(vhost=vhost)
        c.send("/queue/lim", "one", headers={"AMQ_SCHEDULED_DELAY": "60000"}, receipt="1")
        c.send("/queue/lim", "two", headers={"AMQ_SCHEDULED_DELAY": "60000"}, receipt="2")
        assert _wait(lambda: lst.errors)
        h, body = lst.errors[0]
        assert h["message"] == "precondition_failed"
        assert (f"cannot schedule message: scheduled message limit in vhost '{vhost}' (1) "
                "is reached") in body
        assert len(broker.api.call("GET", f"/api/scheduled/{vhost}").body) == 1
        r2 = broker.ctl("set_vhost_limits", "-p", vhost, '{"max-scheduled-messages": 5}')
        assert r2.returncode == 0, r2.stderr
    finally:
        broker.api.call("DELETE", f"/api/vhosts/{vhost}")


# -- the model's rules (unit) -------------------------------------------------------------

def test_L5_bounds_rules() -> None:
    b = Bounds(max_repeat=3, min_period_ms=500)
    assert parse({"AMQ_SCHEDULED_PERIOD": "500", "AMQ_SCHEDULED_REPEAT": "3"}, b)
    assert parse({"AMQ_SCHEDULED_DELAY": "10"}, b)  # no repeat: no period needed
    assert parse({"AMQ_SCHEDULED_PERIOD": "10"}, b)  # one copy: the period is a delay
    assert parse({"AMQ_SCHEDULED_CRON": "* * * * *"}, b)
    with pytest.raises(ScheduleError, match="above this broker's limit of 3"):
        parse({"AMQ_SCHEDULED_PERIOD": "500", "AMQ_SCHEDULED_REPEAT": "4"}, b)
    with pytest.raises(ScheduleError, match="below this broker's minimum of 500 ms"):
        parse({"AMQ_SCHEDULED_PERIOD": "499", "AMQ_SCHEDULED_REPEAT": "1"}, b)
    # stored schedules are read without bounds (a lowered bound ends no running job)
    assert parse({"AMQ_SCHEDULED_PERIOD": "1", "AMQ_SCHEDULED_REPEAT": "9"}) is not None


class _Output:
    writable = True
    number = 1

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **kw: None


def _model() -> tuple[Any, Any, Any]:
    broker = BrokerModel(NullScheduler())
    broker.start()
    vh = broker.vhosts["/"]
    return broker, vh, broker.open_channel(vh, object(), _Output(), "alice")


def _send(ch: Any, key: str, **headers: str) -> None:
    ch.basic_publish("", key, False, False, encode_fields({"headers": {
        "AMQ_SCHEDULED_DELAY": "60000", **headers}}), b"m", True)


def test_L5_model_jobs_are_listed_cancelled_and_end_with_queue_or_user() -> None:
    broker, vh, ch = _model()
    for name in ("a", "b"):
        vh.declare_queue(name, False, False, False, False, {}, None)
    _send(ch, "a")
    _send(ch, "b")
    store = scheduled.existing(vh)
    assert store is not None
    jobs = store.jobs()
    assert [(j["routing_key"], j["user"]) for j in jobs] == [("a", "alice"), ("b", "alice")]
    assert store.cancel(scheduled.job_is(jobs[0]["id"])) == 1
    assert [j["routing_key"] for j in store.jobs()] == ["b"]
    assert store.by_dest == {("", "b"): 1} and store.by_user == {"alice": 1}
    vh.delete_queue(vh.queues["a"])  # none pending for it: nothing to read back
    assert store.message_count == 1
    vh.delete_queue(vh.queues["b"])
    assert store.jobs() == [] and store.message_count == 0
    assert not store.by_dest and not store.by_user
    vh.declare_queue("a", False, False, False, False, {}, None)
    _send(ch, "a")
    broker.user_deleted("bob")
    assert store.message_count == 1
    broker.user_deleted("alice")
    assert store.message_count == 0


def test_U6_model_max_scheduled_messages_counts_scheduled_and_delayed() -> None:
    broker, vh, ch = _model()
    vh.declare_queue("a", False, False, False, False, {}, None)
    broker.vhost_limit = lambda v, k: 1 if k == scheduled.LIMIT else None
    _send(ch, "a")
    with pytest.raises(SoftError, match=r"scheduled message limit in vhost '/' \(1\)"):
        _send(ch, "a")
    x = vh.declare_exchange("dx", "x-delayed-message", False, False, False, False,
                            {"x-delayed-type": "direct"})
    vh.bind("dx", vh.queues["a"], "a", {})
    assert x.timers is not None
    from ackmq.broker.message import Message
    held = Message("dx", "a", encode_fields({"headers": {"x-delay": 60000}}), b"d")
    assert x.timers.publish(held) is False  # refused: nacked, as reject-publish
    broker.vhost_limit = lambda v, k: None
    assert x.timers.publish(held) is True
