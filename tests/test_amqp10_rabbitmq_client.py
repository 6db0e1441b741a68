"""The management node `/management` (SPEC A7) with RabbitMQ 4's own Python client,
rabbitmq-amqp-python-client: declare an exchange and a queue, bind, publish with
per-message outcomes, queue info, purge, unbind, delete.

That client refuses any server whose `product` is not "RabbitMQ" at version 4 or later
(`Connection._validate_server_properties`); ackmq does not claim to be RabbitMQ, so the
test turns that one check off. Nothing else of the client is changed."""

from __future__ import annotations

import pytest
from conftest import BrokerProcess
from support.amqp10help import uniq

rc = pytest.importorskip("rabbitmq_amqp_python_client")
import rabbitmq_amqp_python_client.connection as rconn  # noqa: E402
from rabbitmq_amqp_python_client import (  # noqa: E402
    AddressHelper,
    ClassicQueueSpecification,
    Converter,
    Environment,
    ExchangeSpecification,
    ExchangeToQueueBindingSpecification,
    Message,
)
from rabbitmq_amqp_python_client.exceptions import ValidationCodeException  # noqa: E402


@pytest.fixture(scope="module")
def ackmq_broker(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    b = BrokerProcess(tmp_path_factory.mktemp("a7"), "--no-stomp", "--amqp10-rabbitmq-compat")
    b.start()
    yield b
    b.stop()


@pytest.fixture
def client(ackmq_broker):  # type: ignore[no-untyped-def]
    """The client as its users run it: no patch (the broker announces RabbitMQ 4)."""
    env = Environment(uri=f"amqp://guest:guest@127.0.0.1:{ackmq_broker.port}/")
    conn = env.connection()
    conn.dial()
    yield conn
    conn.close()
    env.close()


def test_A7_management_node_declares_binds_purges_deletes(client) -> None:  # type: ignore[no-untyped-def]
    x, q = uniq("a7-x"), uniq("a7-q")
    m = client.management()
    try:
        m.declare_exchange(ExchangeSpecification(name=x))
        m.declare_queue(ClassicQueueSpecification(name=q))
        path = m.bind(ExchangeToQueueBindingSpecification(source_exchange=x,
                                                          destination_queue=q,
                                                          binding_key="k"))
        pub = client.publisher(AddressHelper.exchange_address(x, "k"))
        states = [pub.publish(Message(body=Converter.string_to_bytes(f"m{i}"))).remote_state
                  for i in range(3)]
        pub.close()
        assert states == [36, 36, 36]  # accepted (0x24)
        info = m.queue_info(q)
        assert (info.name, info.message_count, info.is_durable) == (q, 3, True)
        assert m.purge_queue(q) == 3
        m.unbind(path)
        # a declaration that differs from the queue there -> 409 (ErrPreconditionFailed)
        with pytest.raises(ValidationCodeException):
            m.declare_queue(ClassicQueueSpecification(name=q, is_durable=False))
        with pytest.raises(ValidationCodeException):  # 404
            m.queue_info(uniq("a7-missing"))
    finally:
        m.delete_queue(q)
        m.delete_exchange(x)
        m.close()


def test_A7_the_client_works_with_plain_ackmq_serve_and_refuses_without_the_compat(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """rabbitmq-amqp-python-client refuses any server that is not "RabbitMQ" >= 4.0:
    `ackmq serve` as the quick start runs it announces RabbitMQ 4.0.0+ackmq (the client
    dials), and with --no-amqp10-rabbitmq-compat ackmq names itself and the client
    refuses it (docs/amqp10.md)."""
    b = BrokerProcess(tmp_path_factory.mktemp("a7-default"), "--no-stomp")
    b.start()
    try:
        env = Environment(uri=f"amqp://guest:guest@127.0.0.1:{b.port}/")
        conn = env.connection()
        conn.dial()
        conn.close()
        env.close()
    finally:
        b.stop()
    b = BrokerProcess(tmp_path_factory.mktemp("a7-plain"), "--no-stomp",
                      "--no-amqp10-rabbitmq-compat")
    b.start()
    try:
        env = Environment(uri=f"amqp://guest:guest@127.0.0.1:{b.port}/")
        from rabbitmq_amqp_python_client.exceptions import ValidationCodeException
        with pytest.raises(ValidationCodeException, match="non-RabbitMQ server"):
            env.connection().dial()
        env.close()
        assert rconn.Connection._validate_server_properties  # the check this is about
    finally:
        b.stop()
