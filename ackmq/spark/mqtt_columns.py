"""The MQTT columns of the queue source (`option("mqtt", "true")`, S11): `topic` and `qos`.

Everything else an MQTT publisher sends is already in the message's AMQP properties and
headers under RabbitMQ's names (ackmq.protocol.mqtt.amqp_map), so the source's own
`headers` and `properties` columns carry it; these two are the ones a table is keyed by.
They are computed on the executors, column by column, from the staged rows: the
driver-side reader, which bounds a queue's landing rate, does nothing more per message.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ackmq.protocol.mqtt.amqp_map import PUBLISH_QOS

#: RabbitMQ's MQTT exchange (its `mqtt.exchange`; ackmq's MQTT front end publishes there)
MQTT_EXCHANGE = "amq.topic"

MQTT_SCHEMA_DDL = ", topic string, qos int"
MQTT_FIELDS = [pa.field("topic", pa.string()), pa.field("qos", pa.int32())]


def with_mqtt_columns(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` (the source's columns) plus `topic`: the MQTT topic name a subscriber sees
    (the routing key with `.` -> `/`, `*` -> `+`) when the message went through amq.topic,
    else null; and `qos`: the QoS it was published with over MQTT (RabbitMQ's header
    `x-mqtt-publish-qos`), else null."""
    rk = batch.column("routing_key")
    topic = pc.replace_substring(pc.replace_substring(rk, ".", "/"), "*", "+")
    through = pc.equal(batch.column("exchange"), MQTT_EXCHANGE)
    topic = pc.if_else(through, topic, pa.scalar(None, pa.string()))
    raw = pc.map_lookup(batch.column("headers"), pa.scalar(PUBLISH_QOS), "first")
    ok = pc.match_substring_regex(raw, "^[0-2]$")  # a header set by hand may hold anything
    qos = pc.if_else(ok, raw, pa.scalar(None, pa.string())).cast(pa.int32())
    return pa.RecordBatch.from_arrays(
        [*batch.columns, topic, qos],
        schema=pa.schema([*batch.schema, *MQTT_FIELDS]))
