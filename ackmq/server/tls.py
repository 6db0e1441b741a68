"""TLS for a listener (SPEC U4): the server context RabbitMQ's `ssl_options` describe —
certificate and key, a CA to verify clients against, `verify_peer` (ask for a client
certificate) and `fail_if_no_peer_cert` (refuse a client without one)."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any


class TLSConfigError(ValueError):
    """A TLS option that cannot work: the message says which and how to fix it."""


def server_context(cert: Path | None, key: Path | None, ca: Path | None = None,
                   verify_peer: bool = False, fail_if_no_peer_cert: bool = False,
                   listener: str = "--tls-port") -> ssl.SSLContext:
    """One context for every TLS listener (AMQPS, STOMP over TLS): RabbitMQ's STOMP
    plugin takes the same `ssl_options` as its AMQPS listener. `listener` names the
    option(s) that asked for TLS, for the error text."""
    if cert is None or key is None:
        raise TLSConfigError(f"{listener} needs --tls-cert FILE and --tls-key FILE "
                             "(PEM certificate chain and its private key)")
    if (verify_peer or fail_if_no_peer_cert) and ca is None:
        raise TLSConfigError("--tls-verify-peer / --tls-fail-if-no-peer-cert need "
                             "--tls-ca FILE (the CA that signs client certificates)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as e:
        raise TLSConfigError(f"cannot load --tls-cert {cert} / --tls-key {key}: {e}") from e
    if ca is not None:
        try:
            ctx.load_verify_locations(str(ca))
        except (OSError, ssl.SSLError) as e:
            raise TLSConfigError(f"cannot load --tls-ca {ca}: {e}") from e
    if fail_if_no_peer_cert:
        ctx.verify_mode = ssl.CERT_REQUIRED
    elif verify_peer:
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def certificate_user(peercert: dict[str, Any] | None) -> str | None:
    """The EXTERNAL mechanism's user: the verified client certificate's subject CN (as
    RabbitMQ's rabbitmq_auth_mechanism_ssl with its default `ssl_cert_login_from`)."""
    for rdn in (peercert or {}).get("subject", ()):
        for name, value in rdn:
            if name == "commonName":
                return str(value)
    return None


# RFC 4514's short names for the attributes Python's `getpeercert()` spells out
_RFC4514_NAMES = {"commonName": "CN", "localityName": "L", "stateOrProvinceName": "ST",
                  "organizationName": "O", "organizationalUnitName": "OU",
                  "countryName": "C", "streetAddress": "STREET", "domainComponent": "DC",
                  "userId": "UID"}


def _rfc4514_value(value: str) -> str:
    out = "".join("\\" + ch if ch in ',+"\\<>;' else ch for ch in value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def certificate_subject(peercert: dict[str, Any] | None) -> str | None:
    """The verified client certificate's subject Distinguished Name as RabbitMQ writes
    it (`rabbit_ssl:peer_cert_subject`, RFC 4514: the last RDN first, `O=client,CN=guest`
    for a subject /CN=guest/O=client): the key of RabbitMQ's `mqtt_default_vhosts`."""
    rdns = (peercert or {}).get("subject", ())
    if not rdns:
        return None
    return ",".join("+".join(f"{_RFC4514_NAMES.get(n, n)}={_rfc4514_value(str(v))}"
                             for n, v in rdn) for rdn in reversed(rdns))
