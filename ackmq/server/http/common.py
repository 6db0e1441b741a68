"""What every route module shares: the server and user of a request, the vhost checks
with RabbitMQ's answers, request bodies, and listings with `columns`, `sort` and
pagination (rabbit_mgmt_util:columns/sort_list/paginate)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterable
from itertools import islice
from typing import Any

from aiohttp import web

from ackmq.server.http.app import SERVER_KEY, USER_KEY, Handler, json_response
from ackmq.server.ops import OpError, bad_request, not_found
from ackmq.server.views import visible_vhosts


def server(request: web.Request) -> Any:
    return request.app[SERVER_KEY]


def user(request: web.Request) -> Any:
    return request[USER_KEY]


def is_admin(u: Any) -> bool:
    return "administrator" in u.tags


def sees_all(u: Any) -> bool:
    return bool({"administrator", "monitoring"}.intersection(u.tags))


def vhost_arg(request: web.Request, key: str = "vhost") -> str:
    """A path's vhost that exists and that the user may see: 404 / 401 as RabbitMQ."""
    name = request.match_info[key]
    srv = server(request)
    if name not in srv.access.vhosts or name not in srv.broker.vhosts:
        raise not_found()
    u = user(request)
    if not is_admin(u) and not srv.access.vhost_access(u.name, name):
        # RabbitMQ: even a monitoring user, who lists every vhost, needs permissions
        # on one to read its objects by path
        raise OpError(401, "not_authorised", "User not authorised to access virtual host")
    return name


def listed_vhosts(request: web.Request) -> list[str]:
    """The vhosts a listing covers: the one its path names (vhost_arg's checks), else
    every vhost the user sees (RabbitMQ's `/api/x` and `/api/x/<vhost>`)."""
    if "vhost" in request.match_info:
        return [vhost_arg(request)]
    return visible_vhosts(server(request), user(request))


def add_listing(router: web.UrlDispatcher, path: str, handler: Handler) -> None:
    """A listing's two routes: every visible vhost's at `path`, one vhost's below it."""
    router.add_get(path, handler)
    router.add_get(path + "/{vhost}", handler)


def add_methods(router: web.UrlDispatcher, path: str, **handlers: Handler) -> None:
    """One path's handlers by method (`get=`, `put=`, `post=`, `delete=`), the path
    written once; a GET also answers HEAD, as `add_get`."""
    for method, handler in handlers.items():
        if method == "get":
            router.add_get(path, handler)
        else:
            router.add_route(method.upper(), path, handler)


JSON_TYPE = "application/json"
MAX_JSON_DEPTH = 64  # RabbitMQ's definitions nest 5 deep; a deeper body is an attack


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_depth(data: Any) -> int:
    """How deep `data` nests (a scalar: 0), walked without recursion."""
    deepest, todo = 0, [(data, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict):
            item = list(item.values())
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, depth)
        todo.extend((child, depth + 1) for child in item if isinstance(child, dict | list))
    return deepest


def too_deep() -> OpError:
    return bad_request(f"not_json: nested deeper than {MAX_JSON_DEPTH} levels")


def parse_json(raw: bytes | str) -> Any:
    """A client's JSON, bounded: malformed (or NaN/Infinity) is RabbitMQ's 400
    "not_json"; nested deeper than MAX_JSON_DEPTH a 400 saying so, before the decoder
    or any handler recurses that deep (a 100,000-deep body was a RecursionError)."""
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise too_deep() from None
    except ValueError:
        raise bad_request("not_json") from None
    if json_depth(data) > MAX_JSON_DEPTH:
        raise too_deep()
    return data


async def body_json(request: web.Request, default: Any = None) -> Any:
    """The request's JSON body; an empty body is `default`; a body that is not
    `application/json` is refused with RabbitMQ's 415 (its answer to a text/plain
    definitions upload: a web page can send text/plain across origins without a
    preflight, never application/json); bad JSON is RabbitMQ's 400 "not_json"."""
    from ackmq.server.http.app import MAX_BODY
    if request.content_length is not None and request.content_length > MAX_BODY:
        # refused before reading: a client announcing 1 GB gets its answer at once
        raise OpError(413, "Payload Too Large", f"request body above {MAX_BODY} bytes")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise OpError(413, "Payload Too Large", f"request body above {MAX_BODY} bytes"
                        ) from None
    if not raw.strip():
        return {} if default is None else default
    if request.content_type != JSON_TYPE:
        raise web.HTTPUnsupportedMediaType(text="")  # RabbitMQ's: no body
    return parse_json(raw)


async def body_object(request: web.Request) -> dict[str, Any]:
    data = await body_json(request)
    if not isinstance(data, dict):
        raise bad_request("not_json")
    return data


def flag(value: Any, default: bool = False) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise OpError(400, "bad_request", f"not_boolean: {value!r}", ["not_boolean", value])


