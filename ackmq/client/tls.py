"""TLS for `amqps://` URLs, with the query parameters of RabbitMQ's URI spec (the Erlang
client's and the shovel's): `cacertfile`, `certfile`, `keyfile`, `verify`
(`verify_peer` | `verify_none`) and `server_name_indication` (a host name, or `disable`).

Unlike the Erlang client of OTP < 26, the default is `verify_peer` (against `cacertfile`,
else the system's CAs, checking the host name): a Python client that silently trusts any
certificate would be a trap. One place for both ackmq.client connections (sync and
asyncio) and the shovel's AMQP 1.0 peer."""

from __future__ import annotations

import ssl
from dataclasses import dataclass

VERIFY_MODES = ("verify_peer", "verify_none")
TLS_KEYS = ("cacertfile", "certfile", "keyfile", "verify", "server_name_indication")


@dataclass(frozen=True)
class TlsOptions:
    cacertfile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    verify: str = "verify_peer"
    server_name_indication: str | None = None  # None: the URL's host; "disable": none

    def __post_init__(self) -> None:
        if self.verify not in VERIFY_MODES:
            raise ValueError(f"verify must be verify_peer or verify_none, not {self.verify!r}")
        if self.keyfile is not None and self.certfile is None:
            raise ValueError("keyfile needs certfile")

    def server_hostname(self, host: str) -> str | None:
        """The name sent as SNI (and checked against the certificate when verifying)."""
        sni = self.server_name_indication
        if sni == "disable":
            return None
        return sni or host

    def context(self) -> ssl.SSLContext:
        """An SSLContext for these options (files are read now: a missing one raises
        OSError / ssl.SSLError here, before any connection)."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.cacertfile)
        if self.verify == "verify_none":
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.server_name_indication == "disable":
            ctx.check_hostname = False  # no name to check; the chain still is
        if self.certfile is not None:
            ctx.load_cert_chain(self.certfile, self.keyfile)
        return ctx


def tls_options(query: list[tuple[str, str]]) -> TlsOptions:
    """The TLS keys of a URL's query (others are ignored here)."""
    values = {k: v for k, v in query if k in TLS_KEYS}
    return TlsOptions(**values)
