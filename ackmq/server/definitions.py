"""Definitions in RabbitMQ's format both ways (SPEC M1, M4): users, vhosts,
permissions, topic permissions, limits, exchanges, queues (with their arguments) and
bindings, as `rabbitmqctl export_definitions` writes them, so a RabbitMQ 3.10 export
imports here and an ackmq export imports into RabbitMQ.

Used by `GET/POST /api/definitions` (server/http/api_defs.py) and by `ackmq ctl
export_definitions / import_definitions` (server/ctl/). Import applies the access
model first (vhosts before what lives in them), then exchanges, queues, bindings; a
definition the broker refuses is named with the broker's text (`refused`) and the
others are still imported.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ackmq.broker.access import SHA256, AccessError
from ackmq.broker.errors import ReplyError
from ackmq.broker.policy_check import PolicyError
from ackmq.server import durable, policy_ops

if TYPE_CHECKING:
    from ackmq.broker import BrokerModel
    from ackmq.broker.access import AccessModel

log = logging.getLogger("ackmq.definitions")
RABBIT_VERSION = "3.10.8"  # the format's version the export claims (RabbitMQ reads it)
# what ackmq has no model for: named in the import's answer, not silently dropped
UNSUPPORTED: tuple[str, ...] = ()


class Server(Protocol):
    """What import and export reach: the management context (HttpContext) of the HTTP
    API and of the ctl socket has it; typed here so neither imports server.py."""

    @property
    def broker(self) -> BrokerModel: ...

    @property
    def access(self) -> AccessModel: ...

    def request_flush(self) -> None: ...


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
    from ackmq.version import VERSION as __version__
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
    policies, op_params = policy_ops.export_entries(server.broker)
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
            "topic_permissions": snap["topic_permissions"],
            "parameters": vhost_limits + op_params + _components(server),
            "global_parameters": _globals(server),
            "policies": policies, **topology(server)}


def export_vhost(server: Server, vhost: str) -> dict[str, Any]:
    """One vhost's objects (GET /api/definitions/{vhost}): no users or permissions."""
    a = server.access
    limits = a.vhosts.get(vhost, {}).get("limits", {})
    params = ([{"value": dict(limits), "vhost": vhost, "component": "vhost-limits",
                "name": "limits"}] if limits else [])
    policies, op_params = policy_ops.export_entries(server.broker, vhost, with_vhost=False)
    return {**_header(), "parameters": params + op_params + _components(server, vhost),
            "policies": policies,
            **topology(server, vhost, with_vhost=False)}


def _components(server: Server, vhost: str | None = None) -> list[dict[str, Any]]:
    """The parameters of plugged-in components (dynamic shovels: server/parameters.py),
    as RabbitMQ exports them (value, vhost, component, name)."""
    reg = getattr(server, "parameters", None)
    return reg.listing(None, vhost) if reg is not None else []


def _globals(server: Server) -> list[dict[str, Any]]:
    """RabbitMQ's global runtime parameters (name, value): MQTT's vhost mappings."""
    reg = getattr(server, "parameters", None)
    return reg.global_listing() if reg is not None else []


