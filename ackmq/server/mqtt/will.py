"""Will messages (N6): published when a connection ends without DISCONNECT (or with
DISCONNECT reason 0x04), at once or after the MQTT 5 will delay interval (capped by the
session expiry interval, [MQTT-3.1.3-9]), unless the client reconnects meanwhile. A will
is published as its user would publish it (their permissions apply), on a channel of its
own: the connection's is gone by the time a delayed will is due."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ackmq.broker.access import ChannelAccess
from ackmq.broker.errors import ReplyError
from ackmq.broker.timers import Deadline
from ackmq.protocol.mqtt.amqp_map import properties_for
from ackmq.protocol.mqtt.topics import TopicError, check_name, to_amqp

if TYPE_CHECKING:
    from ackmq.protocol.mqtt import Will
    from ackmq.server.context import FrontEnd
    from ackmq.server.mqtt.state import MQTTState

log = logging.getLogger("ackmq.mqtt")


class _Output:
    """The ChannelOutput of a will's channel: it only publishes."""

    writable = True
    number = 1
    cancel_notify = False

    def deliver(self, consumer: Any, delivery_tag: int, entry: Any) -> None: ...
    def unroutable(self, message: Any) -> None: ...
    def confirm(self, ack: bool, delivery_tag: int, multiple: bool) -> None: ...
    def consumer_cancelled(self, consumer_tag: str, reason: str = "") -> None: ...
    def close(self, code: int, text: str) -> None: ...


class _Owner:
    peer = None

    def __init__(self, user: str) -> None:
        self.user = user


def send_will(ctx: FrontEnd, st: MQTTState, vhost: str, user: str, client_id: str,
              will: Will, session_expiry: int) -> None:
    delay = min(will.properties.get("will_delay_interval", 0), session_expiry)
    if delay <= 0:
        publish_will(ctx, st, vhost, user, client_id, will)
        return
    key = (vhost, client_id)
    old = st.wills.pop(key, None)
    if old is not None:
        old.cancel()

    def due() -> None:
        st.wills.pop(key, None)
        publish_will(ctx, st, vhost, user, client_id, will)
        ctx.request_flush()
    st.wills[key] = d = Deadline(ctx.broker.timers, due)  # C5: the broker's timers
    d.arm_in(delay)


def publish_will(ctx: FrontEnd, st: MQTTState, vhost: str, user: str, client_id: str,
                 will: Will) -> None:
    vh = ctx.broker.vhosts.get(vhost)
    if vh is None:
        return
    try:
        check_name(will.topic)
    except TopicError as e:
        log.info("MQTT will of user %r not published: %s", user, e)
        return
    props = {k: v for k, v in will.properties.items() if k != "will_delay_interval"}
    raw = properties_for(will.qos, False, props)
    ch = ctx.broker.open_channel(vh, _Owner(user), _Output(), user, "mqtt")
    ch.access = ChannelAccess(ctx.access, user, vhost, {"client_id": client_id})
    try:
        ch.basic_publish("amq.topic", to_amqp(will.topic), False, False, raw, will.payload)
        if will.retain:
            st.retain(vhost, will.topic, will.qos, raw, will.payload,
                      props.get("message_expiry_interval"))
            st.sync()
    except ReplyError as e:
        log.info("MQTT will of user %r not published: %s", user, e.text)
    finally:
        ch.close()
