"""Users, vhosts and permissions (SPEC U1-U3), after RabbitMQ's internal auth backend.

Password hashes use RabbitMQ's layout so definitions exported by `rabbitmqctl
export_definitions` import and log in unchanged: base64(salt(4 bytes) + H(salt +
password)), H = SHA-256 by default (`rabbit_password_hashing_sha256`); SHA-512 and MD5
hashes are accepted on import. Permissions are three regular expressions per user and
vhost (configure, write, read), matched against the resource name with `re.search`
(RabbitMQ's `re:run`: unanchored, so `""` is rewritten to `^$`); the default exchange is
matched and named as `amq.default`.

The model is plain data and decisions; it never touches a file. Whoever owns it (the
server) hands it a `save` callable that makes a snapshot durable (store/accessfile.py),
called after every change before the change is acknowledged; what `save` returns is
kept in `saved` (the server's writer returns a Future it awaits before answering).
Inside `batch()` (a definitions import) the changes are in effect at once but saved
once, at the batch's end: one snapshot for the request, not one per user.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ackmq.broker.errors import AccessRefused

SHA256 = "rabbit_password_hashing_sha256"
SHA512 = "rabbit_password_hashing_sha512"
MD5 = "rabbit_password_hashing_md5"
_HASHES: dict[str, Callable[[bytes], Any]] = {
    SHA256: hashlib.sha256, SHA512: hashlib.sha512, MD5: hashlib.md5}

DEFAULT_VHOST = "/"
EMPTY_USER = "Bad argument: user cannot be an empty string"  # rabbitmqctl 3.10's text
FULL = (".*", ".*", ".*")


class AccessError(Exception):
    """An admin operation RabbitMQ refuses (no such user/vhost, already exists, bad
    regex): `text` is what rabbitmqctl would print, `code` its exit status."""

    def __init__(self, text: str, code: int = 1) -> None:
        super().__init__(text)
        self.text = text
        self.code = code


def hash_password(password: str, algorithm: str = SHA256, salt: bytes | None = None) -> str:
    """RabbitMQ's salted hash: base64(salt + H(salt + utf8(password)))."""
    salt = os.urandom(4) if salt is None else salt
    digest = _HASHES[algorithm](salt + password.encode("utf-8")).digest()
    return base64.b64encode(salt + digest).decode("ascii")


def check_password(password_hash: str, algorithm: str, password: str) -> bool:
    """As rabbit_auth_backend_internal: an empty password never logs in; a user whose
    hash is empty (cleared) cannot log in with a password."""
    if not password or not password_hash:
        return False
    h = _HASHES.get(algorithm)
    if h is None:
        return False
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except ValueError:
        return False
    if len(raw) < 5:
        return False
    salt, digest = raw[:4], raw[4:]
    return hmac.compare_digest(h(salt + password.encode("utf-8")).digest(), digest)


@dataclass
class User:
    name: str
    password_hash: str
    hashing_algorithm: str = SHA256
    tags: list[str] = field(default_factory=list)


