"""The workload registry: names are part of the CLI contract."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ackmq.bench import (
    amqp10_load,
    clients,
    confirms,
    latency,
    memory,
    mqtt_load,
    stomp_load,
    stream_load,
    throughput,
)
from ackmq.bench.context import RunContext


@dataclass(frozen=True)
class Workload:
    name: str
    run: Callable[[RunContext], None]
    summary: str
    stomp: bool = False  # a STOMP workload: runs against the brokers' STOMP listeners
    # an AMQP 1.0 workload: the AMQP brokers' port, run when named (not by default: a
    # 0-9-1-only broker has no 1.0)
    amqp10: bool = False
    # a stream-protocol workload: the AMQP brokers' stream listeners (ackmq's own, RabbitMQ's
    # plugin on 5552), run when named
    stream: bool = False
    # an MQTT workload: the brokers' MQTT listeners (--mqtt: ackmq, Mosquitto, RabbitMQ's
    # plugin), run with --mqtt or when named
    mqtt: bool = False


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("confirms-individual", confirms.confirms_individual,
             "persistent msgs, ackmq.client send(): wait for each confirm (total ms, lower better)"),
    Workload("confirms-batch", confirms.confirms_batch,
             "persistent msgs in batches of 100, wait for each batch (total ms, lower better)"),
    Workload("confirms-async", confirms.confirms_async,
             "persistent msgs pipelined, confirms tracked async (total ms, lower better)"),
    Workload("tx", confirms.tx,
             "persistent msgs, tx.commit per message / per 100, n each (total ms, lower better)"),
    Workload("publish", throughput.publish,
             "transient 100-byte msgs, no confirms (msgs/s, higher better)"),
    Workload("consume-auto", throughput.consume_auto,
             "drain a pre-filled queue with no-ack (msgs/s, higher better)"),
    Workload("consume-prefetch", throughput.consume_prefetch,
             "drain with manual acks at each --prefetch, n each (msgs/s, higher better)"),
    Workload("latency", latency.latency,
             "publish→deliver and publish→confirm percentiles at --rate (ms, lower better)"),
    Workload("memory", memory.memory,
             "broker RSS growth per queued 100-byte message (bytes/msg, lower better)"),
    Workload("fanout", throughput.fanout,
             "n publishes, each to 10 queues with 10 consumers (deliveries/s, higher better)"),
    Workload("client-publish", clients.client_publish,
             "J10 strategies, ackmq.client vs pika vs aio-pika, persistent msgs, n each "
             "(msgs/s higher better; cpu µs/msg; ÷ = ratio between clients)"),
    Workload("client-consume", clients.client_consume,
             "ackmq.client receive() per ack mode, optimizeAcknowledge off/on, n each "
             "(msgs/s, higher better)"),
    Workload("client-prefetch-ext", clients.client_prefetch_ext,
             "J8: CLIENT mode acking every P, window 1.5P vs P, n each (msgs/s, higher better)"),
    Workload("amqp10-send-outcome", amqp10_load.send_outcome,
             "AMQP 1.0: durable transfers, wait for each outcome (total ms, lower better)",
             amqp10=True),
    Workload("amqp10-send-stream", amqp10_load.send_stream,
             "AMQP 1.0: durable transfers within link credit, outcomes awaited at the end "
             "(msgs/s, higher better)", amqp10=True),
    Workload("amqp10-receive", amqp10_load.receive,
             "AMQP 1.0: drain a pre-filled queue with link credit 500, accepting in ranges "
             "(msgs/s, higher better)", amqp10=True),
    Workload("stream-publish", stream_load.publish,
             "stream protocol: Publish frames of 100 within 10,000 unconfirmed, every "
             "confirm awaited (msgs/s, higher better)", stream=True),
    Workload("stream-consume", stream_load.consume,
             "stream protocol: a pre-filled stream read from first, credit 10, one back per "
             "chunk (msgs/s, higher better)", stream=True),
    Workload("stomp-send-receipt", stomp_load.send_receipt,
             "persistent SEND to a durable queue, wait for each RECEIPT (total ms, lower better)",
             stomp=True),
    Workload("stomp-send-stream", stomp_load.send_stream,
             "persistent SENDs pipelined, one RECEIPT at the end (msgs/s, higher better)",
             stomp=True),
    Workload("stomp-consume-ci", stomp_load.consume_individual,
             "drain with ack:client-individual at each --stomp-prefetch, n each (msgs/s, "
             "higher better)", stomp=True),
    Workload("stomp-consume-auto", stomp_load.consume_auto,
             "drain a pre-filled queue with ack:auto (msgs/s, higher better)", stomp=True),
    Workload("mqtt-publish-qos0", mqtt_load.publish_qos0,
             "MQTT: QoS 0 PUBLISHes, timed until one QoS 0 subscriber has them all "
             "(msgs/s in -> out, higher better)", mqtt=True),
    Workload("mqtt-publish-qos1", mqtt_load.publish_qos1,
             "MQTT: QoS 1, each PUBACK awaited, a persistent subscription keeps them "
             "(msgs/s, higher better)", mqtt=True),
    Workload("mqtt-publish-qos1-window", mqtt_load.publish_qos1_window,
             "MQTT: QoS 1 pipelined, up to 100 unacknowledged, a persistent subscription "
             "keeps them (msgs/s, higher better)", mqtt=True),
    Workload("mqtt-publish-qos2", mqtt_load.publish_qos2,
             "MQTT: QoS 2 pipelined, up to 20 unfinished, PUBCOMP awaited (RabbitMQ 3.10: "
             "downgraded to QoS 1, PUBACK) (msgs/s, higher better)", mqtt=True),
    Workload("mqtt-fanout", mqtt_load.fanout,
             "MQTT: QoS 1 publishes (100 in flight) to 10 QoS 1 subscribers, each delivery "
             "PUBACKed (deliveries/s, higher better)", mqtt=True),
)}

AMQP_WORKLOADS = [w.name for w in WORKLOADS.values()
                  if not w.stomp and not w.amqp10 and not w.stream and not w.mqtt]
STOMP_WORKLOADS = [w.name for w in WORKLOADS.values() if w.stomp]
MQTT_WORKLOADS = [w.name for w in WORKLOADS.values() if w.mqtt]
