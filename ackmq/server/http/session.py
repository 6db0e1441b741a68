"""What keeps a web page on another site from acting as the logged-in user (SPEC U3):
the origin rule for every state-changing request, and the web UI's login sessions.

The origin rule: a POST, PUT, PATCH or DELETE whose `Origin` (or, absent one, whose
`Referer`) names another origin than the broker's own is refused with 403 before any
login. Browsers send `Origin` with every cross-origin request that can change
something, so a page elsewhere cannot use what the browser holds for us (a session
cookie, which `SameSite` does not keep from another port of the same host, or Basic
credentials cached from the API's prompt); curl, rabbitmqadmin and other programs send
neither header and are not affected.

Sessions: the UI's login form opens one and sets its token in a cookie that is
`HttpOnly` (no script reads it), `SameSite=Strict` and `Path=/`; the UI never answers
with a Basic challenge, so a browser never caches Basic credentials for it. A session
ends at logout, after LIFETIME, or when its user is deleted or changes password.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
COOKIE = "ackmq_session"
LIFETIME = 8 * 3600.0  # as RabbitMQ's management.login_session_timeout (8 hours)
MAX_SESSIONS = 10_000  # the oldest is dropped beyond (each needs a password to open)


def foreign_origin(request: web.Request) -> str | None:
    """The other origin a state-changing request comes from, or None (same origin, a
    safe method, or no Origin/Referer at all: not a browser acting for a page)."""
    if request.method in SAFE_METHODS:
        return None
    for header in ("Origin", "Referer"):
        value = request.headers.get(header)
        if value:
            if value == "null":  # a sandboxed frame, a data: or file: page
                return value
            try:
                parts = urlsplit(value)
            except ValueError:  # "http://[::1": not an origin, so not ours
                return value
            if parts.scheme not in ("http", "https") \
                    or _netloc(parts.scheme, parts.netloc) != _netloc(
                        request.scheme, request.host):
                return value
            return None
    return None


def _netloc(scheme: str, netloc: str) -> str:
    """host:port, lower-case, with the scheme's default port written out."""
    netloc = netloc.rpartition("@")[2].lower()
    host, sep, port = netloc.rpartition(":")
    if not sep or "]" in port:  # no port (an IPv6 literal's colons are not one)
        return f"{netloc}:{443 if scheme == 'https' else 80}"
    return f"{host}:{port}"


def cookie_name(request: web.Request) -> str:
    """One cookie per listener port: cookies ignore ports, and two brokers on one
    host must not log each other out."""
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    return f"{COOKIE}_{sock[1]}" if sock else COOKIE


@dataclass(slots=True)
class _Session:
    user: str
    password_hash: str  # a password change ends the session
    expires: float


class Sessions:
    """The open sessions of one listener, by token (in memory: a restart logs out)."""

    def __init__(self) -> None:
        self._open: dict[str, _Session] = {}

    def open(self, user: Any) -> str:
        now = time.monotonic()
        self._open = {t: s for t, s in self._open.items() if s.expires > now}
        while len(self._open) >= MAX_SESSIONS:
            del self._open[next(iter(self._open))]
        token = secrets.token_urlsafe(32)
        self._open[token] = _Session(user.name, user.password_hash, now + LIFETIME)
        return token

    def user(self, token: str | None, users: dict[str, Any]) -> Any:
        """The user of a live session, or None."""
        s = self._open.get(token) if token else None
        if s is None:
            return None
        u = users.get(s.user)
        if u is None or u.password_hash != s.password_hash \
                or s.expires <= time.monotonic():
            self._open.pop(token or "", None)
            return None
        return u

    def close(self, token: str | None) -> None:
        self._open.pop(token or "", None)


SESSIONS_KEY: web.AppKey[Sessions] = web.AppKey("ackmq_sessions", Sessions)


def session_user(request: web.Request, users: dict[str, Any]) -> Any:
    """The user of the request's session cookie, or None."""
    sessions = request.app.get(SESSIONS_KEY)
    if sessions is None:
        return None
    return sessions.user(request.cookies.get(cookie_name(request)), users)