@dataclass
class Permission:
    configure: str
    write: str
    read: str
    # compiled once: checked on the hot path through the channel's cache
    _res: tuple[re.Pattern[str], ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        self._res = tuple(re.compile(p if p else "^$") for p in
                          (self.configure, self.write, self.read))

    def allows(self, kind: int, name: str) -> bool:
        return self._res[kind].search(name) is not None


@dataclass
class TopicPermission:
    """RabbitMQ's topic permission of a user on one exchange of a vhost: write and read
    regular expressions matched against a routing key (publish) or binding key (bind)
    of a topic exchange. `{username}` and `{vhost}` are replaced by the user's and the
    vhost's names before matching, as RabbitMQ 3.10 does (plain text, not escaped);
    a protocol may bring more: MQTT's `{client_id}`, as RabbitMQ's MQTT plugin (left as
    it is where none is given, as RabbitMQ does for AMQP)."""

    write: str
    read: str
    _res: tuple[re.Pattern[str] | None, ...] = field(default=(), repr=False, compare=False)

    def expanded(self, user: str, vhost: str,
                 variables: Mapping[str, str] | None = None) -> TopicPermission:
        """A copy with the variables filled and the patterns compiled (a pattern that the
        expansion made invalid matches nothing)."""
        t = TopicPermission(self.write, self.read)
        res: list[re.Pattern[str] | None] = []
        for p in (self.write, self.read):
            p = (p or "^$").replace("{username}", user).replace("{vhost}", vhost)
            for name, value in (variables or {}).items():
                p = p.replace("{" + name + "}", value)
            try:
                res.append(re.compile(p))
            except re.error:
                res.append(None)
        t._res = tuple(res)
        return t

    def allows(self, kind: int, key: str) -> bool:
        r = self._res[kind - 1]  # WRITE=1 -> 0, READ=2 -> 1
        return r is not None and r.search(key) is not None


CONFIGURE, WRITE, READ = 0, 1, 2
_PERM_NAMES = ("configure", "write", "read")


def compile_check(pattern: str) -> str | None:
    """None if `pattern` is a valid regex, else the reason (the caller's error text)."""
    try:
        re.compile(pattern)
    except re.error as e:
        return str(e)
    return None


VHOST_LIMITS = ("max-connections", "max-queues", "max-scheduled-messages")
USER_LIMITS = ("max-connections", "max-channels")


def _check_limits(limits: Any, allowed: tuple[str, ...]) -> dict[str, int]:
    """RabbitMQ's validation of a limits JSON object (rabbit_parameter_validation)."""
    if not isinstance(limits, dict):
        raise AccessError("JSON decoding error: limits must be a JSON object such as "
                          '\'{"max-connections": 10}\'', 69)
    unknown = [k for k in limits if k not in allowed]
    if unknown:
        raise AccessError(f"Validation failed\n\nUnrecognised terms {unknown} in limits "
                          f"(ackmq supports {', '.join(allowed)})", 69)
    for k, v in limits.items():
        if isinstance(v, bool) or not isinstance(v, int):
            raise AccessError(f"Validation failed\n\n{k} should be a number, actually was "
                              f"{json.dumps(v)}", 69)
    return dict(limits)


class AccessModelLimits:
    """U6 per-vhost and per-user limits; a negative value means no limit, 0 refuses all
    (as RabbitMQ). Mixed into AccessModel."""

    vhosts: dict[str, dict[str, Any]]
    users: dict[str, User]
    user_limits: dict[str, dict[str, int]]

    def _changed(self, kind: str, name: str) -> None: ...

    def vhost_limit(self, vhost: str, key: str) -> int | None:
        v = self.vhosts.get(vhost, {}).get("limits", {}).get(key)
        return None if v is None or v < 0 else v

    def user_limit(self, user: str, key: str) -> int | None:
        v = self.user_limits.get(user, {}).get(key)
        return None if v is None or v < 0 else v

    def set_vhost_limits(self, vhost: str, limits: Any) -> None:
        """Replaces the vhost's limits, as `rabbitmqctl set_vhost_limits`."""
        if vhost not in self.vhosts:
            raise AccessError(f"Virtual host '{vhost}' does not exist", 65)
        self.vhosts[vhost]["limits"] = _check_limits(limits, VHOST_LIMITS)
        self._changed("limits", vhost)

    def clear_vhost_limits(self, vhost: str) -> None:
        if vhost not in self.vhosts:
            raise AccessError(f"Virtual host '{vhost}' does not exist", 65)
        self.vhosts[vhost]["limits"] = {}
        self._changed("limits", vhost)

    def set_user_limits(self, user: str, limits: Any) -> None:
        """Merged into the user's limits, as `rabbitmqctl set_user_limits`."""
        if user not in self.users:
            raise AccessError(f"User \"{user}\" does not exist", 69)
        self.user_limits.setdefault(user, {}).update(_check_limits(limits, USER_LIMITS))
        self._changed("limits", user)

    def clear_user_limits(self, user: str, key: str) -> None:
        if user not in self.users:
            raise AccessError(f"User \"{user}\" does not exist", 69)
        if key == "all":
            self.user_limits.pop(user, None)
        else:
            self.user_limits.get(user, {}).pop(key, None)
        self._changed("limits", user)


class AccessModel(AccessModelLimits):
    """Users, vhost names, permissions and limits. Changes call `save(snapshot)` first
    (the server acknowledges once `saved` says it is durable) and then the listeners
    (`kind, name`) so the server can act
    (close connections of a deleted vhost or user, drop channel permission caches)."""

    def __init__(self, save: Callable[[dict[str, Any]], Any] | None = None) -> None:
        self.users: dict[str, User] = {}
        self.vhosts: dict[str, dict[str, Any]] = {}  # name -> metadata (limits)
        self.permissions: dict[tuple[str, str], Permission] = {}  # (user, vhost)
        # (user, vhost) -> exchange -> topic permission; a user with none for an exchange
        # may use every routing key on it (RabbitMQ)
        self.topic_permissions: dict[tuple[str, str], dict[str, TopicPermission]] = {}
        self.user_limits: dict[str, dict[str, int]] = {}
        self.save = save
        self.saved: Any = None  # what the last `save` returned (the writer's Future)
        self._batch = 0  # depth of batch(); > 0: saving waits for its end
        self._unsaved = False
        self.listeners: list[Callable[[str, str], None]] = []
        # every open channel's cache, emptied on every change (as RabbitMQ: a revoked
        # permission refuses even what an open channel was allowed a moment ago)
        self.caches: weakref.WeakSet[ChannelAccess] = weakref.WeakSet()

    # -- first start ----------------------------------------------------------------
    @classmethod
    def seeded(cls, users: dict[str, str], save: Callable[[dict[str, Any]], Any] | None
               ) -> AccessModel:
        """RabbitMQ's first boot: vhost "/", the default user(s) as administrator with
        full permissions on it."""
        m = cls(save)
        m.vhosts[DEFAULT_VHOST] = {}
        for name, password in users.items():
            m.users[name] = User(name, hash_password(password), SHA256, ["administrator"])
            m.permissions[(name, DEFAULT_VHOST)] = Permission(*FULL)
        m._changed("init", "")
        return m

    # -- persistence ------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """RabbitMQ definitions' layout (users, vhosts, permissions), so the file reads
        like `rabbitmqctl export_definitions` output."""
        return {
            "users": [{"name": u.name, "password_hash": u.password_hash,
                       "hashing_algorithm": u.hashing_algorithm, "tags": list(u.tags),
                       "limits": dict(self.user_limits.get(u.name, {}))}
                      for u in self.users.values()],
            "vhosts": [{"name": n, "limits": dict(meta.get("limits", {}))}
                       for n, meta in self.vhosts.items()],
            "permissions": [{"user": u, "vhost": v, "configure": p.configure,
                             "write": p.write, "read": p.read}
                            for (u, v), p in self.permissions.items()],
            "topic_permissions": [{"user": u, "vhost": v, "exchange": x, "write": t.write,
                                   "read": t.read}
                                  for (u, v), by_x in self.topic_permissions.items()
                                  for x, t in by_x.items()],
        }

    @classmethod
    def load(cls, data: dict[str, Any], save: Callable[[dict[str, Any]], Any] | None
             ) -> AccessModel:
        """From our snapshot or a RabbitMQ definitions export (tags as a list or a
        comma-separated string, as RabbitMQ 3.10 writes them)."""
        m = cls(save)
        for u in data.get("users", []):
            tags = u.get("tags", [])
            if isinstance(tags, str):
                tags = [t for t in (s.strip() for s in tags.split(",")) if t]
            algo = u.get("hashing_algorithm") or SHA256
            if algo not in _HASHES:
                raise AccessError(f"user '{u['name']}': unsupported hashing algorithm "
                                  f"'{algo}' (supported: {', '.join(_HASHES)})")
            m.users[u["name"]] = User(u["name"], u.get("password_hash", ""), algo, list(tags))
            if u.get("limits"):
                m.user_limits[u["name"]] = {k: int(v) for k, v in u["limits"].items()}
        for v in data.get("vhosts", []):
            m.vhosts[v["name"]] = {"limits": {k: int(x) for k, x in
                                              (v.get("limits") or {}).items()}}
        for p in data.get("permissions", []):
            m.permissions[(p["user"], p["vhost"])] = Permission(p["configure"], p["write"],
                                                                p["read"])
        for t in data.get("topic_permissions", []):
            m.topic_permissions.setdefault((t["user"], t["vhost"]), {})[t["exchange"]] = \
                TopicPermission(t["write"], t["read"])
        return m

    def _changed(self, kind: str, name: str) -> None:
        if self._batch:  # listeners now (a vhost must exist for what follows in it)
            self._unsaved = True
        else:
            self._commit()
        for fn in list(self.listeners):
            fn(kind, name)

    def _commit(self) -> None:
        """Channels see the change from their next check; the snapshot goes to `save`."""
        for c in list(self.caches):
            c.invalidate()
        if self.save is not None:
            self.saved = self.save(self.snapshot())

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Many changes, one save at the end (also when the body raises: what was
        changed is in effect and must be saved). Run without yielding to the event
        loop, so no channel checks against a half-applied batch."""
        self._batch += 1
        try:
            yield
        finally:
            self._batch -= 1
            if not self._batch and self._unsaved:
                self._unsaved = False
                self._commit()

    # -- authentication -------------------------------------------------------------------
    def authenticate(self, name: str, password: str) -> User | None:
        u = self.users.get(name)
        if u is None or not check_password(u.password_hash, u.hashing_algorithm, password):
            return None
        return u

    def vhost_access(self, user: str, vhost: str) -> bool:
        return (user, vhost) in self.permissions

    def permission(self, user: str, vhost: str) -> Permission | None:
        return self.permissions.get((user, vhost))

    # -- users ------------------------------------------------------------------------------
    def _user(self, name: str) -> User:
        u = self.users.get(name)
        if u is None:
            raise AccessError(f"User \"{name}\" does not exist", 67)
        return u

    def add_user(self, name: str, password: str) -> None:
        if not name:  # rabbitmqctl add_user '' (exit 65, its text)
            raise AccessError(EMPTY_USER, 65)
        if name in self.users:
            raise AccessError(f"User \"{name}\" already exists", 70)
        self.users[name] = User(name, hash_password(password) if password else "")
        self._changed("user", name)

    def import_user(self, name: str, password_hash: str, algorithm: str = SHA256,
                    tags: list[str] | None = None) -> None:
        # RabbitMQ 3.10's import takes a user named "" (its ctl refuses one): refused
        # here too, so the definitions API cannot make an account rabbitmqctl could not
        if not name:
            raise AccessError(EMPTY_USER, 65)
        if algorithm not in _HASHES:
            raise AccessError(f"unsupported hashing algorithm '{algorithm}'", 64)
        self.users[name] = User(name, password_hash, algorithm, list(tags or []))
        self._changed("user", name)

    def delete_user(self, name: str) -> None:
        self._user(name)
        del self.users[name]
        for key in [k for k in self.permissions if k[0] == name]:
            del self.permissions[key]
        for key in [k for k in self.topic_permissions if k[0] == name]:
            del self.topic_permissions[key]
        self.user_limits.pop(name, None)
        self._changed("delete_user", name)

    def change_password(self, name: str, password: str) -> None:
        u = self._user(name)
        u.password_hash, u.hashing_algorithm = hash_password(password), SHA256
        self._changed("user", name)

    def set_user_tags(self, name: str, tags: list[str]) -> None:
        self._user(name).tags = list(tags)
        self._changed("user", name)

    # -- vhosts -----------------------------------------------------------------------------
    def add_vhost(self, name: str) -> bool:
        """False when it exists already (RabbitMQ 3.10's add_vhost then succeeds quietly)."""
        if not name:
            raise AccessError("vhost name must not be empty", 64)
        if "\x00" in name:
            raise AccessError("vhost name must not contain NUL", 64)
        if name in self.vhosts:
            return False
        self.vhosts[name] = {"limits": {}}
        self._changed("vhost", name)
        return True

    def delete_vhost(self, name: str) -> None:
        if name not in self.vhosts:
            raise AccessError(f"Virtual host '{name}' does not exist", 65)
        del self.vhosts[name]
        for key in [k for k in self.permissions if k[1] == name]:
            del self.permissions[key]
        for key in [k for k in self.topic_permissions if k[1] == name]:
            del self.topic_permissions[key]
        self._changed("delete_vhost", name)

    # -- permissions --------------------------------------------------------------------
    def set_permissions(self, user: str, vhost: str, configure: str, write: str,
                        read: str) -> None:
        self._user(user)
        if vhost not in self.vhosts:
            raise AccessError(f"Virtual host {vhost} does not exist", 69)
        for pattern in (configure, write, read):
            problem = compile_check(pattern)
            if problem is not None:
                raise AccessError(f"regular expression '{pattern}' is invalid: {problem}", 69)
        self.permissions[(user, vhost)] = Permission(configure, write, read)
        self._changed("permissions", user)

    def clear_permissions(self, user: str, vhost: str) -> None:
        self._user(user)
        if vhost not in self.vhosts:
            raise AccessError(f"Virtual host {vhost} does not exist", 69)
        self.permissions.pop((user, vhost), None)
        self._changed("permissions", user)

    # -- topic permissions (rabbitmqctl set/clear_topic_permissions) -----------------
    def _topic_target(self, user: str, vhost: str) -> None:
        """rabbitmqctl's checks and texts for the topic permission verbs."""
        if user not in self.users:
            raise AccessError(f"User {user} does not exist", 67)
        if vhost not in self.vhosts:
            raise AccessError(f"Virtual host {vhost} does not exist", 69)

    def set_topic_permissions(self, user: str, vhost: str, exchange: str, write: str,
                              read: str) -> None:
        """The exchange need not exist (as RabbitMQ)."""
        self._topic_target(user, vhost)
        for pattern in (write, read):
            problem = compile_check(pattern)
            if problem is not None:
                raise AccessError(f"regular expression '{pattern}' is invalid: {problem}", 69)
        self.topic_permissions.setdefault((user, vhost), {})[exchange] = \
            TopicPermission(write, read)
        self._changed("topic_permissions", user)

    def clear_topic_permissions(self, user: str, vhost: str, exchange: str | None = None
                                ) -> None:
        """One exchange's, or all of the user's in the vhost; none there is no error."""
        self._topic_target(user, vhost)
        by_x = self.topic_permissions.get((user, vhost))
        if by_x is not None:
            if exchange is None:
                by_x.clear()
            else:
                by_x.pop(exchange, None)
            if not by_x:
                del self.topic_permissions[(user, vhost)]
        self._changed("topic_permissions", user)

    def topic_permission(self, user: str, vhost: str,
                         variables: Mapping[str, str] | None = None
                         ) -> dict[str, TopicPermission]:
        """The user's topic permissions in the vhost, variables filled (for a channel)."""
        return {x: t.expanded(user, vhost, variables)
                for x, t in self.topic_permissions.get((user, vhost), {}).items()}


def resource_text(kind: str, name: str, vhost: str) -> str:
    return f"{kind} '{name}' in vhost '{vhost}'"


class ChannelAccess:
    """One channel's permission checks with a cache of what was allowed (RabbitMQ keeps
    the last 12 permitted resources per channel; we keep sets, emptied by the model on
    any change), so a publish to an already permitted exchange costs one set lookup:
    `if name not in access.write_exchanges: topic = access.check_publish(name)`.

    Topic permissions cost nothing there: an exchange the user has a topic permission
    for never enters `write_exchanges`, so only publishes to it take the slow path
    (`check_topic` on the routing key, itself cached per channel)."""

    __slots__ = ("model", "user", "vhost", "variables", "_perm", "_ok", "write_exchanges",
                 "topics", "_topic_ok", "__weakref__")

    def __init__(self, model: AccessModel, user: str, vhost: str,
                 variables: Mapping[str, str] | None = None) -> None:
        """`variables`: a protocol's own topic-permission variables (MQTT's client_id)."""
        self.model = model
        self.user = user
        self.vhost = vhost
        self.variables = variables
        self._ok: set[tuple[int, str, str]] = set()
        self.write_exchanges: set[str] = set()  # the publish hot path's own cache
        self._perm: Permission | None = model.permission(user, vhost)
        # exchange -> topic permission (variables filled); empty for most users
        self.topics: dict[str, TopicPermission] = model.topic_permission(user, vhost,
                                                                          variables)
        self._topic_ok: set[tuple[int, str, str]] = set()
        model.caches.add(self)

    def invalidate(self) -> None:
        self._ok.clear()
        self.write_exchanges.clear()
        self._perm = self.model.permission(self.user, self.vhost)
        self.topics = self.model.topic_permission(self.user, self.vhost, self.variables)
        self._topic_ok.clear()

    def check(self, perm: int, kind: str, name: str) -> None:
        """Raise 403 unless `user` has `perm` on the resource, as rabbit_channel does."""
        key = (perm, kind, name)
        if key in self._ok:
            return
        shown = "amq.default" if kind == "exchange" and name == "" else name
        p = self._perm
        if p is None or not p.allows(perm, shown):
            raise AccessRefused(_PERM_NAMES[perm], "access to " + resource_text(
                kind, shown, self.vhost) + f" refused for user '{self.user}'")
        if len(self._ok) < 1024:
            self._ok.add(key)

    def check_publish(self, exchange: str) -> bool:
        """basic.publish: write on the exchange; remembered for the next publish unless
        the user has a topic permission for that exchange. True: call `check_topic`
        on the routing key once the exchange is known (RabbitMQ checks it after the
        exchange's lookup and its internal flag)."""
        self.check(WRITE, "exchange", exchange)
        if exchange in self.topics:
            return True
        if len(self.write_exchanges) < 1024:
            self.write_exchanges.add(exchange)
        return False

    def topic_refusal(self, perm: int, exchange: str, key: str) -> str | None:
        """None if the routing/binding `key` is allowed on `exchange` for `perm` (WRITE
        to publish, READ to bind) by the user's topic permission (or there is none),
        else RabbitMQ's text (rabbit_access_control:check_topic_access)."""
        t = self.topics.get(exchange)
        if t is None:
            return None
        ok = (perm, exchange, key)
        if ok in self._topic_ok:
            return None
        if not t.allows(perm, key):
            return (f"access to topic '{key}' in exchange '{exchange}' in vhost "
                    f"'{self.vhost}' refused for user '{self.user}'")
        if len(self._topic_ok) < 1024:
            self._topic_ok.add(ok)
        return None

    def check_topic(self, perm: int, exchange: Any, key: str) -> None:
        """Publish (WRITE) or bind (READ) on a topic exchange (an `Exchange`): 403
        unless the user's topic permission for it allows `key` (rabbit_channel's
        check_{write,read}_permitted_on_topic: topic exchanges only)."""
        if exchange.type != "topic" or not self.topics:
            return
        text = self.topic_refusal(perm, exchange.name, key)
        if text is not None:
            raise AccessRefused(_PERM_NAMES[perm], text)

    def configure(self, kind: str, name: str) -> None:
        self.check(CONFIGURE, kind, name)

    def write(self, kind: str, name: str) -> None:
        self.check(WRITE, kind, name)

    def read(self, kind: str, name: str) -> None:
        self.check(READ, kind, name)


__all__ = ["AccessModel", "AccessError", "ChannelAccess", "User", "Permission",
           "TopicPermission", "WRITE", "READ",
           "hash_password", "check_password", "SHA256", "SHA512", "MD5", "_PERM_NAMES"]
