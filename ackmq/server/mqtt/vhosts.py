"""Which vhost an MQTT connection opens (N1), as RabbitMQ's MQTT plugin picks it
(`rabbit_mqtt_processor:get_vhost`), from two global runtime parameters
(server/parameters.py), read at each CONNECT:

- `mqtt_default_vhosts`: a client certificate's subject DN -> vhost, consulted for a TLS
  connection with a verified client certificate, however it logs in (RabbitMQ's reader
  takes the certificate's name whenever there is one; `--mqtt-ssl-cert-login` only
  decides whether it may log in by it);
- `mqtt_port_to_vhost_mapping`: the port the client connected to (the listener's: TCP,
  TLS, WebSocket, secure WebSocket) -> vhost.

RabbitMQ's order: with a certificate, the certificate's mapping, then the port's, then a
`vhost:user` user name, then the default vhost `/`; without one, the `vhost:user` name
wins over the port's mapping. docs/mqtt.md ("Which vhost")."""

from __future__ import annotations

from typing import Any

PORT_TO_VHOST = "mqtt_port_to_vhost_mapping"
CERT_TO_VHOST = "mqtt_default_vhosts"
DEFAULT_VHOST = "/"


def split_user(username: str) -> tuple[str | None, str]:
    """RabbitMQ's `vhost:user`, split at the last colon (a vhost may hold colons, a user
    name may not); (None, name) without a colon."""
    vhost, colon, user = username.rpartition(":")
    return (vhost, user) if colon else (None, username)


def _mapped(mapping: Any, key: str | None) -> str | None:
    """A mapping's vhost for `key`; a value that is no JSON object of strings maps
    nothing (RabbitMQ does not check these parameters when they are set)."""
    if key is None or not isinstance(mapping, dict):
        return None
    got = mapping.get(key)
    return got if isinstance(got, str) else None


def choose_vhost(params: Any, username: str | None, port: int | None,
                 cert_names: tuple[str, ...] = ()) -> tuple[str, str]:
    """(vhost, user name) for a CONNECT. `params`: the parameter registry (None: no
    mappings); `cert_names`: the verified certificate's subject DN and then its CN
    (empty: no verified certificate), the keys `mqtt_default_vhosts` is looked up by."""
    in_name, user = split_user(username) if username is not None else (None, "")
    by_port = by_cert = None
    if params is not None:
        by_port = _mapped(params.global_value(PORT_TO_VHOST),
                          None if port is None else str(port))
        if cert_names:
            certs = params.global_value(CERT_TO_VHOST)
            by_cert = next((v for n in cert_names if (v := _mapped(certs, n)) is not None),
                           None)
    order = (by_cert, by_port, in_name) if cert_names else (in_name, by_port)
    return next((v for v in order if v is not None), DEFAULT_VHOST), user
