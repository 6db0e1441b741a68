"""Users, vhosts, permissions, topic permissions and limits (SPEC M1, U1-U3, U6) over
HTTP: the same AccessModel operations `ackmq ctl` calls, durable before the answer.
Changing any of them needs the administrator tag, as in RabbitMQ; a management user
lists only the vhosts it has permissions on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from ackmq.broker.access import SHA256, AccessError, compile_check
from ackmq.server import views
from ackmq.server.http import common
from ackmq.server.http.app import Handler, requires
from ackmq.server.ops import OpError, bad_request, not_found
from ackmq.server.tracing import trace_off, trace_on, tracing
from ackmq.server.views import node_name, visible_vhosts


def key_missing(keys: list[str]) -> OpError:
    """RabbitMQ's text for absent keys: an Erlang list as `~p` prints it (one line
    while it fits in 80 columns)."""
    items = [f"{{key_missing,{k}}}" for k in keys]
    text = "[" + ",".join(items) + "]"
    if len(text) > 80:
        text = "[" + ",\n ".join(items) + "]"
    return bad_request(text)


def _require(body: dict[str, Any], *keys: str) -> None:
    missing = [k for k in keys if k not in body]
    if missing:
        raise key_missing(missing)


def _access(request: web.Request) -> Any:
    return common.server(request).access


def _change(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except AccessError as e:
        raise bad_request(e.text) from None


# -- users -------------------------------------------------------------------------------
@requires("administrator")
async def list_users(request: web.Request) -> web.Response:
    a = _access(request)
    return common.listing(request, [views.user(a, u) for u in a.users.values()])


@requires("administrator")
async def users_without_permissions(request: web.Request) -> web.Response:
    a = _access(request)
    having = {u for (u, _v) in a.permissions}
    return common.listing(request, [views.user(a, u) for u in a.users.values()
                                    if u.name not in having])


def _user(request: web.Request) -> Any:
    u = _access(request).users.get(request.match_info["user"])
    if u is None:
        raise not_found()
    return u


@requires("administrator")
async def get_user(request: web.Request) -> web.Response:
    return common.one(request, views.user(_access(request), _user(request)))


def parse_tags(tags: Any) -> list[str]:
    if tags is None:
        return []
    if isinstance(tags, str):
        return [t.strip() for t in tags.split(",") if t.strip()]
    if isinstance(tags, list) and all(isinstance(t, str) for t in tags):
        return [t.strip() for t in tags if t.strip()]
    raise bad_request("tags must be a comma-separated string or a list of strings")


@requires("administrator")
async def put_user(request: web.Request) -> web.Response:
    """password, or password_hash (+ hashing_algorithm), and tags; with neither the
    user has no password (cannot log in with one), as RabbitMQ."""
    a = _access(request)
    name = request.match_info["user"]
    body = await common.body_object(request)
    if "tags" not in body:  # RabbitMQ 3.10 asks for it ("" for none)
        raise bad_request("tags_not_present")
    tags = parse_tags(body.get("tags"))
    existed = name in a.users
    if "password" in body:
        pw = body["password"]
        if not isinstance(pw, str):
            raise bad_request("password must be a string")
        if existed:
            _change(a.change_password, name, pw)
        else:
            _change(a.add_user, name, pw)
    elif "password_hash" in body:
        _change(a.import_user, name, str(body["password_hash"]),
                str(body.get("hashing_algorithm") or SHA256), tags)
    elif not existed:
        _change(a.add_user, name, "")
    _change(a.set_user_tags, name, tags)
    return common.no_content(204 if existed else 201)


@requires("administrator")
async def delete_user(request: web.Request) -> web.Response:
    u = _user(request)
    _change(_access(request).delete_user, u.name)
    return common.no_content()


# -- vhosts ------------------------------------------------------------------------------
def _vhost_json(srv: Any, name: str) -> dict[str, Any]:
    vh = srv.broker.vhosts.get(name)
    ready = unacked = 0
    if vh is not None:
        for q in vh.queues.values():
            ready += q.message_count
            unacked += q.unacked_count
    meta = srv.access.vhosts.get(name, {})
    desc = meta.get("description", "")
    tags = list(meta.get("tags", []))
    return {"name": name, "description": desc, "tags": tags,
            "metadata": {"description": desc, "tags": tags}, "tracing": tracing(srv, name),
            "default_queue_type": "undefined",
            "cluster_state": {node_name(): "running"},
            "messages": ready + unacked, "messages_details": {"rate": 0.0},
            "messages_ready": ready, "messages_ready_details": {"rate": 0.0},
            "messages_unacknowledged": unacked,
            "messages_unacknowledged_details": {"rate": 0.0}, "message_stats": {},
            "recv_oct": 0, "recv_oct_details": {"rate": 0.0}, "send_oct": 0,
            "send_oct_details": {"rate": 0.0}}


async def list_vhosts(request: web.Request) -> web.Response:
    srv = common.server(request)
    return common.listing(request, [_vhost_json(srv, n)
                                    for n in visible_vhosts(srv, common.user(request))])


@requires("administrator")  # RabbitMQ 3.10: even a user with permissions on it
async def get_vhost(request: web.Request) -> web.Response:
    name = common.vhost_arg(request)
    return common.one(request, _vhost_json(common.server(request), name))


@requires("administrator")
async def put_vhost(request: web.Request) -> web.Response:
    """As RabbitMQ 3.10: the creating user gets full permissions on the new vhost."""
    a = _access(request)
    name = request.match_info["vhost"]
    body = await common.body_object(request)
    trace = common.flag(body["tracing"]) if "tracing" in body else None  # 400 before creating
    lifecycle = common.flag(body.get("lifecycle"))
    created = _change(a.add_vhost, name)
    meta = a.vhosts[name]
    if "description" in body or "tags" in body:
        meta["description"] = str(body.get("description", meta.get("description", "")))
        meta["tags"] = parse_tags(body.get("tags", meta.get("tags", [])))
    if created:
        _change(a.set_permissions, common.user(request).name, name, ".*", ".*", ".*")
    if trace:  # M9: the firehose, as RabbitMQ's PUT (S10: ackmq's "lifecycle" too)
        trace_on(common.server(request), name, lifecycle=lifecycle)
    elif trace is not None:
        trace_off(common.server(request), name)
    return common.no_content(201 if created else 204)


@requires("administrator")
async def delete_vhost(request: web.Request) -> web.Response:
    name = request.match_info["vhost"]
    a = _access(request)
    if name not in a.vhosts:
        raise not_found()
    _change(a.delete_vhost, name)
    return common.no_content()


# -- permissions -----------------------------------------------------------------------
def _readers(rows: Callable[[Any, str | None, str | None], list[dict[str, Any]]],
             pair_as_list: bool) -> tuple[Handler, Handler, Handler, Handler]:
    """The four GETs of a kind of permission - all, a vhost's, a user's, one user/vhost
    pair - the same for permissions and topic permissions: RabbitMQ answers a pair's
    permissions with the object, its topic permissions with a list (one per exchange)."""

    def rows_of(request: web.Request, vhost: str | None = None, name: str | None = None
                ) -> list[dict[str, Any]]:
        return rows(_access(request), vhost, name)

    @requires("administrator")
    async def every(request: web.Request) -> web.Response:
        return common.listing(request, rows_of(request))

    @requires("administrator")
    async def of_vhost(request: web.Request) -> web.Response:
        return common.listing(request, rows_of(request, vhost=common.vhost_arg(request)))

    @requires("administrator")
    async def of_user(request: web.Request) -> web.Response:
        return common.listing(request, rows_of(request, name=_user(request).name))

    @requires("administrator")
    async def of_pair(request: web.Request) -> web.Response:
        found = rows_of(request, request.match_info["vhost"], request.match_info["user"])
        if not found:
            raise not_found()
        return common.listing(request, found) if pair_as_list else common.one(request, found[0])

    return every, of_vhost, of_user, of_pair


list_permissions, vhost_permissions, user_permissions, get_permission = _readers(
    views.permissions, pair_as_list=False)
list_topic_permissions, vhost_topic_permissions, user_topic_permissions, \
    get_topic_permission = _readers(views.topic_permissions, pair_as_list=True)


def _check_patterns(*patterns: Any) -> None:
    for p in patterns:
        if not isinstance(p, str):
            raise bad_request("permissions are regular expressions (strings)")
        problem = compile_check(p)
        if problem is not None:
            raise bad_request(f"invalid_regexp: {p!r}: {problem}")


async def _pair_body(request: web.Request, *keys: str
                     ) -> tuple[Any, str, str, dict[str, Any]]:
    """A PUT of a user/vhost pair's permissions or topic permissions: the access model,
    the pair and the body, checked as RabbitMQ (keys present, both exist, the write and
    read patterns (and configure) regular expressions)."""
    a = _access(request)
    vhost, name = request.match_info["vhost"], request.match_info["user"]
    body = await common.body_object(request)
    _require(body, *keys)
    if vhost not in a.vhosts or name not in a.users:
        raise bad_request("vhost_or_user_not_found")
    _check_patterns(*(body[k] for k in keys if k != "exchange"))
    return a, vhost, name, body


@requires("administrator")
async def put_permission(request: web.Request) -> web.Response:
    a, vhost, name, body = await _pair_body(request, "configure", "write", "read")
    existed = (name, vhost) in a.permissions
    _change(a.set_permissions, name, vhost, body["configure"], body["write"], body["read"])
    return common.no_content(204 if existed else 201)


@requires("administrator")
async def delete_permission(request: web.Request) -> web.Response:
    a = _access(request)
    vhost, name = request.match_info["vhost"], request.match_info["user"]
    if (name, vhost) not in a.permissions:
        raise not_found()
    _change(a.clear_permissions, name, vhost)
    return common.no_content()


@requires("administrator")
async def put_topic_permission(request: web.Request) -> web.Response:
    a, vhost, name, body = await _pair_body(request, "exchange", "write", "read")
    existed = body["exchange"] in a.topic_permissions.get((name, vhost), {})
    _change(a.set_topic_permissions, name, vhost, str(body["exchange"]), body["write"],
            body["read"])
    return common.no_content(204 if existed else 201)


@requires("administrator")
async def delete_topic_permission(request: web.Request) -> web.Response:
    a = _access(request)
    vhost, name = request.match_info["vhost"], request.match_info["user"]
    if not a.topic_permissions.get((name, vhost)):
        raise not_found()
    _change(a.clear_topic_permissions, name, vhost, request.query.get("exchange"))
    return common.no_content()


# -- limits (U6) ---------------------------------------------------------------------
async def list_vhost_limits(request: web.Request) -> web.Response:
    a = _access(request)
    return common.listing(request, [{"vhost": n, "value": dict(a.vhosts[n].get("limits", {}))}
                                    for n in common.listed_vhosts(request)
                                    if a.vhosts[n].get("limits")])


async def _limit_value(request: web.Request) -> int:
    body = await common.body_object(request)
    _require(body, "value")
    v = body["value"]
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_request(f"{request.match_info['name']} should be a number, actually was "
                          f"{v!r}")
    return v


@requires("administrator")
async def put_vhost_limit(request: web.Request) -> web.Response:
    a = _access(request)
    vhost = request.match_info["vhost"]
    if vhost not in a.vhosts:
        raise not_found()
    value = await _limit_value(request)
    limits = {**a.vhosts[vhost].get("limits", {}), request.match_info["name"]: value}
    _change(a.set_vhost_limits, vhost, limits)
    return common.no_content()


@requires("administrator")
async def delete_vhost_limit(request: web.Request) -> web.Response:
    a = _access(request)
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    limits = dict(a.vhosts.get(vhost, {}).get("limits", {}))
    if name not in limits:
        raise not_found()
    del limits[name]
    _change(a.set_vhost_limits, vhost, limits)
    return common.no_content()


@requires("administrator")
async def list_user_limits(request: web.Request) -> web.Response:
    a = _access(request)
    names = [_user(request).name] if "user" in request.match_info else list(a.users)
    return common.listing(request, [{"user": n, "value": dict(a.user_limits[n])}
                                    for n in names if a.user_limits.get(n)])


@requires("administrator")
async def put_user_limit(request: web.Request) -> web.Response:
    u = _user(request)
    value = await _limit_value(request)
    _change(_access(request).set_user_limits, u.name, {request.match_info["name"]: value})
    return common.no_content()


@requires("administrator")
async def delete_user_limit(request: web.Request) -> web.Response:
    a = _access(request)
    u = _user(request)
    name = request.match_info["name"]
    if name not in a.user_limits.get(u.name, {}):
        raise not_found()
    _change(a.clear_user_limits, u.name, name)
    return common.no_content()


def register(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/users", list_users)
    r.add_get("/api/users/", list_users)  # as RabbitMQ: PUT here (no name) is a 405
    r.add_get("/api/users/without-permissions", users_without_permissions)
    common.add_methods(r, "/api/users/{user}", get=get_user, put=put_user, delete=delete_user)
    r.add_get("/api/users/{user}/permissions", user_permissions)
    r.add_get("/api/users/{user}/topic-permissions", user_topic_permissions)
    r.add_get("/api/vhosts", list_vhosts)
    common.add_methods(r, "/api/vhosts/{vhost}", get=get_vhost, put=put_vhost, delete=delete_vhost)
    r.add_get("/api/vhosts/{vhost}/permissions", vhost_permissions)
    r.add_get("/api/vhosts/{vhost}/topic-permissions", vhost_topic_permissions)
    r.add_get("/api/permissions", list_permissions)
    common.add_methods(r, "/api/permissions/{vhost}/{user}",
                       get=get_permission, put=put_permission, delete=delete_permission)
    r.add_get("/api/topic-permissions", list_topic_permissions)
    common.add_methods(r, "/api/topic-permissions/{vhost}/{user}", get=get_topic_permission,
                       put=put_topic_permission, delete=delete_topic_permission)
    common.add_listing(r, "/api/vhost-limits", list_vhost_limits)
    common.add_methods(r, "/api/vhost-limits/{vhost}/{name}",
                       put=put_vhost_limit, delete=delete_vhost_limit)
    r.add_get("/api/user-limits", list_user_limits)
    r.add_get("/api/user-limits/{user}", list_user_limits)
    common.add_methods(r, "/api/user-limits/{user}/{name}", put=put_user_limit,
                       delete=delete_user_limit)