def _global(server: Server, g: dict[str, Any]) -> None:
    reg = getattr(server, "parameters", None)
    if reg is None:
        raise DefinitionsError("this broker keeps no runtime parameters")
    reg.set_global(str(g["name"]), g["value"])


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
    (POST /api/definitions/{vhost}). Item by item: one the broker refuses (a stream
    queue, a bad argument, a binding to a missing queue) is named in `refused` with
    the broker's text and the others are imported, so a whole RabbitMQ export moves
    what ackmq can hold. Returns counts, `refused` and `skipped` (what ackmq has no
    model for: policies, other parameters)."""
    if not isinstance(defs, dict):
        raise DefinitionsError("a definitions file is a JSON object")
    a = server.access
    refused: list[str] = []
    counts: dict[str, int] = {}

    def each(key: str, what: Callable[[dict[str, Any]], str],
             apply: Callable[[dict[str, Any]], Any]) -> None:
        done = 0
        for item in _list(defs, key):
            try:
                apply(item)
                done += 1
            except (AccessError, ReplyError, DefinitionsError, PolicyError) as e:
                refused.append(f"{what(item)}: {getattr(e, 'text', None) or e}")
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                refused.append(f"{key[:-1]} {json.dumps(item, default=str)[:200]}: "
                               f"malformed ({e!r})")
        counts[key] = done

    # one save of access.json and one of policies.json for the whole request
    with a.batch(), server.broker.policies.batch():
        _apply(server, defs, vhost, each)
    server.request_flush()
    skipped = [k for k in UNSUPPORTED if defs.get(k)]
    skipped += [f"parameters ({p.get('component')})" for p in _list(defs, "parameters")
                if p.get("component") not in _PARAMETERS + _registered(server)]
    return {"imported": counts, "refused": refused, "skipped": skipped}


def _apply(server: Server, defs: dict[str, Any], vhost: str | None, each: Any) -> None:
    """What import_ applies, in RabbitMQ's order (vhosts before what lives in them)."""
    a = server.access
    if vhost is None:
        each("vhosts", lambda v: f"vhost '{v.get('name')}'", lambda v: _vhost(a, v))
        each("users", lambda u: f"user '{u.get('name')}'", lambda u: _user(a, u))
        each("permissions", lambda p: f"permissions of '{p.get('user')}' in vhost "
             f"'{p.get('vhost')}'", lambda p: a.set_permissions(
                 str(p["user"]), str(p["vhost"]), str(p["configure"]), str(p["write"]),
                 str(p["read"])))
        each("topic_permissions", lambda t: f"topic permissions of '{t.get('user')}' in "
             f"vhost '{t.get('vhost')}'", lambda t: a.set_topic_permissions(
                 str(t["user"]), str(t["vhost"]), str(t["exchange"]), str(t["write"]),
                 str(t["read"])))
        each("global_parameters", lambda g: f"global parameter '{g.get('name')}'",
             lambda g: _global(server, g))
    each("parameters", lambda p: _parameter_what(p, vhost),
         lambda p: _parameter(server, p, vhost))
    # policies before the objects, so a queue is made with its policy in force
    each("policies", lambda p: f"policy '{p.get('name')}' in vhost "
         f"'{vhost or p.get('vhost', '/')}'",
         lambda p: policy_ops.import_policy(server.broker, p, vhost))
    _objects(server, defs, vhost, each)


_PARAMETERS = ("vhost-limits", policy_ops.OPERATOR_COMPONENT)


def _registered(server: Server) -> tuple[str, ...]:
    reg = getattr(server, "parameters", None)
    return tuple(reg.components) if reg is not None else ()


def _parameter_what(p: dict[str, Any], vhost: str | None) -> str:
    where = vhost or p.get("vhost")
    if p.get("component") not in ("vhost-limits", policy_ops.OPERATOR_COMPONENT):
        return f"{p.get('component')} '{p.get('name')}' in vhost '{where}'"
    if p.get("component") == policy_ops.OPERATOR_COMPONENT:
        return f"operator policy '{p.get('name')}' in vhost '{where}'"
    return f"vhost limits of '{where}'"


def _parameter(server: Server, p: dict[str, Any], vhost: str | None) -> None:
    """A `parameters` entry: vhost limits, an operator policy; others are skipped."""
    if p.get("component") == "vhost-limits":
        server.access.set_vhost_limits(vhost or str(p["vhost"]), p.get("value") or {})
    elif p.get("component") == policy_ops.OPERATOR_COMPONENT:
        policy_ops.import_operator_policy(server.broker, p, vhost)
    elif str(p.get("component")) in _registered(server):  # a shovel
        from ackmq.server.parameters import ParameterError
        reg = getattr(server, "parameters", None)
        assert reg is not None
        where = vhost or str(p["vhost"])
        if where not in server.broker.vhosts:
            raise DefinitionsError(f"vhost '{where}' does not exist")
        try:
            reg.set(str(p["component"]), where, str(p["name"]), p.get("value"), "")
        except ParameterError as e:
            raise DefinitionsError(e.reason.replace("\n\n", ": ").strip()) from None


