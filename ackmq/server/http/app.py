"""The management listener's aiohttp Application: basic auth with the broker's users
(the same check as the AMQP login), RabbitMQ's tag rules, JSON errors, and one
`register(app)` per feature module.

Feature modules (`FEATURES`) are imported by name; each defines `register(app)` and adds
its own routes, so `metrics.py` or `ui.py` come without editing anyone else's routes. A
module that is not there is skipped.

A handler states who may call it with `@requires(tag)` (RabbitMQ's
rabbit_mgmt_util:is_authorized_*: "management" by default, "monitoring",
"administrator") or `@public` (no login). The authenticated user (an
`ackmq.broker.access.User`) is `request[USER_KEY]`, or `common.user(request)`.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import json
import logging
import warnings
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ackmq.server import admission
from ackmq.server.ops import OpError

if TYPE_CHECKING:
    from ackmq.server.context import HttpContext

log = logging.getLogger("ackmq.http")

SERVER_KEY: web.AppKey[Any] = web.AppKey("ackmq_server", object)
# the logged-in user of a request (aiohttp >= 3.12 has typed request keys)
USER_KEY: Any = web.RequestKey("ackmq_user", object) if hasattr(web, "RequestKey") \
    else "ackmq_user"
FEATURES = ("api", "metrics", "ui")  # ackmq.server.http.<name>.register(app)
REALM = 'Basic realm="RabbitMQ Management"'
MAX_BODY = 64 * 1024 * 1024  # a POST /api/definitions of a large topology fits
# tag -> the tags that grant it (RabbitMQ: administrator > monitoring > management;
# policymaker is management plus policies)
_GRANTS = {
    "management": {"management", "policymaker", "monitoring", "administrator"},
    "policymaker": {"policymaker", "administrator"},
    "monitoring": {"monitoring", "administrator"},
    "administrator": {"administrator"},
}
_REFUSAL = {"management": "Not management user", "policymaker": "Not policymaker user",
            "monitoring": "Not monitor user", "administrator": "Not administrator user"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def requires(tag: str) -> Callable[[Handler], Handler]:
    """Mark a handler as needing `tag` (or a tag that includes it)."""
    def mark(fn: Handler) -> Handler:
        fn.ackmq_tag = tag  # type: ignore[attr-defined]
        return fn
    return mark


def public(fn: Handler) -> Handler:
    """No login needed (RabbitMQ's /api/auth, a Prometheus scrape endpoint)."""
    fn.ackmq_tag = None  # type: ignore[attr-defined]
    return fn


def has_tag(user: Any, tag: str) -> bool:
    return bool(_GRANTS[tag].intersection(user.tags))


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None
                  ) -> web.Response:
    return web.Response(body=json.dumps(data, separators=(",", ":")).encode(),
                        status=status, content_type="application/json", headers=headers)


def error(status: int, err: str, reason: str, headers: dict[str, str] | None = None
          ) -> web.Response:
    """RabbitMQ's error body: {"error": ..., "reason": ...}."""
    return json_response({"error": err, "reason": reason}, status, headers)


def _credentials(request: web.Request) -> tuple[str, str]:
    """RabbitMQ's answers: no Authorization -> 401 with an empty body; a Basic header
    that does not decode to user:password -> 400 with an empty body; another scheme
    (RabbitMQ would try OAuth 2) -> a failed login."""
    header = request.headers.get("Authorization")
    if header is None:
        raise _Refused(web.Response(status=401, headers={"WWW-Authenticate": REALM}))
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        raise _login_failed()
    try:
        user, sep, password = base64.b64decode(value.strip(), validate=True
                                                ).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        sep = ""
    if not sep:
        raise _Refused(web.Response(status=400))
    return user, password


def _login_failed() -> _Refused:
    return _Refused(error(401, "not_authorized", "Login failed", {"WWW-Authenticate": REALM}))


def authenticate(server: HttpContext, request: web.Request) -> Any:
    """The user named by the Authorization header (the same check as the AMQP login:
    the broker's users, guest from loopback only), or a _Refused with RabbitMQ's reply:
    a failed login is 401 "not_authorized"/"Login failed" (RabbitMQ's spelling there)."""
    name, password = _credentials(request)
    peer = request.transport.get_extra_info("peername") if request.transport else None
    got = admission.counted(server.broker.stats, "http", admission.password_login(
        server.access, server.config.loopback_users, name, password,
        peer or ("", 0)))  # no peer: not loopback
    if isinstance(got, admission.Refusal):
        if got.kind == admission.LOOPBACK_ONLY:  # guest, from afar
            raise _Refused(error(401, "not_authorised", "User can only log in via localhost"))
        raise _login_failed()
    return server.access.users[got]


class _Refused(Exception):
    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Login and tag check first, then the handler; handler errors become JSON."""
    unmatched = request.match_info.http_exception
    if isinstance(unmatched, web.HTTPMethodNotAllowed):  # before any login, as RabbitMQ
        allowed = sorted(unmatched.allowed_methods | {"HEAD", "OPTIONS"}
                         if "GET" in unmatched.allowed_methods
                         else unmatched.allowed_methods | {"OPTIONS"})
        return web.Response(status=405, headers={"Allow": ", ".join(allowed)})
    if unmatched is not None:
        return error(404, "Object Not Found", "Not Found")
    tag = getattr(request.match_info.handler, "ackmq_tag", "management")
    try:
        if tag is not None:
            user = authenticate(request.app[SERVER_KEY], request)
            if not has_tag(user, tag):
                return error(401, "not_authorised", _REFUSAL[tag])
            request[USER_KEY] = user
            with warnings.catch_warnings():  # also the first commit's name for it, which
                warnings.simplefilter("ignore")  # feature modules written on it may use
                request["user"] = user
        return await handler(request)
    except _Refused as e:
        return e.response
    except OpError as e:
        resp = json_response({"error": e.err, "reason": e.reason if e.shown is None
                              else e.shown}, e.status)
        if e.status == 413:  # the body is not read: this connection cannot go on
            resp.force_close()
        return resp
    except web.HTTPRequestEntityTooLarge:
        return error(413, "Payload Too Large", f"request body above {MAX_BODY} bytes")
    except web.HTTPException:
        raise
    except (ValueError, KeyError, TypeError) as e:  # a malformed body or parameter
        return error(400, "bad_request", str(e) or type(e).__name__)


def build_app(server: HttpContext) -> web.Application:
    app = web.Application(middlewares=[_auth], client_max_size=MAX_BODY)
    app[SERVER_KEY] = server
    from ackmq.server.http.saving import wait_saved
    app.middlewares.append(wait_saved)  # inside _auth: a change answers once saved
    for name in FEATURES:
        try:
            mod = importlib.import_module(f"ackmq.server.http.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"ackmq.server.http.{name}":
                raise
            continue
        mod.register(app)
    return app
