"""Turning a vhost's firehose on and off (SPEC M9, S10), once for `ackmq ctl trace_on`
and the management API (`PUT /api/vhosts/<name>` with `"tracing": true`, as RabbitMQ).

Like RabbitMQ, a vhost that does not exist is answered as if it did (nothing is traced),
and the state is not persistent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ackmq.broker.trace import Tracer
from ackmq.server.views import connection_name, node_name

if TYPE_CHECKING:
    from ackmq.server.context import FrontEnd, HttpContext

    Context = FrontEnd | HttpContext


def trace_on(ctx: Context, vhost: str, lifecycle: bool = False) -> None:
    """Copies of publishes and deliveries to amq.rabbitmq.trace; with `lifecycle` also
    ackmq's own events (confirm, route, ack, nack, reject, deadletter, expire, drop)."""
    vh = ctx.broker.vhosts.get(vhost)
    if vh is not None:
        vh.trace = Tracer(vh, node_name(), connection_name, lifecycle)


def trace_off(ctx: Context, vhost: str) -> None:
    vh = ctx.broker.vhosts.get(vhost)
    if vh is not None:
        vh.trace = None


def tracing(ctx: Context, vhost: str) -> bool:
    """The `tracing` field of the vhost's JSON."""
    vh = ctx.broker.vhosts.get(vhost)
    return vh is not None and vh.trace is not None
