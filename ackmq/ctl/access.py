"""rabbitmqctl's user, vhost and permission verbs, once for both ways to a broker (C6):
`LISTINGS` formats a listing from the management API's JSON, which the admin socket
(server/ctl/verbs.py) and, with `--url`, a broker's management API (ackmq's or
RabbitMQ's) both answer; `handle` does a verb over the API with the admin socket's
replies (`{"ok", "items"}` or `{"ok": false, "code", "error"}`, rabbitmqctl's codes and
texts), so `ackmq ctl` prints them the same way."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ackmq.ctl.errors import CtlError
from ackmq.ctl.http_client import HttpSource

VERBS = ("add_user", "delete_user", "change_password", "set_user_tags", "list_users",
         "add_vhost", "delete_vhost", "list_vhosts", "set_permissions", "clear_permissions",
         "list_permissions", "list_user_permissions", "trace_on", "trace_off")


def _q(s: str) -> str:
    return quote(s, safe="")


def _user(src: HttpSource, name: str) -> dict[str, Any] | None:
    try:
        return src.call("GET", f"/api/users/{_q(name)}")
    except CtlError as e:
        if e.code == 69:  # 404
            return None
        raise


def _tags(u: dict[str, Any]) -> list[str]:
    t = u.get("tags") or []
    return t.split(",") if isinstance(t, str) else list(t)


def _permission(columns: list[str]) -> Any:
    return lambda p: [p[c] for c in columns]


# listing verb -> (rabbitmqctl's columns, the row of one item of the API's JSON)
LISTINGS: dict[str, tuple[list[str], Any]] = {
    "list_users": (["user", "tags"], lambda u: [u["name"], "[" + ", ".join(_tags(u)) + "]"]),
    "list_vhosts": (["name"], lambda v: [v["name"]]),
    "list_permissions": (["user", "configure", "write", "read"],
                         _permission(["user", "configure", "write", "read"])),
    "list_user_permissions": (["vhost", "configure", "write", "read"],
                              _permission(["vhost", "configure", "write", "read"])),
}


def handle(src: HttpSource, verb: str, args: list[str], vhost: str,
           body: Any = None) -> dict[str, Any]:
    try:
        return _handle(src, verb, args, vhost)
    except CtlError as e:
        return {"ok": False, "code": e.code, "error": e.text}


def _handle(src: HttpSource, verb: str, a: list[str], vhost: str) -> dict[str, Any]:
    ok: dict[str, Any] = {"ok": True}
    if verb == "add_user":
        if _user(src, a[0]) is not None:
            raise CtlError(f'User "{a[0]}" already exists', 70)
        src.call("PUT", f"/api/users/{_q(a[0])}", {"password": a[1], "tags": ""})
    elif verb == "delete_user":
        if _user(src, a[0]) is None:
            raise CtlError(f'User "{a[0]}" does not exist', 67)
        src.call("DELETE", f"/api/users/{_q(a[0])}")
    elif verb in ("change_password", "set_user_tags"):
        u = _user(src, a[0])
        if u is None:
            raise CtlError(f'User "{a[0]}" does not exist', 67)
        if verb == "change_password":
            body = {"password": a[1], "tags": ",".join(_tags(u))}
        else:
            body = {"password_hash": u["password_hash"],
                    "hashing_algorithm": u["hashing_algorithm"], "tags": ",".join(a[1:])}
        src.call("PUT", f"/api/users/{_q(a[0])}", body)
    elif verb == "list_users":
        return {**ok, "items": src.call("GET", "/api/users")}
    elif verb == "add_vhost":
        src.call("PUT", f"/api/vhosts/{_q(a[0])}")
    elif verb == "delete_vhost":
        try:
            src.call("DELETE", f"/api/vhosts/{_q(a[0])}")
        except CtlError as e:
            if e.code == 69:
                raise CtlError(f"Virtual host '{a[0]}' does not exist", 65) from None
            raise
    elif verb == "list_vhosts":
        return {**ok, "items": src.call("GET", "/api/vhosts")}
    elif verb == "set_permissions":
        src.call("PUT", f"/api/permissions/{_q(vhost)}/{_q(a[0])}",
                 {"configure": a[1], "write": a[2], "read": a[3]})
    elif verb == "clear_permissions":
        try:
            src.call("DELETE", f"/api/permissions/{_q(vhost)}/{_q(a[0])}")
        except CtlError as e:
            if e.code != 69:  # none there: nothing to clear, as rabbitmqctl
                raise
    elif verb == "list_permissions":
        return {**ok, "items": src.call("GET", f"/api/vhosts/{_q(vhost)}/permissions")}
    elif verb == "list_user_permissions":
        return {**ok, "items": src.call("GET", f"/api/users/{_q(a[0])}/permissions")}
    elif verb in ("trace_on", "trace_off"):  # M9: RabbitMQ's PUT of the vhost's flag
        on = verb == "trace_on"
        try:
            src.call("GET", f"/api/vhosts/{_q(vhost)}")
        except CtlError as e:  # no such vhost: answered the same, nothing made
            if e.code != 69:
                raise
        else:
            flags: dict[str, Any] = {"tracing": on}
            if on and a == ["lifecycle"]:
                flags["lifecycle"] = True  # ackmq's (S10); RabbitMQ ignores the key
            src.call("PUT", f"/api/vhosts/{_q(vhost)}", flags)
        return {**ok, "message": f"Trace {'enabled' if on else 'disabled'} for vhost {vhost}"}
    return ok
