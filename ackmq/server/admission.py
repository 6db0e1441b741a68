"""Admission: who may open a connection, for every protocol (AMQP, STOMP, the HTTP API).

Login by mechanism (PLAIN, AMQPLAIN, EXTERNAL with a verified client certificate),
RabbitMQ's loopback rule for guest, vhost access (U3) and the connection limits (U6)
are decided here, once; the answer is a user name or a `Refusal` (what was refused,
the limit that was hit), and each protocol words the refusal its own way (AMQP's 403
and 530 texts, STOMP's ERROR frames, HTTP's 401). This is the most security-sensitive
code of the broker: keep it in one place.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ackmq.protocol.amqp import decode_table
from ackmq.server.parameters import LOCAL_LOGINS

if TYPE_CHECKING:
    from ackmq.broker.access import AccessModel
    from ackmq.server.context import FrontEnd
    from ackmq.server.transport import ClientConnection

# Refusal kinds
BAD_CREDENTIALS = "bad_credentials"  # unknown user, wrong password, unknown certificate user
LOOPBACK_ONLY = "loopback_only"  # the right password, for a user allowed on loopback only
VHOST_LIMIT = "vhost_limit"  # the vhost's max-connections is reached (U6)
USER_LIMIT = "user_limit"  # the user's max-connections is reached (U6)
VHOST_ACCESS = "vhost_access"  # the user has no permissions on the vhost (U3)


@dataclass(frozen=True, slots=True)
class Refusal:
    kind: str
    user: str
    limit: int = 0  # for VHOST_LIMIT and USER_LIMIT


def is_loopback(peer: Any) -> bool:
    """A peer address (`transport.get_extra_info("peername")`) on this machine; no address
    (a Unix socket, in-process) counts as loopback."""
    if not peer:
        return True
    try:
        address = ipaddress.ip_address(peer[0].split("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 on a dual-stack socket
    return address.is_loopback


def counted(stats: Any, protocol: str, got: str | Refusal) -> str | Refusal:
    """`got`, a login's outcome, counted in the broker's login attempts (/metrics)."""
    stats.auth.count(protocol, not isinstance(got, Refusal))
    return got


def password_login(access: AccessModel, loopback_users: Iterable[str], user: str,
                   password: str, peer: Any) -> str | Refusal:
    """A user name and password from a peer address: the user, or why not. Users in
    `loopback_users` (guest, as RabbitMQ's default) are admitted from loopback only."""
    if not user or access.authenticate(user, password) is None:
        if not (user in access.users and is_loopback(peer)
                and LOCAL_LOGINS.accepts(user, password)):  # a shovel's amqp://
            return Refusal(BAD_CREDENTIALS, user)
    if user in loopback_users and not is_loopback(peer):
        return Refusal(LOOPBACK_ONLY, user)
    return user


def certificate_login(access: AccessModel, loopback_users: Iterable[str], user: str | None,
                      peer: Any) -> str | Refusal:
    """EXTERNAL (U4): a verified client certificate names the user (its CN); no password.
    `user` None or "": no verified certificate."""
    if not user or user not in access.users or (user in loopback_users
                                                and not is_loopback(peer)):
        return Refusal(BAD_CREDENTIALS, user or "")
    return user


def sasl_credentials(mechanism: str, response: Any) -> tuple[str, str]:
    """User and password from a PLAIN or AMQPLAIN response ("", "" when unreadable)."""
    raw = response.encode("utf-8", "surrogateescape") if isinstance(response, str) \
        else bytes(response or b"")
    if mechanism == "PLAIN":
        parts = raw.split(b"\x00")
        if len(parts) == 3:
            return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
        return "", ""
    if mechanism == "AMQPLAIN":
        try:
            table = decode_table(struct.pack(">I", len(raw)) + raw)
        except Exception:  # any malformed table is just a failed login
            return "", ""
        user, pw = table.get("LOGIN", ""), table.get("PASSWORD", "")
        return (user.decode() if isinstance(user, bytes) else str(user),
                pw.decode() if isinstance(pw, bytes) else str(pw))
    return "", ""


def sasl_login(ctx: FrontEnd, mechanism: str, response: Any, peer: Any,
               certificate_user: str | None) -> str | Refusal:
    """Login by SASL mechanism: EXTERNAL (the certificate's user), PLAIN or AMQPLAIN."""
    loopback_users = ctx.config.loopback_users
    if mechanism == "EXTERNAL":
        return certificate_login(ctx.access, loopback_users, certificate_user, peer)
    user, password = sasl_credentials(mechanism, response)
    return password_login(ctx.access, loopback_users, user, password, peer)


def open_vhost(ctx: FrontEnd, conn: ClientConnection, user: str, vhost: str
               ) -> Refusal | None:
    """May `conn`, logged in as `user`, open `vhost`? In rabbit_reader's order: the
    vhost's max-connections, the user's, then the user's access to the vhost. Every
    protocol's open connections count."""
    hit = connection_limit_reached(ctx, conn, user, vhost)
    if hit is not None:
        return hit
    if not ctx.access.vhost_access(user, vhost):
        return Refusal(VHOST_ACCESS, user)
    return None


def connection_limit_reached(ctx: FrontEnd, conn: ClientConnection, user: str, vhost: str
                             ) -> Refusal | None:
    """U6: the vhost's max-connections first (as rabbit_reader), then the user's."""
    access = ctx.access
    vlimit = access.vhost_limit(vhost, "max-connections")
    ulimit = access.user_limit(user, "max-connections")
    if vlimit is None and ulimit is None:
        return None
    opened = [c for c in ctx.connections if c.state == "open" and c is not conn]
    if vlimit is not None and sum(1 for c in opened if c.vhost_name == vhost) >= vlimit:
        return Refusal(VHOST_LIMIT, user, vlimit)
    if ulimit is not None and sum(1 for c in opened if c.user == user) >= ulimit:
        return Refusal(USER_LIMIT, user, ulimit)
    return None


def channel_limit_reached(ctx: FrontEnd, user: str) -> int | None:
    """U6: the user's max-channels when their connections have that many open, else None."""
    limit = ctx.access.user_limit(user, "max-channels")
    if limit is not None and sum(c.channel_count for c in ctx.connections
                                 if c.user == user) >= limit:
        return limit
    return None
