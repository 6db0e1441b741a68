"""Definitions in RabbitMQ's format both ways (SPEC M1, M4): users, vhosts,
permissions, topic permissions, limits, exchanges, queues (with their arguments) and
bindings, as `rabbitmqctl export_definitions` writes them, so a RabbitMQ 3.10 export
imports here and an ackmq export imports into RabbitMQ.

Used by `GET/POST /api/definitions` (server/http/api_defs.py) and by `ackmq ctl
export_definitions / import_definitions` (server/admin.py). Import applies the access
model first (vhosts before what lives in them), then exchanges, queues, bindings; the
first definition the broker refuses stops it with RabbitMQ's text (`DefinitionsError`),
what came before stays (as RabbitMQ, which imports item by item).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ackmq.broker.access import SHA256, AccessError
from ackmq.broker.errors import ReplyError

if TYPE_CHECKING:
    from ackmq.server.server import Server

RABBIT_VERSION = "3.10.8"  # the format's version the export claims (RabbitMQ reads it)
# what ackmq has no model for: named in the import's answer, not silently dropped
UNSUPPORTED = ("policies", "global_parameters")


class DefinitionsError(Exception):
    """A definition the broker refuses: `text` says which and why."""


def _value(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, dict):
        return {str(k): _value(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_value(x) for x in v]
    return v


def _header() -> dict[str, Any]:
    from ackmq import __version__
    return {"rabbit_version": RABBIT_VERSION, "rabbitmq_version": RABBIT_VERSION,
            "product_name": "ackmq", "product_version": __version__}


def topology(server: Server, vhost: str | None = None, with_vhost: bool = True
             ) -> dict[str, list[dict[str, Any]]]:
    """Exchanges (not the default or amq.* ones), queues (not exclusive ones) and
    bindings (not the default exchange's implicit ones) of one vhost or all."""
    from ackmq.broker.queue_type import Queue
    queues, exchanges, bindings = [], [], []
    for vname, vh in server.broker.vhosts.items():
        if vhost is not None and vname != vhost:
            continue
        where = {"vhost": vname} if with_vhost else {}
        for q in vh.queues.values():
            if q.exclusive_owner is not None:
                continue
            queues.append({"name": q.name, **where, "durable": q.durable,
                           "auto_delete": q.auto_delete, "arguments": _value(q.arguments)})
        for x in vh.exchanges.values():
            if not x.name:
                continue
            if not x.name.startswith("amq."):
                exchanges.append({"name": x.name, **where, "type": x.type,
                                  "durable": x.durable, "auto_delete": x.auto_delete,
                                  "internal": x.internal, "arguments": _value(x.arguments)})
            for b in x.bindings.values():
                d = b.destination
                if isinstance(d, Queue) and d.exclusive_owner is not None:
                    continue
                bindings.append({"source": x.name, **where, "destination": d.name,
                                 "destination_type": "queue" if isinstance(d, Queue)
                                 else "exchange", "routing_key": b.routing_key,
                                 "arguments": _value(b.arguments)})
    return {"queues": queues, "exchanges": exchanges, "bindings": bindings}


def export(server: Server) -> dict[str, Any]:
    """The whole broker, as `rabbitmqctl export_definitions` / GET /api/definitions."""
    a = server.access
    snap = a.snapshot()
    vhost_limits = [{"value": dict(v["limits"]), "vhost": v["name"],
                     "component": "vhost-limits", "name": "limits"}
                    for v in snap["vhosts"] if v.get("limits")]
    vhosts: list[dict[str, Any]] = []
    for v in snap["vhosts"]:
        meta = a.vhosts.get(v["name"], {})
        vhosts.append({"name": v["name"]})
        if meta.get("description") or meta.get("tags"):
            vhosts[-1]["metadata"] = {"description": meta.get("description", ""),
                                      "tags": list(meta.get("tags", []))}
    return {**_header(), "users": snap["users"], "vhosts": vhosts,
            "permissions": snap["permissions"],
            "topic_permissions": snap["topic_permissions"], "parameters": vhost_limits,
            "global_parameters": [], "policies": [], **topology(server)}


def export_vhost(server: Server, vhost: str) -> dict[str, Any]:
    """One vhost's objects (GET /api/definitions/{vhost}): no users or permissions."""
    a = server.access
    limits = a.vhosts.get(vhost, {}).get("limits", {})
    params = ([{"value": dict(limits), "vhost": vhost, "component": "vhost-limits",
                "name": "limits"}] if limits else [])
    return {**_header(), "parameters": params, "policies": [],
            **topology(server, vhost, with_vhost=False)}


def _list(defs: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = defs.get(key) or []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise DefinitionsError(f"'{key}' must be a list of JSON objects")
    return items


def _tags(tags: Any) -> list[str]:
    if isinstance(tags, str):
        return [t.strip() for t in tags.split(",") if t.strip()]
    return [str(t) for t in tags or []]


def import_(server: Server, defs: Any, vhost: str | None = None) -> dict[str, Any]:
    """Apply a definitions document; `vhost`: only objects, all into that vhost
    (POST /api/definitions/{vhost}). Returns what was imported and what was skipped."""
    if not isinstance(defs, dict):
        raise DefinitionsError("a definitions file is a JSON object")
    a = server.access
    counts: dict[str, int] = {}
    try:
        if vhost is None:
            for v in _list(defs, "vhosts"):
                a.add_vhost(str(v["name"]))
                meta = v.get("metadata") or {}
                if isinstance(meta, dict) and meta:
                    a.vhosts[str(v["name"])]["description"] = str(meta.get("description", ""))
                    a.vhosts[str(v["name"])]["tags"] = _tags(meta.get("tags"))
            for u in _list(defs, "users"):
                a.import_user(str(u["name"]), str(u.get("password_hash", "")),
                              str(u.get("hashing_algorithm") or SHA256), _tags(u.get("tags")))
                if isinstance(u.get("limits"), dict) and u["limits"]:
                    a.set_user_limits(str(u["name"]), u["limits"])
            for p in _list(defs, "permissions"):
                a.set_permissions(str(p["user"]), str(p["vhost"]), str(p["configure"]),
                                  str(p["write"]), str(p["read"]))
            for t in _list(defs, "topic_permissions"):
                a.set_topic_permissions(str(t["user"]), str(t["vhost"]), str(t["exchange"]),
                                        str(t["write"]), str(t["read"]))
            counts.update(users=len(defs.get("users") or []),
                          vhosts=len(defs.get("vhosts") or []),
                          permissions=len(defs.get("permissions") or []))
        for p in _list(defs, "parameters"):
            if p.get("component") == "vhost-limits":
                a.set_vhost_limits(vhost or str(p["vhost"]), p.get("value") or {})
        _objects(server, defs, vhost, counts)
    except AccessError as e:
        raise DefinitionsError(e.text) from None
    except ReplyError as e:
        raise DefinitionsError(e.text) from None
    except (KeyError, TypeError, ValueError) as e:
        raise DefinitionsError(f"malformed definition: {e!r}") from None
    skipped = [k for k in UNSUPPORTED if defs.get(k)]
    skipped += [f"parameters ({p.get('component')})" for p in _list(defs, "parameters")
                if p.get("component") != "vhost-limits"]
    return {"imported": counts, "skipped": skipped}


def _vhost_of(server: Server, item: dict[str, Any], vhost: str | None) -> Any:
    name = vhost or str(item.get("vhost", "/"))
    vh = server.broker.vhosts.get(name)
    if vh is None:
        raise DefinitionsError(f"vhost '{name}' does not exist (for {item.get('name')!r})")
    return vh


def _objects(server: Server, defs: dict[str, Any], vhost: str | None,
             counts: dict[str, int]) -> None:
    from ackmq.broker.exchange import EXCHANGE_CLASSES
    exchanges = _list(defs, "exchanges")
    for x in exchanges:
        vh = _vhost_of(server, x, vhost)
        if str(x.get("type", "direct")) not in EXCHANGE_CLASSES:
            raise DefinitionsError(f"exchange '{x['name']}': unknown exchange type "
                                   f"'{x.get('type')}'")
        vh.declare_exchange(str(x["name"]), str(x.get("type", "direct")), False,
                            bool(x.get("durable", True)), bool(x.get("auto_delete", False)),
                            bool(x.get("internal", False)), dict(x.get("arguments") or {}))
    queues = _list(defs, "queues")
    for q in queues:
        vh = _vhost_of(server, q, vhost)
        vh.declare_queue(str(q["name"]), False, bool(q.get("durable", True)), False,
                         bool(q.get("auto_delete", False)), dict(q.get("arguments") or {}),
                         None)
    bindings = _list(defs, "bindings")
    for b in bindings:
        vh = _vhost_of(server, b, vhost)
        kind = str(b.get("destination_type", "queue"))
        table = vh.queues if kind == "queue" else vh.exchanges
        dest = table.get(str(b["destination"]))
        if dest is None or str(b["source"]) not in vh.exchanges:
            raise DefinitionsError(f"binding {b['source']!r} -> {b['destination']!r}: no "
                                   f"such {'exchange' if dest is not None else kind} in "
                                   f"vhost '{vh.name}'")
        vh.bind(str(b["source"]), dest, str(b.get("routing_key", "")),
                dict(b.get("arguments") or {}))
    counts.update(exchanges=len(exchanges), queues=len(queues), bindings=len(bindings))
    server.request_flush()
