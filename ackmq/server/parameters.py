"""Runtime parameters of plugged-in components (RabbitMQ's `rabbit_runtime_parameters`):
the hook through which a feature that lives above the server — a dynamic shovel
(ackmq/shovel/, which speaks AMQP through ackmq.client) — is set, listed, saved and run
by the broker without server/ importing it. `ackmq serve` (cli.py) registers the
components; an embedded broker has none, and a parameter of an unknown component is
refused as RabbitMQ refuses it.

The registry keeps the values (with the user who set them: RabbitMQ's acting user) in
`<data dir>/parameters.json`, validates through the component, and tells it when a
parameter is set, cleared, and when the broker is up (`start`: every saved parameter)
or going down (`stop`). It keeps RabbitMQ's *global* runtime parameters too
(`rabbitmqctl set_global_parameter`, `/api/global-parameters/<name>`): a name and any
JSON value, no component, saved in the same file; the MQTT front end reads two of them at
CONNECT (`mqtt_port_to_vhost_mapping`, `mqtt_default_vhosts`: docs/mqtt.md). `LocalBroker` is what a component may reach of this broker:
its AMQP address and a login as a given user (a one-off secret admission.py accepts
from loopback only), so that `amqp://` in a shovel's URI means this broker.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("ackmq.parameters")


class ParameterError(Exception):
    """A refused parameter: `texts` are the component's validation messages (RabbitMQ
    answers "Validation failed\\n\\n" and one per line)."""

    def __init__(self, texts: list[str]) -> None:
        super().__init__("\n".join(texts))
        self.texts = texts

    @property
    def reason(self) -> str:
        return "Validation failed\n\n" + "".join(t + "\n" for t in self.texts)


class Component(Protocol):
    """What a registered component implements (all called on the broker's loop)."""

    name: str

    def validate(self, vhost: str, name: str, value: Any, user: str) -> None:
        """Raise ParameterError with RabbitMQ's texts for a bad value."""

    def set(self, vhost: str, name: str, value: Any, user: str) -> None:
        """A parameter was set (or the broker came up with it saved): run it."""

    def clear(self, vhost: str, name: str) -> None:
        """A parameter was cleared: stop it."""

    def status(self, vhost: str | None) -> list[dict[str, Any]]:
        """What runs, as the component's status API shows it (/api/shovels)."""

    def restart(self, vhost: str, name: str) -> bool:
        """Restart one (False: no such)."""

    async def stop(self) -> None:
        """The broker is going down."""


class LocalLogins:
    """One-off passwords for a component's connections to this broker as a given user
    (RabbitMQ's direct connections for `amqp://`): accepted from loopback only, for the
    user they were made for, while this process runs."""

    def __init__(self) -> None:
        self._secrets: dict[str, str] = {}

    def password_for(self, user: str) -> str:
        return self._secrets.setdefault(user, "ackmq-local-" + secrets.token_urlsafe(32))

    def accepts(self, user: str, password: str) -> bool:
        known = self._secrets.get(user)
        return known is not None and secrets.compare_digest(known, password)


LOCAL_LOGINS = LocalLogins()  # one per process: the secrets never leave it


@dataclass
class LocalBroker:
    """This broker as a component reaches it: `amqp_url(user, vhost)`."""

    host: str = "127.0.0.1"
    port: int = 0
    node: str = "ackmq@localhost"
    logins: LocalLogins = field(default_factory=lambda: LOCAL_LOGINS)
    access: Any = None  # the AccessModel: who runs a parameter imported without a user

    def amqp_url(self, user: str, vhost: str) -> str:
        """`user` "" (a parameter from a definitions file or ctl): an administrator."""
        from urllib.parse import quote
        if not user and self.access is not None:
            admins = sorted(u.name for u in self.access.users.values()
                            if "administrator" in u.tags)
            user = admins[0] if admins else ""
        password = self.logins.password_for(user)
        return (f"amqp://{quote(user, safe='')}:{quote(password, safe='')}@"
                f"{self.host}:{self.port}/{quote(vhost, safe='')}")


class Parameters:
    """The registry: components by name, values by (component, vhost, name)."""

    def __init__(self) -> None:
        self.components: dict[str, Component] = {}
        self.local = LocalBroker()
        self._values: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._globals: dict[str, Any] = {}  # global parameters: name -> JSON value
        self._file: Any = None
        self._running = False

    def register(self, component: Component) -> None:
        self.components[component.name] = component

    # -- durability ---------------------------------------------------------------------
    def attach(self, data_dir: Path | None) -> None:
        """At start: the saved parameters (they run once `start` is called)."""
        if data_dir is None:
            return
        from ackmq.store.parameterfile import ParameterFile
        self._file = ParameterFile(data_dir)
        saved = self._file.load() or {}
        for p in saved.get("parameters", []):
            key = (str(p["component"]), str(p["vhost"]), str(p["name"]))
            self._values[key] = {"value": p["value"], "user": p.get("user", "")}
        for g in saved.get("global_parameters", []):
            self._globals[str(g["name"])] = g["value"]

    def _save(self) -> None:
        """Written and synced before the change is answered (changes are rare)."""
        if self._file is not None:
            self._file.save({"parameters": [
                {"component": c, "vhost": v, "name": n, **entry}
                for (c, v, n), entry in sorted(self._values.items())],
                "global_parameters": [{"name": n, "value": v}
                                      for n, v in sorted(self._globals.items())]})

    # -- life cycle ---------------------------------------------------------------------
    def start(self, host: str, port: int, node: str, access: Any = None) -> None:
        """The broker listens: run every saved parameter of a registered component."""
        self.local.host, self.local.port, self.local.node = host or "127.0.0.1", port, node
        self.local.access = access
        self._running = True
        for (c, v, n), entry in list(self._values.items()):
            comp = self.components.get(c)
            if comp is not None:
                try:
                    comp.set(v, n, entry["value"], entry["user"])
                except Exception:  # one bad saved parameter must not stop the broker
                    log.exception("parameter %s %r in vhost %r did not start", c, n, v)

    async def stop(self) -> None:
        self._running = False
        for comp in self.components.values():
            await comp.stop()

    # -- operations -----------------------------------------------------------------------
    def component(self, name: str) -> Component:
        comp = self.components.get(name)
        if comp is None:
            raise ParameterError([f"component {name} not found"])
        return comp

    def set(self, component: str, vhost: str, name: str, value: Any, user: str) -> bool:
        """Validate, save, run; True when new."""
        comp = self.component(component)
        comp.validate(vhost, name, value, user)
        key = (component, vhost, name)
        new = key not in self._values
        self._values[key] = {"value": value, "user": user}
        self._save()
        if self._running:
            comp.set(vhost, name, value, user)
        return new

    def clear(self, component: str, vhost: str, name: str) -> bool:
        """False when there is no such parameter."""
        if self._values.pop((component, vhost, name), None) is None:
            return False
        self._save()
        comp = self.components.get(component)
        if comp is not None and self._running:
            comp.clear(vhost, name)
        return True

    def get(self, component: str, vhost: str, name: str) -> dict[str, Any] | None:
        entry = self._values.get((component, vhost, name))
        if entry is None:
            return None
        return {"value": entry["value"], "vhost": vhost, "component": component,
                "name": name}

    def listing(self, component: str | None = None, vhost: str | None = None
                ) -> list[dict[str, Any]]:
        """RabbitMQ's parameter objects (`value`, `vhost`, `component`, `name`)."""
        return [{"value": e["value"], "vhost": v, "component": c, "name": n}
                for (c, v, n), e in sorted(self._values.items())
                if (component is None or c == component) and (vhost is None or v == vhost)]

    def vhost_deleted(self, vhost: str) -> None:
        """A vhost went: its parameters go with it (as RabbitMQ's)."""
        for c, v, n in [k for k in self._values if k[1] == vhost]:
            self.clear(c, v, n)

    # -- global parameters (RabbitMQ's `rabbit_runtime_parameters:*_global`) ---------------
    def set_global(self, name: str, value: Any) -> bool:
        """Any JSON value, saved; True when new (RabbitMQ validates none of them)."""
        new = name not in self._globals
        self._globals[name] = value
        self._save()
        return new

    def clear_global(self, name: str) -> bool:
        """False when there is no such parameter."""
        if name not in self._globals:
            return False
        del self._globals[name]
        self._save()
        return True

    def global_value(self, name: str) -> Any:
        """The value, or None when it is not set."""
        return self._globals.get(name)

    def global_listing(self) -> list[dict[str, Any]]:
        """RabbitMQ's global parameter objects (`name`, `value`), by name."""
        return [{"name": n, "value": v} for n, v in sorted(self._globals.items())]