def load_file(server: Server, path: Path) -> None:
    """`--load-definitions` / `load_definitions = FILE` (RabbitMQ's): imported at start;
    an unreadable file stops the start, a refused definition is logged."""
    try:
        defs = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as e:
        raise DefinitionsError(f"load_definitions: cannot read {path}: {e}") from None
    done = import_(server, defs)
    durable.access_saved_now(server.access)
    for text in done["refused"]:
        log.error("load_definitions %s: not imported: %s", path, text)
    if done["skipped"]:
        log.warning("load_definitions %s: skipped (no model for them): %s", path,
                    ", ".join(done["skipped"]))


def _vhost(a: Any, v: dict[str, Any]) -> None:
    a.add_vhost(str(v["name"]))
    meta = v.get("metadata") or {}
    if isinstance(meta, dict) and meta:
        a.vhosts[str(v["name"])]["description"] = str(meta.get("description", ""))
        a.vhosts[str(v["name"])]["tags"] = _tags(meta.get("tags"))


def _user(a: Any, u: dict[str, Any]) -> None:
    a.import_user(str(u["name"]), str(u.get("password_hash", "")),
                  str(u.get("hashing_algorithm") or SHA256), _tags(u.get("tags")))
    if isinstance(u.get("limits"), dict) and u["limits"]:
        a.set_user_limits(str(u["name"]), u["limits"])


def _vhost_of(server: Server, item: dict[str, Any], vhost: str | None) -> Any:
    name = vhost or str(item.get("vhost", "/"))
    vh = server.broker.vhosts.get(name)
    if vh is None:
        raise DefinitionsError(f"vhost '{name}' does not exist (for {item.get('name')!r})")
    return vh


def _objects(server: Server, defs: dict[str, Any], vhost: str | None, each: Any) -> None:
    from ackmq.broker.exchange import EXCHANGE_CLASSES

    def exchange(x: dict[str, Any]) -> None:
        vh = _vhost_of(server, x, vhost)
        if str(x.get("type", "direct")) not in EXCHANGE_CLASSES:
            raise DefinitionsError(f"unknown exchange type '{x.get('type')}'")
        vh.declare_exchange(str(x["name"]), str(x.get("type", "direct")), False,
                            bool(x.get("durable", True)), bool(x.get("auto_delete", False)),
                            bool(x.get("internal", False)), dict(x.get("arguments") or {}))

    def queue(q: dict[str, Any]) -> None:
        vh = _vhost_of(server, q, vhost)
        vh.declare_queue(str(q["name"]), False, bool(q.get("durable", True)), False,
                         bool(q.get("auto_delete", False)), dict(q.get("arguments") or {}),
                         None)

    def binding(b: dict[str, Any]) -> None:
        vh = _vhost_of(server, b, vhost)
        kind = str(b.get("destination_type", "queue"))
        dest = (vh.queues if kind == "queue" else vh.exchanges).get(str(b["destination"]))
        if dest is None or str(b["source"]) not in vh.exchanges:
            raise DefinitionsError(f"no such {'exchange' if dest is not None else kind} "
                                   f"in vhost '{vh.name}'")
        vh.bind(str(b["source"]), dest, str(b.get("routing_key", "")),
                dict(b.get("arguments") or {}))

    def where(i: dict[str, Any]) -> str:
        return "" if vhost else f" in vhost '{i.get('vhost', '/')}'"

    each("exchanges", lambda x: f"exchange '{x.get('name')}'{where(x)}", exchange)
    each("queues", lambda q: f"queue '{q.get('name')}'{where(q)}", queue)
    each("bindings", lambda b: f"binding '{b.get('source')}' -> '{b.get('destination')}'"
         f"{where(b)}", binding)
