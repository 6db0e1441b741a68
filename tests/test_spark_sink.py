"""S3: the `ackmq` sink publishes with confirms; a nack or a confirm timeout fails the task."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator

import pika
import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]
pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'pyspark==4.3.0')")

from ackmq.spark.amqp import ConfirmingPublisher, PublishError  # noqa: E402

needs_java = pytest.mark.skipif(shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
                                reason="Spark needs Java (no java on PATH, no JAVA_HOME)")


@pytest.fixture(scope="module")
def spark() -> Iterator[object]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java (no java on PATH, no JAVA_HOME)")
    from ackmq.spark.pipeline import spark_session

    s = spark_session("ackmq-sink-tests")
    s.conf.set("spark.sql.shuffle.partitions", "2")
    yield s
    s.stop()


def declare(url: str, **args: object) -> str:
    name = f"spark.sink.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_declare(name, durable=True, arguments=args or None)
    conn.close()
    return name


def get_all(url: str, queue: str) -> list[tuple[bytes, pika.BasicProperties]]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    out = []
    while True:
        m, props, body = ch.basic_get(queue, auto_ack=True)
        if m is None:
            break
        out.append((body, props))
    ch.queue_delete(queue)
    conn.close()
    return out


def test_S3_publisher_confirm_timeout_raises(broker_url: str) -> None:
    q = declare(broker_url)
    pub = ConfirmingPublisher(broker_url, confirm_timeout=0.0)
    try:
        for _ in range(10):
            pub.publish("", q, b"x", pika.BasicProperties(delivery_mode=2))
        with pytest.raises(PublishError, match="unconfirmed"):
            pub.flush()
    finally:
        pub.close()
        get_all(broker_url, q)


@needs_java
def test_S3_batch_write_confirms_every_row_with_deterministic_ids(spark, broker_url: str) -> None:
    q = declare(broker_url)
    df = spark.createDataFrame([(str(i).encode(), q, {"n": str(i)}) for i in range(300)],
                               "body binary, routing_key string, headers map<string,string>"
                               ).repartition(2)
    df.write.format("ackmq").mode("append").option("url", broker_url) \
        .option("writeId", "job7").save()
    got = get_all(broker_url, q)
    assert sorted(int(b) for b, _ in got) == list(range(300))
    ids = [p.message_id for _, p in got]
    assert len(set(ids)) == 300 and all(i.startswith("job7/0/") for i in ids)
    assert all(p.delivery_mode == 2 and p.headers["n"] == b.decode() for b, p in got)


@needs_java
def test_S3_nack_fails_the_write(spark, broker_url: str) -> None:
    q = declare(broker_url, **{"x-max-length": 5, "x-overflow": "reject-publish"})
    df = spark.createDataFrame([(str(i).encode(),) for i in range(50)], "body binary")
    with pytest.raises(Exception, match="nacked"):
        df.coalesce(1).write.format("ackmq").mode("append").option("url", broker_url) \
            .option("routingKey", q).save()
    get_all(broker_url, q)


@needs_java
def test_S3_stream_write_ids_name_query_batch_partition_row(spark, broker_url: str,
                                                            tmp_path) -> None:
    """Queue -> Spark -> queue: ids carry the streaming query id and the batch id."""
    src, dst = declare(broker_url), declare(broker_url)
    conn = pika.BlockingConnection(pika.URLParameters(broker_url))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(40):
        ch.basic_publish("", src, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()
    df = (spark.readStream.format("ackmq").option("url", broker_url).option("queue", src)
          .option("stagingLocation", str(tmp_path / "staging")).load())
    q = (df.select("body").writeStream.format("ackmq").option("url", broker_url)
         .option("routingKey", dst).option("checkpointLocation", str(tmp_path / "chk"))
         .trigger(availableNow=True).start())
    q.awaitTermination(180)
    got = get_all(broker_url, dst)
    get_all(broker_url, src)
    assert sorted(int(b) for b, _ in got) == list(range(40))
    for _, p in got:
        query, batch, part, row = p.message_id.split("/")
        assert query == q.id and batch.isdigit() and part.isdigit() and row.isdigit()
