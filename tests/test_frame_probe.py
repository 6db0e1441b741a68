"""B1 audit: every case of `python -m tools.robustness.frame_probe` (malformed frames on an
open channel) against ackmq and the reference RabbitMQ; the answers (close method, code,
text, class and method ids) must be equal, so the decoder's texts cannot drift from
RabbitMQ's unnoticed. The few cases where ackmq answers differently on purpose are
listed in KNOWN with both brokers' answers and why (protocol/amqp/decoder.py's rules)."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import pytest
from conftest import rabbitmq_url

from tools.robustness.frame_probe import Outcome, bad_protocol_header, cases, probe

pytestmark = pytest.mark.rabbitmq

CASES = cases()


def _conn_close(code: int, text: str, class_id: int, method_id: int) -> Outcome:
    return Outcome("Connection.Close", code, text, class_id, method_id)


_EXCEEDS = _conn_close(505, "UNEXPECTED_FRAME - content body exceeds declared size", 60, 40)
# case -> (RabbitMQ's answer, ackmq's answer, why they differ)
KNOWN: dict[str, tuple[Outcome, Outcome, str]] = {
    "unknown class 99": (
        Outcome("EOF"), _conn_close(540, "NOT_IMPLEMENTED - unknown method {99,10}", 99, 10),
        "rule 4: RabbitMQ's reader crashes ({unknown_method_id,{99,10}}) and drops the "
        "socket without a close; a client learns nothing, so ackmq says 540"),
    "unknown method basic.99": (
        Outcome("EOF"), _conn_close(540, "NOT_IMPLEMENTED - unknown method {60,99}", 60, 99),
        "rule 4, as above"),
    "body bigger than declared": (
        Outcome("none"), _EXCEEDS,
        "rule 5: RabbitMQ waits forever for a method frame that never parses; ackmq "
        "closes at once"),
    "two bodies bigger than declared": (Outcome("none"), _EXCEEDS, "rule 5, as above"),
    "oversize body_size": (
        Outcome("none"),
        Outcome("Channel.Close", 406, "PRECONDITION_FAILED - message size 209715200 is "
                "larger than configured max size 134217728", 60, 40, 1),
        "rule 7: RabbitMQ checks the size after 200 MiB of body arrived (never here); "
        "ackmq refuses at the content header with RabbitMQ's text and skips the body"),
    "truncated content header": (
        Outcome("none"),
        _conn_close(501, "FRAME_ERROR - cannot decode content header "
                    "<<0,60,0,0,0,0,0,0,0,0,0,5>>", 60, 40),
        "rule 6: RabbitMQ decodes properties only after the body (then 541 "
        "INTERNAL_ERROR, a channel crash); ackmq answers 501 at header time"),
    "bad property list": (
        Outcome("none"),
        _conn_close(501, "FRAME_ERROR - cannot decode content header properties "
                    "<<128,0,9,97,98>>: property list length does not match the content "
                    "header", 60, 40),
        "rule 6, as above"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_B1_frame_probe_case_answers_as_rabbitmq(case: str, broker_url: str) -> None:
    reference = rabbitmq_url()
    theirs = asyncio.run(probe(reference, CASES[case]))
    ours = asyncio.run(probe(broker_url, CASES[case]))
    if case in KNOWN:
        rabbit, ackmq, why = KNOWN[case]
        assert theirs == rabbit, f"RabbitMQ's answer changed: {theirs} ({why})"
        assert ours == ackmq, f"ackmq's answer changed: {ours} ({why})"
    else:
        assert ours == theirs, f"ackmq: {ours}\nRabbitMQ: {theirs}"


def test_B1_bad_protocol_header_answers_as_rabbitmq(broker_url: str) -> None:
    reference = urlsplit(rabbitmq_url())
    ours = urlsplit(broker_url)
    assert bad_protocol_header(ours.hostname or "127.0.0.1", ours.port or 5672) == \
        bad_protocol_header(reference.hostname or "127.0.0.1", reference.port or 5672) == \
        b"AMQP\x00\x00\x09\x01"
