"""Client code written for RabbitMQ's other queue types and its message checks."""

from __future__ import annotations

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker


def test_quorum_queue_declare_accepted_and_works(connection, qname: str) -> None:
    ch = connection.channel()
    ch.queue_declare(qname, durable=True, arguments={"x-queue-type": "quorum"})
    ch.confirm_delivery()
    ch.basic_publish("", qname, b"q", pika.BasicProperties(delivery_mode=2))
    m, _p, body = ch.basic_get(qname, auto_ack=True)
    assert body == b"q"
    ch.queue_delete(qname)


def test_quorum_queue_must_be_durable_406(connection, qname: str) -> None:
    ch = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare(qname, durable=False, arguments={"x-queue-type": "quorum"})
    assert info.value.reply_code == 406
    assert info.value.reply_text == (f"PRECONDITION_FAILED - invalid property 'non-durable' "
                                     f"for queue '{qname}' in vhost '/'")


def test_unknown_delivery_mode_406(connection, qname: str) -> None:
    ch = connection.channel()
    ch.queue_declare(qname, exclusive=True)
    ch.basic_publish("", qname, b"x", pika.BasicProperties(delivery_mode=7))
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare(qname, passive=True)
    assert info.value.reply_code == 406
    assert info.value.reply_text == "PRECONDITION_FAILED - invalid message: {delivery_mode_unknown,7}"
