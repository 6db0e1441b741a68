"""ActiveMQ's `ActiveMQ.Scheduler.Management` over STOMP: a SEND to
`/topic/ActiveMQ.Scheduler.Management` with `AMQ_SCHEDULER_ACTION` BROWSE (each pending
job sent to the SEND's `reply-to`, with its `scheduledJobId`), REMOVE (the job named by
`scheduledJobId`) or REMOVEALL. Unlike ActiveMQ, a STOMP client sees and removes only
the jobs it scheduled itself (administrators have ctl, the HTTP API and the UI)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ackmq.broker import scheduled
from ackmq.protocol.amqp.properties import header_entries, properties_edit
from ackmq.protocol.stomp.destinations import TOPIC, Destination, parse_destination
from ackmq.server.stomp.refusal import Refused

if TYPE_CHECKING:
    from ackmq.broker.channel import ChannelModel

MANAGEMENT = "ActiveMQ.Scheduler.Management"
ACTION = "AMQ_SCHEDULER_ACTION"
ACTIONS = ("BROWSE", "REMOVE", "REMOVEALL")


def is_management(dest: Destination, headers: dict[str, str]) -> bool:
    return dest.kind == TOPIC and dest.name == MANAGEMENT and ACTION in headers


def manage(ch: ChannelModel, user: str | None, headers: dict[str, str]) -> None:
    """Do what the SEND's AMQ_SCHEDULER_ACTION says, on `user`'s jobs in the vhost."""
    action = headers[ACTION]
    if action not in ACTIONS:
        raise Refused("Bad header", f"{ACTION} must be one of {', '.join(ACTIONS)}, "
                                    f"not '{action}'\n")
    store = scheduled.existing(ch.vhost)
    mine = scheduled.made_by(user or "")
    if action == "REMOVEALL":
        if store is not None:
            store.cancel(mine)
        return
    if action == "REMOVE":
        job = headers.get(scheduled.JOB_ID)
        if not job:
            raise Refused("Bad header", f"REMOVE needs a '{scheduled.JOB_ID}' header\n")
        if store is not None:
            one = scheduled.job_is(job)
            store.cancel(lambda m: mine(m) and one(m))
        return
    reply_to = headers.get("reply-to")
    if not reply_to:
        raise Refused("Bad header", "BROWSE needs a 'reply-to' header\n")
    exchange, key = (parse_destination(reply_to).routing() if reply_to.startswith("/")
                     else ("", reply_to))
    for j in (store.jobs(mine) if store is not None else []):
        msg = j["message"]
        entries = [e for k, e in header_entries(msg.properties)
                   if k.decode("utf-8", "replace") != scheduled.JOB_USER]
        ch.basic_publish(exchange, key, False, False,
                         properties_edit(msg.properties, entries), msg.body)