def _pick(item: dict[str, Any], path: list[str]) -> Any:
    v: Any = item
    for p in path:
        if not isinstance(v, dict) or p not in v:
            return None
        v = v[p]
    return v


def _columns(item: dict[str, Any], cols: list[list[str]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in cols:
        v = _pick(item, path)
        if v is None and not (len(path) == 1 and path[0] in item):
            continue
        node = out
        for p in path[:-1]:
            node = node.setdefault(p, {})
        node[path[-1]] = v
    return out


CHUNK = 256  # items built (or encoded) per event-loop turn in a big listing


async def alisting(request: web.Request, items: Iterable[dict[str, Any]]
                   ) -> web.StreamResponse:
    """`listing` for what may be big (10,000 queues): without sort/page/columns
    parameters the items are pulled from the (lazy) iterable CHUNK at a time, encoded
    and written, giving the loop back in between, so deliveries never wait for a whole
    listing (SPEC M1, issue 20); the chunk's dicts die young (no garbage-collector
    pass over a whole listing held in memory)."""
    if {"sort", "page", "columns", "sort_reverse"}.intersection(request.query):
        out: list[dict[str, Any]] = []
        it = iter(items)
        while chunk := list(islice(it, CHUNK)):
            out.extend(chunk)
            await asyncio.sleep(0)
        return json_response(_shape(request, out))
    it = iter(items)
    first = list(islice(it, CHUNK))
    if len(first) < CHUNK:
        return json_response(first)
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    chunk, sep = first, b"["
    while chunk:
        part = json.dumps(chunk, separators=(",", ":")).encode()
        await resp.write(sep + part[1:-1])
        sep = b","
        await asyncio.sleep(0)
        chunk = list(islice(it, CHUNK))
    await resp.write(b"]")
    await resp.write_eof()
    return resp


def listing(request: web.Request, items: list[dict[str, Any]]) -> web.Response:
    return json_response(_shape(request, items))


def _shape(request: web.Request, items: list[dict[str, Any]]) -> Any:
    """`?columns=a,b.c`, `?sort=name&sort_reverse=true`, and `?page=N&page_size=M`
    (with `name`, `use_regex`) answered as RabbitMQ's paginated object."""
    qs = request.query
    sort = qs.get("sort")
    if sort:
        path = sort.split(".")
        items.sort(key=lambda i: (_pick(i, path) is None, str(_pick(i, path))
                                  if not isinstance(_pick(i, path), int | float)
                                  else _pick(i, path)))
    if flag(qs.get("sort_reverse"), False):
        items.reverse()
    page = qs.get("page")
    result: Any = items
    if page is not None:
        result = _paginate(qs, items, page)
    cols = qs.get("columns")
    if cols:
        paths = [c.split(".") for c in cols.split(",") if c]
        if isinstance(result, dict):
            result["items"] = [_columns(i, paths) for i in result["items"]]
        else:
            result = [_columns(i, paths) for i in result]
    return result


def one(request: web.Request, item: dict[str, Any]) -> web.Response:
    cols = request.query.get("columns")
    if cols:
        item = _columns(item, [c.split(".") for c in cols.split(",") if c])
    return json_response(item)


def no_content(status: int = 204, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, headers=headers)


def _paginate(qs: Any, items: list[dict[str, Any]], page: str) -> dict[str, Any]:
    """rabbit_mgmt_util:paginate with its answers: unparsable -> "Pagination parameters
    are invalid"; page < 1 or a page size outside 1..500 -> invalid_pagination_parameters;
    a page past the end -> page_out_of_range."""
    invalid = OpError(400, "bad_request", "Pagination parameters are invalid")
    size_text = qs.get("page_size")
    try:
        pageno = int(page)
        size = int(size_text) if size_text is not None else 100
    except ValueError:
        raise invalid from None
    if pageno < 1 or not 1 <= size <= 500:
        raise OpError(400, "invalid_pagination_parameters",
                        f"Invalid pagination parameters: page number {pageno}, page size "
                        f"{size_text if size_text is not None else 'undefined'}")
    total = len(items)
    name = qs.get("name")
    if name:
        if flag(qs.get("use_regex"), False):
            try:
                rx = re.compile(name)
            except re.error:
                raise invalid from None
            items = [i for i in items if rx.search(str(i.get("name", "")))]
        else:
            items = [i for i in items if name.lower() in str(i.get("name", "")).lower()]
    filtered = len(items)
    if (pageno - 1) * size >= filtered and pageno > 1:
        raise OpError(400, "page_out_of_range", f"Page out of range, page: {pageno} page "
                        f"size: {size}, len: {filtered}")
    chunk = items[(pageno - 1) * size: pageno * size]
    return {"filtered_count": filtered, "item_count": len(chunk), "items": chunk,
            "page": pageno, "page_count": max(1, -(-filtered // size)), "page_size": size,
            "total_count": total}
