"""The management listener's aiohttp Application: the origin rule, sessions or basic auth
(the same check as the AMQP login), RabbitMQ's tag rules, JSON errors, and one
`register(app)` per feature module.

Feature modules (`FEATURES`) are imported by name; each defines `register(app)` and adds
its own routes, so `metrics.py` or `ui.py` come without editing anyone else's routes. A
module that is not there is skipped.

A handler states who may call it with `@requires(tag)` (RabbitMQ's
rabbit_mgmt_util:is_authorized_*: "management" by default, "monitoring",
"administrator") or `@public` (no login). The authenticated user (an
`ackmq.broker.access.User`) is `request[USER_KEY]`, or `common.user(request)`.

Who a request is: a web UI session's cookie, else HTTP Basic (programmatic clients, as
RabbitMQ). The UI's pages never answer with a Basic challenge (a login page instead,
ui_login.py); a state-changing request from another origin is refused before any
login (session.py).
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
from urllib.parse import urlencode

from aiohttp import web

from ackmq.server import admission
from ackmq.server.http.session import SESSIONS_KEY, Sessions, foreign_origin, session_user
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
        raise Refused(web.Response(status=401, headers={"WWW-Authenticate": REALM}),
                      "Login required")
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        raise _login_failed()
    try:
        user, sep, password = base64.b64decode(value.strip(), validate=True
                                                ).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        sep = ""
    if not sep:
        raise Refused(web.Response(status=400), "Bad Authorization header")
    return user, password


def _login_failed() -> Refused:
    return Refused(error(401, "not_authorized", "Login failed", {"WWW-Authenticate": REALM}),
                   "Login failed")


def authenticate(server: HttpContext, request: web.Request) -> Any:
    """The user named by the Authorization header, or a Refused with RabbitMQ's reply."""
    return login(server, request, *_credentials(request))


def login(server: HttpContext, request: web.Request, name: str, password: str) -> Any:
    """The user of a name and password (the same check as the AMQP login: the broker's
    users, guest from loopback only), or a Refused with RabbitMQ's reply: a failed
    login is 401 "not_authorized"/"Login failed" (RabbitMQ's spelling there)."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    got = admission.counted(server.broker.stats, "http", admission.password_login(
        server.access, server.config.loopback_users, name, password,
        peer or ("", 0)))  # no peer: not loopback
    if isinstance(got, admission.Refusal):
        if got.kind == admission.LOOPBACK_ONLY:  # guest, from afar
            raise Refused(error(401, "not_authorised", "User can only log in via localhost"),
                          "User can only log in via localhost")
        raise _login_failed()
    return server.access.users[got]


class Refused(Exception):
    """A request answered before its handler: `response`, and `reason` for a page."""

    def __init__(self, response: web.Response, reason: str = "") -> None:
        super().__init__(response.status)
        self.response = response
        self.reason = reason


def _user_of(request: web.Request) -> Any:
    """The session's user, else Basic's. A UI page without either leads to the login
    page, and is never answered with a Basic challenge (which the browser would cache
    and send with a request another site makes)."""
    server = request.app[SERVER_KEY]
    user = session_user(request, server.access.users)
    if user is not None:
        return user
    if request.path == "/api" or request.path.startswith("/api/"):
        return authenticate(server, request)
    if "Authorization" not in request.headers:
        raise Refused(web.Response(status=303, headers={
            "Location": "/login?" + urlencode({"next": request.path_qs})}))
    try:
        return authenticate(server, request)
    except Refused as e:
        e.response.headers.pop("WWW-Authenticate", None)
        raise


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
    foreign = foreign_origin(request)
    if foreign is not None:
        return error(403, "forbidden", f"cross-origin request refused: {foreign} is not "
                     "this broker's origin")
    try:
        if tag is not None:
            user = _user_of(request)
            if not has_tag(user, tag):
                return error(401, "not_authorised", _REFUSAL[tag])
            request[USER_KEY] = user
            with warnings.catch_warnings():  # also the first commit's name for it, which
                warnings.simplefilter("ignore")  # feature modules written on it may use
                request["user"] = user
        return await handler(request)
    except Refused as e:
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
    except web.RequestPayloadError as e:  # a body the client encoded wrongly (gzip...)
        return error(400, "bad_request", (str(e).strip().splitlines() or ["bad body"])[-1]
                     .strip())
    except (ValueError, KeyError, TypeError) as e:  # a malformed body or parameter
        return error(400, "bad_request", str(e) or type(e).__name__)


def build_app(server: HttpContext) -> web.Application:
    app = web.Application(middlewares=[_auth], client_max_size=MAX_BODY)
    app[SERVER_KEY] = server
    app[SESSIONS_KEY] = Sessions()
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
