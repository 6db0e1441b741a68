"""Read-only JSON views of the running broker in RabbitMQ 3.10's management layout.

Each function reads counters and names through the model's public attributes (the
`Queue` interface's counters, exchange and binding fields, the access model) and builds
plain dicts; nothing here changes state or holds a reference past the call. Who may see
what (RabbitMQ's per-vhost visibility) is decided by `visible_vhosts`.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ackmq.server.context import HttpContext

_STARTED = time.monotonic()
EXCHANGE_TYPES = [
    {"name": t, "description": f"AMQP {t} exchange, as per the AMQP specification",
     "enabled": True} for t in ("direct", "fanout", "headers", "topic")]


@functools.cache
def node_name() -> str:
    return f"ackmq@{socket.gethostname().split('.')[0]}"


def product() -> dict[str, str]:
    from ackmq.version import VERSION as __version__
    return {"management_version": __version__, "product_version": __version__,
            "product_name": "ackmq", "rabbitmq_version": "3.10.8"}


def visible_vhosts(server: HttpContext, user: Any) -> list[str]:
    """RabbitMQ: administrator and monitoring users see every vhost; others the vhosts
    they have permissions on."""
    access = server.access
    if {"administrator", "monitoring"}.intersection(user.tags):
        return list(access.vhosts)
    return [v for v in access.vhosts if access.vhost_access(user.name, v)]


def sees_all_connections(user: Any) -> bool:
    return bool({"administrator", "monitoring"}.intersection(user.tags))


def _rate(n: int) -> dict[str, Any]:
    return _NO_RATE  # rates are not sampled (yet): shared, never changed


_NO_RATE: dict[str, Any] = {"rate": 0.0}


def listeners(server: HttpContext) -> list[dict[str, Any]]:
    node = node_name()
    out = []
    cfg = server.config
    ip = cfg.host or "::"
    for proto, port in (("amqp", server.port), ("amqp/ssl", server.tls_port),
                        ("stomp", server.stomp_port), ("stomp/ssl", server.stomp_tls_port),
                        ("stream", server.stream_port), ("stream/ssl", server.stream_tls_port),
                        ("mqtt", server.mqtt_port), ("mqtt/ssl", server.mqtt_tls_port),
                        ("http/web-mqtt", server.mqtt_ws_port),
                        ("https/web-mqtt", server.mqtt_wss_port),
                        ("http", server.http.port if server.http else 0),
                        ("https", server.http.https_port if server.http else 0)):
        if port:
            out.append({"node": node, "protocol": proto, "ip_address": ip, "port": port,
                        "socket_opts": {}})
    return out


def overview(server: HttpContext, user: Any, message_stats: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    """GET /api/overview. Totals cover the vhosts `user` may see; message rates are not
    sampled yet (0.0)."""
    vhosts = set(visible_vhosts(server, user))
    queues = [q for name, vh in server.broker.vhosts.items() if name in vhosts
              for q in vh.queues.values()]
    ready = sum(q.message_count for q in queues)
    unacked = sum(q.unacked_count for q in queues)
    conns = [c for c in server.connections if c.vhost_name in vhosts
             and (sees_all_connections(user) or c.user == user.name)]
    node = node_name()
    return {
        **product(),
        "rates_mode": "basic",
        "sample_retention_policies": {"global": [600, 3600, 28800, 86400],
                                      "basic": [600, 3600], "detailed": [600]},
        "exchange_types": EXCHANGE_TYPES,
        "cluster_name": node,
        "erlang_version": "python " + sys.version.split()[0],
        "erlang_full_version": "Python " + sys.version.replace("\n", " "),
        "release_series_support_status": "supported",
        "disable_stats": False,
        "enable_queue_totals": False,
        "message_stats": message_stats or {},
        "churn_rates": {},
        "queue_totals": {"messages": ready + unacked, "messages_details": _rate(0),
                         "messages_ready": ready, "messages_ready_details": _rate(0),
                         "messages_unacknowledged": unacked,
                         "messages_unacknowledged_details": _rate(0)},
        "object_totals": {
            "channels": sum(len(channels_of(c)) for c in conns),
            "connections": len(conns),
            "consumers": sum(q.consumer_count for q in queues),
            "exchanges": sum(len(vh.exchanges) for name, vh in server.broker.vhosts.items()
                             if name in vhosts),
            "queues": len(queues)},
        "statistics_db_event_queue": 0,
        "node": node,
        "listeners": listeners(server),
        "contexts": contexts(server),
    }


def contexts(server: HttpContext) -> list[dict[str, Any]]:
    return [{"node": node_name(), "description": "ackmq management", "path": "/",
             "port": str(server.http.port if server.http else 0)}]


def node(srv: HttpContext) -> dict[str, Any]:
    """GET /api/nodes/{node}: the node and its resource monitor."""
    mon = srv.alarms
    lim = mon.limits if mon is not None else None
    active = set(lim.active) if lim is not None else set()
    disk_free = 0
    if srv.config.data_dir is not None:
        try:
            disk_free = shutil.disk_usage(srv.config.data_dir).free
        except OSError:
            pass
    return {
        "name": node_name(), "type": "disc", "running": True,
        "os_pid": os_pid(), "uptime": uptime_ms(), "processors": os.cpu_count(),
        "rates_mode": "basic", "partitions": [], "run_queue": 0,
        "mem_used": getattr(mon, "rss", 0) or 0,
        "mem_limit": getattr(lim, "memory_limit", 0) or 0, "mem_alarm": "memory" in active,
        "mem_calculation_strategy": "rss",
        "disk_free": getattr(mon, "disk_free", None) or disk_free,
        "disk_free_limit": getattr(lim, "disk_free_limit", 0) or 0,
        "disk_free_alarm": "disk" in active,
        "fd_total": _fd_limit(), "sockets_total": _fd_limit(),
        "sockets_used": len(srv.connections), "proc_total": 0, "proc_used": 0,
        "exchange_types": EXCHANGE_TYPES,
        "auth_mechanisms": [{"name": m, "description": m, "enabled": True}
                            for m in ("PLAIN", "AMQPLAIN")],
        "applications": [], "contexts": contexts(srv),
        "enabled_plugins": ["rabbitmq_management"], "log_files": [], "config_files": [],
        "db_dir": str(srv.config.data_dir or ""), "net_ticktime": 60, "cluster_links": [],
        **_node_counts(srv),
    }


def _node_counts(srv: HttpContext) -> dict[str, Any]:
    """RabbitMQ's node churn counts and fd_used, each with its `_details` (rates are
    not sampled: 0.0), and the `_details` of the gauges above (issue 28's audit)."""
    churn = srv.broker.stats.churn
    conns = srv.connections
    counts = {"connection_created": getattr(conns, "opened", 0),
              "connection_closed": getattr(conns, "closed", 0),
              "channel_created": churn.channels_opened, "channel_closed": churn.channels_closed,
              "queue_declared": churn.queues_declared, "queue_created": churn.queues_created,
              "queue_deleted": churn.queues_deleted, "fd_used": _fds_used()}
    details = ("mem_used", "disk_free", "sockets_used", "proc_used", *counts)
    return {**counts, **{f"{k}_details": _NO_RATE for k in details}}


def _fds_used() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def _fd_limit() -> int:
    try:
        import resource
        return int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    except (ImportError, ValueError, OSError):
        return 0


def uptime_ms() -> int:
    return int((time.monotonic() - _STARTED) * 1000)


def os_pid() -> str:
    return str(os.getpid())


# -- JSON values ---------------------------------------------------------------------
def jsonable(v: Any) -> Any:
    """An AMQP field value (arguments, headers) as JSON: bytes as text, Decimal and
    datetime as their text, tables and arrays recursively."""
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [jsonable(x) for x in v]
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if hasattr(v, "timestamp"):
        return int(v.timestamp())
    return str(v)


def _counts(ready: int, unacked: int) -> dict[str, Any]:
    return {"messages": ready + unacked, "messages_details": _rate(0),
            "messages_ready": ready, "messages_ready_details": _rate(0),
            "messages_unacknowledged": unacked, "messages_unacknowledged_details": _rate(0)}


# -- users and permissions: /api/users, /api/permissions, /api/topic-permissions, and
# the ctl socket's listings (one JSON, formatted once by ackmq ctl) ----------------------
def user(access: Any, u: Any) -> dict[str, Any]:
    return {"name": u.name, "password_hash": u.password_hash,
            "hashing_algorithm": u.hashing_algorithm, "tags": list(u.tags),
            "limits": dict(access.user_limits.get(u.name, {}))}


def permission(u: str, v: str, p: Any) -> dict[str, Any]:
    return {"user": u, "vhost": v, "configure": p.configure, "write": p.write, "read": p.read}


def topic_permission(u: str, v: str, x: str, t: Any) -> dict[str, Any]:
    return {"user": u, "vhost": v, "exchange": x, "write": t.write, "read": t.read}


def permissions(access: Any, vhost: str | None = None, user: str | None = None
                ) -> list[dict[str, Any]]:
    """The permissions of a vhost, of a user, or all of them."""
    return [permission(u, v, p) for (u, v), p in access.permissions.items()
            if (vhost is None or v == vhost) and (user is None or u == user)]


def topic_permissions(access: Any, vhost: str | None = None, user: str | None = None
                      ) -> list[dict[str, Any]]:
    return [topic_permission(u, v, x, t) for (u, v), by_x in access.topic_permissions.items()
            if (vhost is None or v == vhost) and (user is None or u == user)
            for x, t in by_x.items()]


def scheduled_jobs(vh: Any, where: Any = None) -> list[dict[str, Any]]:
    """/api/scheduled's JSON of a vhost's pending scheduled messages (and the ctl
    socket's): `where` picks whose (None: every job)."""
    from ackmq.broker import scheduled
    store = scheduled.existing(vh) if vh is not None else None
    if store is None:
        return []
    return [{k: v for k, v in j.items() if k != "message"} for j in store.jobs(where)]


# -- queues, exchanges, bindings ---------------------------------------------------------
def queue_type(q: Any) -> str:
    t = q.arguments.get("x-queue-type")
    if isinstance(t, bytes):
        t = t.decode("utf-8", "replace")
    return str(t or q.kind or "classic")


def policy_fields(q: Any) -> dict[str, Any]:
    """`policy`, `operator_policy`, `effective_policy_definition` (broker/policy.py)."""
    from ackmq.broker.arguments import declared_type
    from ackmq.broker.policy import merged_definition
    pol, op = q.vhost.broker.policies.in_force(q.vhost.name, "queue", q.name,
                                               declared_type(q.arguments))
    return {"effective_policy_definition": merged_definition(pol, op),
            "policy": pol.name if pol else None, "operator_policy": op.name if op else None}


def queue(q: Any, details: bool = False, message_stats: dict[str, Any] | None = None
          ) -> dict[str, Any]:
    """One queue as GET /api/queues lists it (`details`: as GET /api/queues/v/name,
    with its consumers)."""
    consumers = q.consumers.values()
    exclusive_tag = next((c.tag for c in consumers if c.exclusive), None)
    out = {
        "arguments": jsonable(q.arguments), "auto_delete": q.auto_delete,
        "consumers": q.consumer_count, "durable": q.durable,
        "exclusive": q.exclusive_owner is not None,
        "exclusive_consumer_tag": exclusive_tag,
        **policy_fields(q),
        "message_stats": message_stats or {},
        **_counts(q.message_count, q.unacked_count),
        "name": q.name, "node": node_name(), "state": "running", "type": queue_type(q),
        "vhost": q.vhost.name,
    }
    owner = q.exclusive_owner
    if owner is not None and getattr(owner, "transport", None) is not None:
        ph, pp = hostport(owner.peer)
        out["owner_pid_details"] = {"name": connection_name(owner), "peer_host": ph,
                                    "peer_port": pp}
    delayed = getattr(q, "delayed_retry_count", 0)  # L6: waiting out a back-off
    if delayed:
        out["messages"] += delayed
    out["messages_delayed_retry"] = delayed
    if details:
        out["consumer_details"] = [consumer(c) for c in consumers]
        out["incoming"] = []
        out["deliveries"] = []
    return out


def exchange(vhost: str, x: Any, message_stats: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    """One exchange; `message_stats` (publish_in, publish_out) only once it moved, as
    RabbitMQ leaves the key out for an exchange nobody published to."""
    out = {"arguments": jsonable(x.arguments), "auto_delete": x.auto_delete,
           "durable": x.durable, "internal": x.internal, "name": x.name, "type": x.type,
           "user_who_performed_action": "", "vhost": vhost}
    if x.policy is not None:  # only when one applies, as RabbitMQ 3.10
        out["policy"] = x.policy
    if message_stats:
        out["message_stats"] = message_stats
    delayed = getattr(x, "messages_delayed", None)  # the delayed-message plugin's key (L8)
    if delayed is not None:
        out["messages_delayed"] = delayed
    return out


def properties_key(routing_key: str, arguments: dict[str, Any]) -> str:
    """RabbitMQ's binding id in URLs: the quoted routing key, then "~" and a digest of
    the arguments when there are any (RabbitMQ hashes its Erlang term; ackmq its JSON:
    the key is opaque to clients, which only pass back what a listing gave them)."""
    from urllib.parse import quote
    key = quote(routing_key, safe="").replace("~", "%7E")
    if not arguments:
        return key
    import base64
    import hashlib
    digest = hashlib.md5(json.dumps(jsonable(arguments), sort_keys=True).encode(),
                         usedforsecurity=False).digest()
    return key + "~" + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def binding(vhost: str, source: str, dest: str, dest_type: str, routing_key: str,
            arguments: dict[str, Any]) -> dict[str, Any]:
    return {"source": source, "vhost": vhost, "destination": dest,
            "destination_type": dest_type, "routing_key": routing_key,
            "arguments": jsonable(arguments),
            "properties_key": properties_key(routing_key, arguments)}


def bindings(vh: Any) -> list[dict[str, Any]]:
    return list(iter_bindings(vh))


def iter_bindings(vh: Any) -> Iterator[dict[str, Any]]:
    """Every binding of a vhost, RabbitMQ's order: the default exchange's implicit
    bindings first, then each exchange's (lazily: the model's dicts are copied first,
    so the caller may give the loop back between items)."""
    from ackmq.broker.queue_type import Queue
    for q in list(vh.queues.values()):
        yield binding(vh.name, "", q.name, "queue", q.name, {})
    for x in list(vh.exchanges.values()):
        if not x.name:
            continue
        for b in list(x.bindings.values()):
            kind = "queue" if isinstance(b.destination, Queue) else "exchange"
            yield binding(vh.name, x.name, b.destination.name, kind, b.routing_key,
                          b.arguments)


# -- connections, channels, consumers ---------------------------------------------------
def hostport(addr: Any) -> tuple[str, int]:
    if isinstance(addr, tuple | list) and len(addr) >= 2:
        return str(addr[0]), int(addr[1])
    return "", 0


def connection_name(conn: Any) -> str:
    """RabbitMQ's: "peer_host:peer_port -> host:port"."""
    cached = getattr(conn, "_mgmt_name", None)
    if cached:
        return cached
    ph, pp = hostport(conn.peer)
    t = conn.transport
    h, p = hostport(t.get_extra_info("sockname") if t is not None else None)
    return f"{ph}:{pp} -> {h}:{p}"


def channels_of(conn: Any) -> list[tuple[int, Any]]:
    """(number, ChannelModel) of a connection's open channels (it lists its own)."""
    return conn.open_channels()


def connection(conn: Any, octet_rates: tuple[float, ...] = (0.0, 0.0)) -> dict[str, Any]:
    """One connection; `octet_rates`: (recv_oct, send_oct) per second."""
    ph, pp = hostport(conn.peer)
    t = conn.transport
    h, p = hostport(t.get_extra_info("sockname") if t is not None else None)
    ssl = t is not None and t.get_extra_info("ssl_object") is not None
    props = jsonable(getattr(conn, "client_properties", {}) or {})
    return {
        "auth_mechanism": getattr(conn, "auth_mechanism", "PLAIN"), "channel_max": getattr(conn, "channel_max", 1),
        "channels": len(channels_of(conn)), "client_properties": props,
        "connected_at": None, "frame_max": getattr(conn, "frame_max", 0),
        "host": h, "name": connection_name(conn), "node": node_name(),
        "peer_host": ph, "peer_port": pp, "port": p,
        "protocol": conn.protocol,
        "ssl": ssl, "state": "blocked" if getattr(conn, "alarm_blocked", False) else "running",
        "timeout": getattr(conn, "heartbeat", 0), "type": "network", "user": conn.user,
        "user_who_performed_action": conn.user, "vhost": conn.vhost_name,
        "recv_cnt": conn.recv_cnt, "recv_oct": conn.recv_oct,
        "recv_oct_details": {"rate": round(octet_rates[0], 1)},
        "send_cnt": conn.send_cnt, "send_oct": conn.send_oct,
        "send_oct_details": {"rate": round(octet_rates[1], 1)}, "send_pend": 0,
        **({"user_provided_name": props["connection_name"]}
           if isinstance(props.get("connection_name"), str) else {}),
        **_tls_keys(t.get_extra_info("ssl_object") if t is not None else None),
    }


_RDN = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU",
        "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST",
        "domainComponent": "DC", "emailAddress": "emailAddress"}


def _tls_keys(so: Any) -> dict[str, Any]:
    """RabbitMQ's TLS keys of a connection, null on a plain one: the protocol as
    RabbitMQ writes it ("tlsv1.3"), the cipher in OpenSSL's name, the client
    certificate's subject, issuer and validity (the key exchange and hash are in the
    OpenSSL cipher name: null)."""
    out: dict[str, Any] = dict.fromkeys(
        ("ssl_protocol", "ssl_key_exchange", "ssl_cipher", "ssl_hash", "peer_cert_subject",
         "peer_cert_issuer", "peer_cert_validity"))
    if so is None:
        return out
    version, cipher = so.version(), so.cipher()
    out["ssl_protocol"] = version.lower() if version else None
    out["ssl_cipher"] = cipher[0] if cipher else None
    cert = so.getpeercert() or {}
    if cert:
        def name(rdns: Any) -> str:  # RFC 4514, as RabbitMQ: last RDN first, short keys
            return ",".join(f"{_RDN.get(k, k)}={v}" for rdn in reversed(rdns)
                            for k, v in rdn)
        out["peer_cert_subject"] = name(cert.get("subject", ()))
        out["peer_cert_issuer"] = name(cert.get("issuer", ()))
        out["peer_cert_validity"] = f"{cert.get('notBefore')} - {cert.get('notAfter')}"
    return out


def channel(conn: Any, number: int, ch: Any, message_stats: dict[str, Any] | None = None
            ) -> dict[str, Any]:
    """One channel; `message_stats` only once it published or delivered (RabbitMQ
    leaves the key out for an idle channel)."""
    ph, pp = hostport(conn.peer)
    name = connection_name(conn)
    confirm = ch.confirms is not None
    out = {
        "acks_uncommitted": 0, "confirm": confirm,
        "connection_details": {"name": name, "peer_host": ph, "peer_port": pp},
        "consumer_count": len(ch.consumers), "global_prefetch_count": ch.global_prefetch,
        "messages_unacknowledged": len(ch.unacked),
        "messages_uncommitted": 0, "messages_unconfirmed": 0,
        "name": f"{name} ({number})", "node": node_name(), "number": number,
        "prefetch_count": ch.prefetch_count, "state": "running",
        "transactional": ch.tx is not None, "user": conn.user,
        "user_who_performed_action": conn.user, "vhost": ch.vhost.name,
    }
    if message_stats:
        out["message_stats"] = message_stats
    return out


def consumer(c: Any) -> dict[str, Any]:
    ch = c.channel
    conn = ch.owner
    ph, pp = hostport(getattr(conn, "peer", None))
    number = next((n for n, m in channels_of(conn) if m is ch), 0) if conn is not None else 0
    name = connection_name(conn) if conn is not None else ""
    return {
        "arguments": jsonable(c.arguments), "ack_required": not c.no_ack, "active": True,
        "activity_status": "up",
        "channel_details": {"connection_name": name, "name": f"{name} ({number})",
                            "node": node_name(), "number": number, "peer_host": ph,
                            "peer_port": pp, "user": getattr(conn, "user", "")},
        "consumer_tag": c.tag, "exclusive": c.exclusive, "prefetch_count": c.limit,
        "queue": {"name": c.queue.name, "vhost": c.queue.vhost.name},
    }
