"""ackmq.client sessions: acknowledge modes, optimizeAcknowledge, prefetch, URL options
(SPEC J1–J5, J8, J9). Each test runs against ackmq and the reference RabbitMQ; the broker
(seen through pika) is the witness of what was acked."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from ackmq.client import AckMode, IllegalStateError, RedeliveryPolicy, connect, parse_url
from ackmq.client.options import parse_destination

if TYPE_CHECKING:
    from support.clienthelp import Witness

pytest_plugins = ["support.clienthelp"]

NO_DELAY = "jms.redeliveryPolicy.initialRedeliveryDelay=0&jms.redeliveryPolicy.redeliveryDelay=0"


def with_query(url: str, query: str) -> str:
    return url + ("&" if "?" in url else "?") + query


def test_J1_auto_acks_before_receive_returns(url: str, q: str, witness: Witness) -> None:
    witness.declare(q)
    witness.publish(q, b"1", b"2", b"3")
    conn = connect(url)
    c = conn.session(AckMode.AUTO).consumer(q)
    assert c.receive(timeout=2).body == b"1"
    assert c.receive(timeout=2).body == b"2"
    conn.abort()  # no close, no postponed acks: only what was acked stays acked
    witness.wait_ready(q, 1)
    assert [b for _, _, b in witness.drain(q)] == [b"3"]


def test_J1_client_acknowledge_acks_the_whole_session(url: str, q: str,
                                                      witness: Witness) -> None:
    qa, qb = q + ".a", q + ".b"
    for name in (qa, qb):
        witness.declare(name)
        witness.publish(name, b"1", b"2")
    conn = connect(url)
    s = conn.session(AckMode.CLIENT)
    ca, cb = s.consumer(qa), s.consumer(qb)
    ma = ca.receive(timeout=2)
    mb = cb.receive(timeout=2)
    assert (ma.body, mb.body) == (b"1", b"1")
    ma.acknowledge()  # acks mb too; the prefetched, never received "2"s stay unacked
    conn.abort()
    witness.wait_ready(qa, 1)
    witness.wait_ready(qb, 1)
    assert [b for _, _, b in witness.drain(qa)] == [b"2"]
    assert [b for _, _, b in witness.drain(qb)] == [b"2"]


def test_J1_consumer_acknowledge_acks_only_that_consumer(url: str, q: str,
                                                         witness: Witness) -> None:
    qa, qb = q + ".a", q + ".b"
    for name in (qa, qb):
        witness.declare(name)
        witness.publish(name, b"1", b"2")
    conn = connect(url)
    s = conn.session(AckMode.CLIENT)
    ca, cb = s.consumer(qa), s.consumer(qb)
    ca.receive(timeout=2)
    cb.receive(timeout=2)
    ca.acknowledge()
    conn.abort()
    witness.wait_ready(qa, 1)
    witness.wait_ready(qb, 2)


def test_J1_individual_acks_one_message(url: str, q: str, witness: Witness) -> None:
    witness.declare(q)
    witness.publish(q, b"1", b"2", b"3")
    conn = connect(url)
    c = conn.session(AckMode.INDIVIDUAL).consumer(q)
    got = [c.receive(timeout=2) for _ in range(3)]
    got[1].acknowledge()
    conn.abort()
    witness.wait_ready(q, 2)
    assert sorted(b for _, _, b in witness.drain(q)) == [b"1", b"3"]


def test_J1_dups_ok_acks_lazily_and_cumulatively(url: str, q: str, witness: Witness) -> None:
    witness.declare(q)
    witness.publish(q, *[str(i).encode() for i in range(20)])
    conn = connect(url)
    c = conn.session(AckMode.DUPS_OK).consumer(q + "?consumer.prefetchSize=10")
    for _ in range(4):
        assert c.receive(timeout=2) is not None
    conn.abort()  # 4 < 0.5 x 10: nothing acked yet, all 20 come back
    witness.wait_ready(q, 20)
    conn = connect(with_query(url, NO_DELAY))
    c = conn.session(AckMode.DUPS_OK).consumer(q + "?consumer.prefetchSize=10")
    for _ in range(5):
        assert c.receive(timeout=2) is not None
    conn.abort()  # the 5th reached 0.5 x prefetch: one cumulative ack for 5
    witness.wait_ready(q, 15)


def test_J1_transacted_commit_acks_and_publishes_together(url: str, q: str,
                                                          witness: Witness) -> None:
    out = q + ".out"
    witness.declare(q)
    witness.declare(out)
    witness.publish(q, b"a", b"b")
    with connect(url) as conn:
        t = conn.session(transacted=True)
        c = t.consumer(q)
        p = t.producer(out)
        assert c.receive(timeout=2).body == b"a"
        p.send(b"made from a")
        witness.stays(out, 0, 0.2)  # nothing visible before commit
        t.commit()
        witness.wait_ready(out, 1)
        conn.abort()
    witness.wait_ready(q, 1)  # "a" acked by the commit, "b" back from the prefetch
    assert [b for _, _, b in witness.drain(q)] == [b"b"]


def test_J1_transacted_rollback_discards_and_redelivers(url: str, q: str,
                                                        witness: Witness) -> None:
    out = q + ".out"
    witness.declare(q)
    witness.declare(out)
    witness.publish(q, b"a")
    with connect(with_query(url, NO_DELAY)) as conn:
        t = conn.session(transacted=True)
        c = t.consumer(q)
        first = c.receive(timeout=2)
        assert (first.body, first.redelivered, first.delivery_count) == (b"a", False, 1)
        t.producer(out).send(b"never")
        t.rollback()
        again = c.receive(timeout=2)
        assert (again.body, again.redelivered, again.delivery_count) == (b"a", True, 2)
        t.commit()
        witness.stays(out, 0, 0.2)
    witness.wait_ready(q, 0)


def test_J2_transacted_session_ignores_the_requested_mode(url: str) -> None:
    with connect(url) as conn:
        assert conn.session(AckMode.CLIENT, transacted=True).ack_mode == \
            AckMode.SESSION_TRANSACTED
        with pytest.raises(IllegalStateError, match="J2"):
            conn.session(AckMode.SESSION_TRANSACTED)
        with pytest.raises(IllegalStateError):
            conn.session(AckMode.AUTO).commit()


def test_J3_optimize_acknowledge_acks_at_65_percent(url: str, q: str,
                                                    witness: Witness) -> None:
    witness.declare(q)
    witness.publish(q, *[str(i).encode() for i in range(20)])
    conn = connect(with_query(url, "jms.optimizeAcknowledge=true"
                              "&jms.optimizeAcknowledgeTimeOut=60000"))
    c = conn.session(AckMode.AUTO).consumer(q + "?consumer.prefetchSize=10")
    for _ in range(6):
        c.receive(timeout=2)
    witness.stays(q, 10, 0.3)  # 6 < 6.5: no ack, the broker may not send more
    c.receive(timeout=2)       # the 7th: one cumulative ack for all 7
    witness.wait_ready(q, 3)
    conn.abort()


def test_J3_optimize_acknowledge_timeout_acks_the_rest(url: str, q: str,
                                                       witness: Witness) -> None:
    witness.declare(q)
    witness.publish(q, *[str(i).encode() for i in range(20)])
    conn = connect(with_query(url, "jms.optimizeAcknowledge=true"
                              "&jms.optimizeAcknowledgeTimeOut=200"))
    c = conn.session(AckMode.AUTO).consumer(q + "?consumer.prefetchSize=10")
    c.receive(timeout=2)  # the first ack of a consumer comes after the timeout too
    c.receive(timeout=2)
    witness.stays(q, 10, 0.05)
    time.sleep(0.25)
    c.receive(timeout=2)  # timeout passed since the last ack: ack all 3
    witness.wait_ready(q, 7)
    conn.abort()


def test_J3_optimize_acknowledge_is_for_auto_mode_only(url: str, q: str,
                                                       witness: Witness) -> None:
    witness.declare(q)
    witness.publish(q, *[str(i).encode() for i in range(20)])
    conn = connect(with_query(url, "jms.optimizeAcknowledge=true"))
    c = conn.session(AckMode.INDIVIDUAL).consumer(q + "?consumer.prefetchSize=10")
    for _ in range(8):
        c.receive(timeout=2)
    witness.stays(q, 10, 0.3)  # INDIVIDUAL: only acknowledge() acks
    conn.abort()


def test_J4_default_prefetch_is_1000(url: str, q: str, witness: Witness) -> None:
    witness.declare(q)
    witness.publish(q, *[b"m"] * 1010)
    conn = connect(url)
    c = conn.session(AckMode.INDIVIDUAL).consumer(q)
    assert c.prefetch == 1000
    c.receive(timeout=2)
    witness.wait_ready(q, 10)
    conn.abort()


def test_J4_prefetch_0_pulls_one_message_per_receive(url: str, q: str,
                                                     witness: Witness) -> None:
    witness.declare(q)
    witness.publish(q, b"1", b"2", b"3")
    with connect(url) as conn:
        c = conn.session(AckMode.INDIVIDUAL).consumer(q + "?consumer.prefetchSize=0")
        witness.stays(q, 3, 0.2)  # nothing prefetched
        m = c.receive(timeout=2)
        assert m.body == b"1"
        witness.wait_ready(q, 2)  # exactly one taken
        m.acknowledge()
        assert c.receive(timeout=2).body == b"2"
        assert c.receive(timeout=2).body == b"3"
        started = time.monotonic()
        assert c.receive(timeout=0.3) is None
        assert 0.25 <= time.monotonic() - started < 2


def test_J4_a_listener_needs_prefetch_of_at_least_1(url: str, q: str) -> None:
    with connect(url) as conn:
        s = conn.session()
        with pytest.raises(IllegalStateError, match="J4"):
            s.consumer(q + "?consumer.prefetchSize=0", listener=lambda m: None)
        c = s.consumer(q + "?consumer.prefetchSize=0")
        with pytest.raises(IllegalStateError, match="J4"):
            c.set_listener(lambda m: None)


def test_J5_receive_and_listener_do_not_mix(url: str, q: str) -> None:
    with connect(url) as conn:
        s = conn.session()
        pushed = s.consumer(q, listener=lambda m: None)
        with pytest.raises(IllegalStateError, match="J5"):
            pushed.receive(timeout=0.1)
        pulled = s.consumer(q)
        assert pulled.receive(timeout=0.05) is None
        with pytest.raises(IllegalStateError, match="J5"):
            pulled.set_listener(lambda m: None)


def test_J8_client_mode_receives_up_to_one_and_a_half_prefetch(url: str, q: str,
                                                              witness: Witness) -> None:
    witness.declare(q)
    witness.publish(q, *[str(i).encode() for i in range(30)])
    conn = connect(url)
    c = conn.session(AckMode.CLIENT).consumer(q + "?consumer.prefetchSize=10")
    got = [c.receive(timeout=2) for _ in range(15)]
    assert all(m is not None for m in got)
    assert c.receive(timeout=0.3) is None  # 15 = 1.5 x 10 unacked: must acknowledge now
    witness.wait_ready(q, 15)
    got[-1].acknowledge()
    assert c.receive(timeout=2) is not None
    conn.abort()


def test_J8_other_modes_keep_the_plain_prefetch(url: str, q: str, witness: Witness) -> None:
    witness.declare(q)
    witness.publish(q, *[str(i).encode() for i in range(30)])
    conn = connect(url)
    c = conn.session(AckMode.INDIVIDUAL).consumer(q + "?consumer.prefetchSize=10")
    assert all(c.receive(timeout=2) is not None for _ in range(10))
    assert c.receive(timeout=0.3) is None
    witness.wait_ready(q, 20)
    conn.abort()


def test_J9_url_options_as_activemq_users_write_them() -> None:
    o = parse_url("amqp://u:p%40ss@broker:5673/v%2Fh?jms.optimizeAcknowledge=true"
                  "&jms.optimizeAcknowledgeTimeOut=30000"
                  "&jms.redeliveryPolicy.maximumRedeliveries=6"
                  "&jms.redeliveryPolicy.useExponentialBackOff=true"
                  "&jms.prefetchPolicy.queuePrefetch=12")
    assert (o.host, o.port, o.username, o.password, o.vhost) == \
        ("broker", 5673, "u", "p@ss", "v/h")
    assert o.optimize_acknowledge and o.optimize_acknowledge_timeout == 30000
    assert o.queue_prefetch == 12
    assert o.redelivery_policy == RedeliveryPolicy(maximum_redeliveries=6,
                                                   use_exponential_back_off=True)
    assert parse_url("amqp://h/").vhost == "/"
    with pytest.raises(ValueError, match="jms.prefetchPolicy.queuePrefetch"):
        parse_url("amqp://h/?jms.prefetchPolicy.queuePrefech=1")  # a typo is an error
    d = parse_destination("orders?consumer.prefetchSize=10")
    assert (d.kind, d.name, d.prefetch) == ("queue", "orders", 10)
    assert parse_destination("topic://a.b").kind == "topic"
    with pytest.raises(ValueError):
        parse_destination("orders?consumer.prefetchSise=1")


def test_J9_destination_prefetch_wins_over_the_url(url: str, q: str,
                                                   witness: Witness) -> None:
    witness.declare(q)
    witness.publish(q, *[b"m"] * 20)
    conn = connect(with_query(url, "jms.prefetchPolicy.queuePrefetch=5"))
    s = conn.session(AckMode.INDIVIDUAL)
    c = s.consumer(q)
    assert c.receive(timeout=2) is not None
    witness.wait_ready(q, 15)  # the URL's 5
    c2 = s.consumer(q + "?consumer.prefetchSize=2")
    assert c2.receive(timeout=2) is not None
    witness.wait_ready(q, 13)  # the destination's 2
    conn.abort()


def test_J4_receive_with_timeout_0_takes_what_has_arrived(url: str, q: str,
                                                          witness: Witness) -> None:
    """receiveNoWait(): no waiting, but what the broker already sent counts."""
    witness.declare(q)
    with connect(url) as conn:
        c = conn.session().consumer(q)
        assert c.receive(timeout=0) is None
        for i in range(3):
            witness.publish(q, str(i).encode())
            time.sleep(0.2)  # in our socket, read by nobody yet
            m = c.receive(timeout=0)
            assert m is not None and m.body == str(i).encode()


def test_message_fields_and_the_broker_added_headers(url: str, q: str) -> None:
    """headers are the publisher's; ackmq's x-ackmq-seq / x-delivery-count (asked for by
    the consume arguments) show as seq and delivery_count instead."""
    with connect(url) as conn:
        s = conn.session(AckMode.CLIENT)
        s.producer(q).send(b"body", headers={"k": "v", "n": 1}, content_type="text/plain",
                           correlation_id="c-1", message_id="m-1")
        m = s.consumer(q).receive(timeout=2)
        assert (m.body, m.headers, m.message_id) == (b"body", {"k": "v", "n": 1}, "m-1")
        assert m.properties["content_type"] == "text/plain"
        assert m.properties["correlation_id"] == "c-1"
        assert m.properties["delivery_mode"] == 2
        assert (m.redelivered, m.delivery_count) == (False, 1)
        if conn.is_ackmq:
            assert isinstance(m.seq, int) and m.seq > 0
        else:
            assert m.seq is None
        m.acknowledge()
