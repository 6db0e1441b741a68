"""The hot-path modules compiled with mypyc (setup.py); the one list, read by the guard."""

NATIVE: tuple[str, ...] = (
    "ackmq.protocol.amqp.decoder",
    "ackmq.protocol.amqp.encoder",
    "ackmq.protocol.amqp.properties",
    "ackmq.broker.confirms",
    "ackmq.broker.consumer",
    "ackmq.broker.operations",
    "ackmq.broker.message",
    "ackmq.broker.readylist",
    "ackmq.broker.queue",
    "ackmq.broker.channel",
    "ackmq.broker.exchange",
    "ackmq.broker.queue_type",
    "ackmq.broker.vhost",
    "ackmq.protocol.stream.frames",
    "ackmq.protocol.stream.chunk",
    "ackmq.protocol.stream.messages",
    "ackmq.store.streamlog",
    "ackmq.server.stream.chunks",
)
