"""Broker settings: the one place their defaults are written, for `ackmq serve` (its
options take their defaults from here), the embedded API and the server."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ackmq.broker.readylist import QUEUE_HOT_MESSAGES, QUEUE_MEMORY_MB
from ackmq.broker.scheduled import MAX_REPEAT, MIN_PERIOD_MS


@dataclass
class Config:
    host: str = "127.0.0.1"
    port: int = 5672
    stomp_port: int | None = 61613  # None: no STOMP listener; 0: a free port
    # RabbitMQ's stream protocol (X1, docs/stream-protocol.md); None: none; 0: a free port
    stream_port: int | None = 5552
    # the stream protocol over TLS (RabbitMQ's stream.listeners.ssl, usually 5551); None: none
    stream_tls_port: int | None = None
    # MQTT 3.1/3.1.1/5.0 (N1): None: no listener; 0: a free port. A CONNECT without a user
    # name logs in as mqtt_anonymous_user (None: refused, "not authorized")
    mqtt_port: int | None = 1883
    mqtt_anonymous_user: str | None = None
    # MQTT over TLS (N1), with the tls_* certificate options; off unless asked, as
    # RabbitMQ's mqtt.listeners.ssl (its usual port is 8883); 0: a free port
    mqtt_tls_port: int | None = None
    # RabbitMQ's mqtt.ssl_cert_login: a CONNECT over TLS without user name and password
    # logs in as the verified client certificate's CN (U4)
    mqtt_ssl_cert_login: bool = False
    # MQTT over WebSocket at /ws (RabbitMQ's web_mqtt, usually 15675); off unless asked
    mqtt_ws_port: int | None = None
    # the same over TLS (wss://, RabbitMQ's web_mqtt.ssl.port, usually 15676), with the
    # tls_* certificate options; off unless asked; 0: a free port
    mqtt_wss_port: int | None = None
    # the largest packet a client may send (5.0: told in CONNACK); 0: max_message_size
    # plus 64 KiB for the topic and properties
    mqtt_max_packet_size: int = 0
    # the longest Keep Alive (s) an MQTT 5 client may use: a longer one, or 0 (none), is
    # replaced by this, told in CONNACK as Server Keep Alive ([MQTT-3.2.2-21]); 0: the
    # client's (Mosquitto's max_keepalive)
    mqtt_max_keep_alive: int = 0

    def mqtt_packet_limit(self) -> int:
        return self.mqtt_max_packet_size or self.max_message_size + 65536
    # AMQP 1.0 on the AMQP port(s) beside 0-9-1, picked by the protocol header (SPEC A1);
    # False: the 0-9-1 listener alone, as before. ANONYMOUS logs in as this user (None:
    # ANONYMOUS is not offered), as RabbitMQ 4's anonymous_login_user
    amqp10: bool = True
    amqp10_anonymous_user: str | None = None
    # announce product "RabbitMQ" 4.0.0 (+ackmq.<version>) in the 1.0 open, for clients that
    # refuse any other server (rabbitmq-amqp-python-client); off: ackmq says who it is
    # the 1.0 open says product "RabbitMQ" 4.0.0+ackmq.<v>: rabbitmq-amqp-python-client
    # (RabbitMQ 4's own Python client) refuses any other server (docs/amqp10.md)
    amqp10_rabbitmq_compat: bool = True
    data_dir: Path | None = Path("./ackmq-data")  # None: nothing on disk (transient broker)
    fsync: bool = True
    heartbeat: int = 60
    consumer_timeout_ms: int | None = None
    # L7, as RabbitMQ 4.3's: notify_consumer (basic.cancel to a client that takes it, the
    # channel closed for others) or close_channel (always, RabbitMQ 3.x)
    consumer_timeout_response: str = "notify_consumer"
    max_message_size: int = 128 * 1024 * 1024
    # ActiveMQ-style scheduled SENDs (L5): at most this many repeats, this far apart at least
    scheduled_max_repeat: int = MAX_REPEAT
    scheduled_min_period_ms: int = MIN_PERIOD_MS
    handshake_timeout: float = 10.0
    spill: bool = True  # deep queues keep their tails on disk (bounded memory)
    queue_hot_messages: int = QUEUE_HOT_MESSAGES  # ready messages a queue keeps in memory
    queue_memory_mb: int = QUEUE_MEMORY_MB  # ready messages in memory, all queues; then spill
    # first start only (no access.json in the data dir yet), as RabbitMQ's default_user:
    # these users become administrators with full permissions on vhost "/"
    users: dict[str, str] = field(default_factory=lambda: {"guest": "guest"})
    default_user: str | None = None  # --default-user: replaces guest in `users`
    default_pass: str | None = None
    loopback_users: tuple[str, ...] = ("guest",)
    admin_socket: bool = True  # `ackmq ctl` talks to <data dir>/ctl.sock
    # AMQPS (U4): a second listener with TLS; None: none, 0: a free port
    tls_port: int | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    tls_verify_peer: bool = False
    tls_fail_if_no_peer_cert: bool = False
    # STOMP over TLS (U4), with the tls_* certificate options above; off unless asked, as
    # RabbitMQ's stomp.listeners.ssl (its usual port is 61614); 0: a free port
    stomp_tls_port: int | None = None
    # RabbitMQ's stomp.ssl_cert_login: a CONNECT without `login` over TLS with a verified
    # client certificate logs in as the certificate's CN (the user must exist)
    stomp_ssl_cert_login: bool = False
    # resource alarms (U5), RabbitMQ's defaults: a fraction of RAM or an amount ("2GiB");
    # free space of the data dir's filesystem ("50MB", or "mem_relative:1.5" x RAM)
    memory_high_watermark: str = "0.4"
    disk_free_limit: str = "50MB"
    memory_check_interval: float = 0.1  # s between RSS samples (a timer, never per message)
    disk_check_interval: float = 1.0
    # the management HTTP API (M1, server/http/): None: no listener, 0: a free port;
    # HTTPS with the tls_* certificate options, off unless asked
    http_port: int | None = 15672
    https_port: int | None = None
    # /metrics alone, no login, on its own port as RabbitMQ's prometheus plugin (15692);
    # off unless asked (/metrics is on the management listener too); 0: a free port
    prometheus_port: int | None = None
    # a definitions file imported at every start (RabbitMQ's load_definitions)
    load_definitions: Path | None = None

    def seed_users(self) -> dict[str, str]:
        if self.default_user:
            return {self.default_user: self.default_pass or ""}
        return dict(self.users)
