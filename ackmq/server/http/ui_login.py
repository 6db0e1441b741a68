"""The web UI's login form and logout (SPEC U3): a session cookie instead of the
browser's Basic prompt, so the browser holds nothing it would send along with a request
another site makes (session.py). The same password check as the API's and the AMQP
login; the UI needs a management tag, as RabbitMQ's ("Not management user")."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ackmq.server.http.app import SERVER_KEY, Refused, has_tag, login, public
from ackmq.server.http.session import SESSIONS_KEY, cookie_name
from ackmq.server.http.ui_html import e

HEADERS = {"Cache-Control": "no-store", "X-Frame-Options": "DENY",
           "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'"}


def _next(value: Any) -> str:
    """Where to go after logging in: a path of ours only (never //host or a URL)."""
    target = str(value or "/")
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _page(next_: str, message: str = "", name: str = "") -> web.Response:
    msg = f'<div class="flash err" id="flash">{e(message)}</div>' if message else ""
    body = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Login · ackmq</title>
<link rel="stylesheet" href="/static/ackmq.css">
</head><body>
<header><span class="logo">ackmq</span></header>
<main><h1>Login</h1>{msg}
<form method="post" action="/login" id="login" class="login">
<input type="hidden" name="next" value="{e(next_)}">
<label>Username <input name="username" id="username" value="{e(name)}" required
autocomplete="username" autofocus></label>
<label>Password <input name="password" id="password" type="password"
autocomplete="current-password"></label>
<button type="submit" id="login-button">Login</button></form></main>
</body></html>"""
    return web.Response(text=body, content_type="text/html", headers=HEADERS)


@public
async def login_page(request: web.Request) -> web.Response:
    return _page(_next(request.query.get("next")))


@public
async def login_post(request: web.Request) -> web.StreamResponse:
    """Cross-origin posts are refused before this (a page elsewhere cannot log a
    browser in as someone else)."""
    data = await request.post()
    name, password = str(data.get("username", "")), str(data.get("password", ""))
    target = _next(data.get("next"))
    try:
        user = login(request.app[SERVER_KEY], request, name, password)
    except Refused as err:
        return _page(target, err.reason or "Login failed", name)
    if not has_tag(user, "management"):
        return _page(target, "Not management user", name)
    token = request.app[SESSIONS_KEY].open(user)
    resp = web.Response(status=303, headers={"Location": target})
    resp.set_cookie(cookie_name(request), token, path="/", httponly=True,
                    samesite="Strict", secure=request.secure)
    return resp


@public
async def logout(request: web.Request) -> web.StreamResponse:
    name = cookie_name(request)
    request.app[SESSIONS_KEY].close(request.cookies.get(name))
    resp = web.Response(status=303, headers={"Location": "/login"})
    resp.del_cookie(name, path="/")
    return resp


def register(app: web.Application) -> None:
    app.router.add_get("/login", login_page)
    app.router.add_post("/login", login_post)
    app.router.add_post("/logout", logout)
