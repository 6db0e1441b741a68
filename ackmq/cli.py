"""The `ackmq` command: serve, ctl, bench, pipeline, demo."""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ackmq.server.config import Config


def _env_port(p: argparse.ArgumentParser, flag: str, env: str, default: int | None,
              what: str) -> None:
    """A listener's port whose default the environment may override (how the tests give
    every broker free ports without naming each option)."""
    p.add_argument(flag, type=int, default=int(os.environ.get(env) or default or 0),
                   help=f"{what}: default {default}, or env {env}; 0 picks a free one")


def _listener(p: argparse.ArgumentParser, name: str, label: str, env: str,
              port: int | None, port_help: str, tls_flag: str, tls_port: int | None,
              tls_help: str) -> None:
    """A protocol's listener options: its port (_env_port), `--no-<name>`, and its TLS
    port, which is off unless given and uses the --tls-* certificate options."""
    _env_port(p, f"--{name}-port", env, port, port_help)
    p.add_argument(f"--no-{name}", action="store_true", help=f"no {label} listener")
    p.add_argument(tls_flag, type=int, default=tls_port,
                   help=f"{tls_help} (off unless given; 0 picks a free one); uses the "
                        "--tls-cert/--tls-key/--tls-ca options")


def _serve_args(p: argparse.ArgumentParser) -> None:
    D = Config()  # noqa: N806 - the defaults, written once in server/config.py
    p.add_argument("--host", default=D.host, help="address to listen on (default loopback)")
    p.add_argument("--port", type=int, default=D.port, help="AMQP port; 0 picks a free one")
    p.add_argument("--stomp-port", type=int, default=D.stomp_port,
                   help=f"STOMP port (default {D.stomp_port}); 0 picks a free one")
    p.add_argument("--no-stomp", action="store_true", help="no STOMP listener")
    _listener(p, "stream", "stream protocol", "ACKMQ_STREAM_PORT", D.stream_port,
              "RabbitMQ's stream protocol port (docs/stream-protocol.md)",
              "--stream-tls-port", D.stream_tls_port,
              "the stream protocol over TLS (RabbitMQ's stream.listeners.ssl, usually 5551)")
    _listener(p, "mqtt", "MQTT", "ACKMQ_MQTT_PORT", D.mqtt_port,
              "MQTT 3.1/3.1.1/5.0 port (docs/mqtt.md)", "--mqtt-tls-port", D.mqtt_tls_port,
              "MQTT over TLS port (RabbitMQ's mqtt.listeners.ssl, usually 8883)")
    p.add_argument("--mqtt-ws-port", type=int, default=D.mqtt_ws_port,
                   help="MQTT over WebSocket at /ws on this port (off unless given, as "
                        "RabbitMQ's web_mqtt, usually 15675; 0 picks a free one)")
    p.add_argument("--mqtt-wss-port", type=int, default=D.mqtt_wss_port,
                   help="MQTT over secure WebSocket (wss://) at /ws on this port, with the "
                        "--tls-* options (off unless given, as RabbitMQ's web_mqtt.ssl.port, "
                        "usually 15676; 0 picks a free one)")
    p.add_argument("--mqtt-max-keep-alive", type=int, default=D.mqtt_max_keep_alive,
                   metavar="SECONDS",
                   help="an MQTT 5 client's Keep Alive longer than this, or 0, is replaced by "
                        "it, told in CONNACK as Server Keep Alive (default 0: the client's)")
    p.add_argument("--mqtt-ssl-cert-login", action="store_true",
                   help="an MQTT CONNECT over TLS without user name and password logs in "
                        "as the verified client certificate's CN (RabbitMQ's "
                        "mqtt.ssl_cert_login)")
    p.add_argument("--mqtt-anonymous-user", default=D.mqtt_anonymous_user,
                   help="an MQTT CONNECT without a user name logs in as this user "
                        "(default: refused, as 'not authorized')")
    p.add_argument("--no-amqp10", action="store_true",
                   help="AMQP 0-9-1 only on the AMQP port(s): no AMQP 1.0 (docs/amqp10.md)")
    p.add_argument("--amqp10-anonymous-user", default=D.amqp10_anonymous_user,
                   help="offer SASL ANONYMOUS to AMQP 1.0 clients, logged in as this user "
                        "(RabbitMQ 4's anonymous_login_user; default: not offered)")
    p.add_argument("--amqp10-rabbitmq-compat", action=argparse.BooleanOptionalAction,
                   default=D.amqp10_rabbitmq_compat,
                   help="announce product RabbitMQ 4.0.0+ackmq.<version> to AMQP 1.0 clients "
                        "(rabbitmq-amqp-python-client refuses any other server; default on; "
                        "--no-amqp10-rabbitmq-compat: product ackmq)")
    p.add_argument("--data-dir", default=D.data_dir, type=Path,
                   help="where durable queues and persistent messages live")
    p.add_argument("--no-fsync", action="store_true",
                   help="do not fsync before confirming (tests and throwaway data only)")
    p.add_argument("--no-persistence", action="store_true",
                   help="keep nothing on disk: every queue is transient")
    p.add_argument("--heartbeat", type=int, default=D.heartbeat, help="heartbeat proposed in tune (s)")
    p.add_argument("--consumer-timeout-ms", type=int, default=D.consumer_timeout_ms,
                   help="a delivery unacked this long cancels its consumer or closes its "
                        "channel (H2, L7)")
    p.add_argument("--consumer-timeout-response", default=D.consumer_timeout_response,
                   choices=("notify_consumer", "close_channel"),
                   help="notify_consumer: basic.cancel to clients with "
                        "consumer_cancel_notify (STOMP: an ERROR for the subscription), "
                        "channel closed for others; close_channel: always close (L7)")
    p.add_argument("--max-message-size", type=int, default=D.max_message_size,
                   help="larger messages are refused with 406 (default 128 MiB)")
    p.add_argument("--scheduled-max-repeat", type=int, default=D.scheduled_max_repeat,
                   help="a STOMP SEND asking for more AMQ_SCHEDULED_REPEAT repeats is "
                        f"refused (default {D.scheduled_max_repeat})")
    p.add_argument("--scheduled-min-period-ms", type=int, default=D.scheduled_min_period_ms,
                   help="a repeated STOMP SEND with a shorter AMQ_SCHEDULED_PERIOD is "
                        f"refused (default {D.scheduled_min_period_ms} ms)")
    p.add_argument("--queue-hot-messages", type=int, default=D.queue_hot_messages,
                   help="ready messages a queue keeps in memory at most; the rest wait in "
                        "spill files in the data dir (bounded memory at any queue depth)")
    p.add_argument("--queue-memory-mb", type=int, default=D.queue_memory_mb,
                   help="memory for ready messages of all queues together (default "
                        f"{D.queue_memory_mb}); "
                        "past it, queues keep 512 each and spill the rest")
    p.add_argument("--default-user", default=os.environ.get("ACKMQ_DEFAULT_USER"),
                   help="first start only (no users saved in the data dir yet): create this "
                        "administrator with full permissions on vhost / instead of guest "
                        "(RabbitMQ's default_user; env ACKMQ_DEFAULT_USER)")
    p.add_argument("--default-pass", default=os.environ.get("ACKMQ_DEFAULT_PASS"),
                   help="its password (env ACKMQ_DEFAULT_PASS)")
    p.add_argument("--tls-port", type=int, default=D.tls_port,
                   help="AMQPS port (TLS; RabbitMQ's is 5671; 0 picks a free one); needs "
                        "--tls-cert and --tls-key")
    p.add_argument("--tls-cert", type=Path, help="PEM certificate chain of the TLS listener")
    p.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    p.add_argument("--tls-ca", type=Path,
                   help="PEM CA certificates client certificates are verified against")
    p.add_argument("--tls-verify-peer", action="store_true",
                   help="ask clients for a certificate (verified against --tls-ca); one "
                        "that presents it may log in with the EXTERNAL mechanism (its CN)")
    p.add_argument("--tls-fail-if-no-peer-cert", action="store_true",
                   help="refuse TLS clients without a valid certificate")
    p.add_argument("--handshake-timeout", type=float, default=D.handshake_timeout,
                   help="seconds a connection may take to finish opening before it is "
                        f"dropped (RabbitMQ's handshake_timeout; default {D.handshake_timeout:g})")
    p.add_argument("--stomp-tls-port", type=int, default=D.stomp_tls_port,
                   help="STOMP over TLS port (off unless given, as RabbitMQ's "
                        "stomp.listeners.ssl, whose usual port is 61614; 0 picks a free "
                        "one); uses the --tls-cert/--tls-key/--tls-ca/--tls-verify-peer "
                        "options")
    p.add_argument("--stomp-ssl-cert-login", action="store_true",
                   help="a STOMP CONNECT over TLS without a login header logs in as the "
                        "verified client certificate's CN (RabbitMQ's stomp.ssl_cert_login)")
    p.add_argument("--memory-high-watermark", default=D.memory_high_watermark,
                   help="block publishers while the broker's memory (RSS) is above this: a "
                        "fraction of RAM (default %(default)s, as RabbitMQ's "
                        "vm_memory_high_watermark) or an amount (2GiB, 512MB); queues page "
                        "to disk past half of it")
    p.add_argument("--disk-free-limit", default=D.disk_free_limit,
                   help="block publishers while the data dir's filesystem has less free "
                        "space than this (default %(default)s, as RabbitMQ; 1GiB, or "
                        "mem_relative:1.5 for 1.5 x RAM)")
    _listener(p, "http", "management HTTP", "ACKMQ_HTTP_PORT", D.http_port,
              "management HTTP API port (RabbitMQ's)", "--https-port", D.https_port,
              "management API over TLS")
    p.add_argument("--prometheus-port", type=int, default=D.prometheus_port,
                   help="also serve /metrics (no login) on this port, as RabbitMQ's "
                        "prometheus plugin on 15692 (off unless given; /metrics is on the "
                        "management port anyway); needs the management listener")
    p.add_argument("--load-definitions", type=Path, default=None, metavar="FILE",
                   help="import a definitions file (RabbitMQ's export layout: policies, "
                        "queues, ...) at every start, as RabbitMQ's load_definitions")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--config", type=Path, metavar="FILE",
                   help="read options from FILE, in rabbitmq.conf style (key = value; "
                        "RabbitMQ's keys where they exist, ackmq.<option> for the rest: "
                        "docs/config.md); options given here override it")


def _with_config(parser: argparse.ArgumentParser, serve: argparse.ArgumentParser,
                 argv: list[str] | None, args: argparse.Namespace) -> argparse.Namespace:
    """The config file's values become the serve options' defaults; parsing the command
    line again lets its flags win. A bad file exits with 2, naming the line."""
    from ackmq.server.conffile import ConfigFileError, Option, load
    options = [Option(a.dest, a.type if callable(a.type) else str, a.nargs == 0)
               for a in serve._actions if a.dest not in ("help", "config")]
    try:
        values = load(args.config, options)
    except ConfigFileError as e:
        print(f"ackmq: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    serve.set_defaults(**values)
    return parser.parse_args(argv)


# The broker holds many long-lived container objects (every queued message is a Message
# and a QueueEntry), and its per-message garbage is not cyclic (refcounting frees it).
# At CPython's default pace (a young-generation pass every 700 allocations, each pass
# counting towards the full ones) the collector took 10-20% of the broker's CPU per
# message; a pass every 10,000 allocations still bounds cyclic garbage and keeps each
# pause to a fraction of a millisecond. Measured with `python -m tools.perf.cpu`
# (docs/performance.md): publish 7.3 -> 5.9 µs/msg, confirm 13.2 -> 11.2, fanout 10.8 -> 9.6.
GC_THRESHOLDS = (10_000, 10, 100)


def serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stdout)
    log = logging.getLogger("ackmq")
    for opt in ("port", "stomp_port", "stream_port", "stream_tls_port", "mqtt_port",
                "mqtt_tls_port", "mqtt_ws_port", "mqtt_wss_port", "tls_port",
                "stomp_tls_port", "http_port", "https_port", "prometheus_port"):
        port = getattr(args, opt)  # None: a listener that is off
        if port is not None and not 0 <= port <= 65535:
            print(f"ackmq: --{opt.replace('_', '-')} must be between 0 and 65535, got {port}",
                  file=sys.stderr)
            return 2
    if args.tls_port is None and args.stomp_tls_port is None and args.https_port is None \
            and args.stream_tls_port is None and args.mqtt_tls_port is None \
            and args.mqtt_wss_port is None and (
            args.tls_cert or args.tls_key or args.tls_ca or args.tls_verify_peer
            or args.tls_fail_if_no_peer_cert):
        print("ackmq: the --tls-* options need --tls-port (e.g. --tls-port 5671) and/or "
              "--stomp-tls-port (e.g. --stomp-tls-port 61614) or --https-port",
              file=sys.stderr)
        return 2
    if args.stomp_ssl_cert_login and args.stomp_tls_port is None:
        print("ackmq: --stomp-ssl-cert-login needs --stomp-tls-port (and --tls-ca "
              "--tls-verify-peer, so that clients present a certificate)", file=sys.stderr)
        return 2
    if not 0 <= args.mqtt_max_keep_alive <= 65535:
        print("ackmq: --mqtt-max-keep-alive must be between 0 and 65535 seconds, got "
              f"{args.mqtt_max_keep_alive}", file=sys.stderr)
        return 2
    if args.mqtt_ssl_cert_login and args.mqtt_tls_port is None and args.mqtt_wss_port is None:
        print("ackmq: --mqtt-ssl-cert-login needs --mqtt-tls-port or --mqtt-wss-port (and "
              "--tls-ca --tls-verify-peer, so that clients present a certificate)",
              file=sys.stderr)
        return 2
    if not 0 < args.handshake_timeout <= 3600:
        print("ackmq: --handshake-timeout must be between 0 and 3600 seconds, got "
              f"{args.handshake_timeout:g}", file=sys.stderr)
        return 2
    if bool(args.default_user) != bool(args.default_pass):
        print("ackmq: --default-user and --default-pass (or ACKMQ_DEFAULT_USER and "
              "ACKMQ_DEFAULT_PASS) go together, and neither may be empty", file=sys.stderr)
        return 2
    from ackmq.server.alarms import parse_disk_limit, parse_watermark
    try:
        parse_watermark(args.memory_high_watermark)
        parse_disk_limit(args.disk_free_limit)
    except ValueError as e:
        print(f"ackmq: --memory-high-watermark / --disk-free-limit: {e}", file=sys.stderr)
        return 2
    cfg = Config(host=args.host, port=args.port,
                 stomp_port=None if args.no_stomp else args.stomp_port,
                 stream_port=None if args.no_stream else args.stream_port,
                 stream_tls_port=args.stream_tls_port,
                 mqtt_port=None if args.no_mqtt else args.mqtt_port,
                 mqtt_anonymous_user=args.mqtt_anonymous_user,
                 mqtt_tls_port=args.mqtt_tls_port,
                 mqtt_ssl_cert_login=args.mqtt_ssl_cert_login,
                 mqtt_max_keep_alive=args.mqtt_max_keep_alive,
                 mqtt_ws_port=None if args.no_mqtt else args.mqtt_ws_port,
                 mqtt_wss_port=None if args.no_mqtt else args.mqtt_wss_port,
                 amqp10=not args.no_amqp10, amqp10_anonymous_user=args.amqp10_anonymous_user,
                 amqp10_rabbitmq_compat=args.amqp10_rabbitmq_compat,
                 data_dir=None if args.no_persistence else args.data_dir,
                 fsync=not args.no_fsync, heartbeat=args.heartbeat,
                 consumer_timeout_ms=args.consumer_timeout_ms,
                 consumer_timeout_response=args.consumer_timeout_response,
                 max_message_size=args.max_message_size,
                 scheduled_max_repeat=max(0, args.scheduled_max_repeat),
                 scheduled_min_period_ms=max(0, args.scheduled_min_period_ms),
                 handshake_timeout=args.handshake_timeout,
                 queue_hot_messages=max(1, args.queue_hot_messages),
                 queue_memory_mb=max(0, args.queue_memory_mb),
                 default_user=args.default_user or None,
                 default_pass=args.default_pass or None,
                 tls_port=args.tls_port, tls_cert=args.tls_cert, tls_key=args.tls_key,
                 tls_ca=args.tls_ca, tls_verify_peer=args.tls_verify_peer,
                 tls_fail_if_no_peer_cert=args.tls_fail_if_no_peer_cert,
                 stomp_tls_port=args.stomp_tls_port,
                 stomp_ssl_cert_login=args.stomp_ssl_cert_login,
                 memory_high_watermark=args.memory_high_watermark,
                 disk_free_limit=args.disk_free_limit,
                 http_port=None if args.no_http else args.http_port,
                 https_port=args.https_port,
                 prometheus_port=None if args.no_http else args.prometheus_port,
                 load_definitions=args.load_definitions)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    gc.set_threshold(*GC_THRESHOLDS)

    async def run() -> int:
        from ackmq.broker.storage import CorruptStore, StoreError
        from ackmq.server import Server
        from ackmq.server.tls import TLSConfigError
        server = Server(cfg)
        from ackmq.shovel.component import ShovelComponent  # dynamic shovels (V1)
        server.parameters.register(ShovelComponent(server.parameters))
        try:
            url = await server.start()
        except CorruptStore as e:
            log.error("the data directory %s is damaged: %s", cfg.data_dir, e)
            return 3
        except StoreError as e:
            log.error("cannot open the data directory %s: %s", cfg.data_dir, e)
            return 3
        except TLSConfigError as e:
            log.error("TLS: %s", e)
            return 2
        except OSError as e:
            where = getattr(e, "listener", f"{cfg.host}:{cfg.port}")
            log.error("cannot listen on %s: %s", where, e.strerror or e)
            return 2
        where = "no persistence" if cfg.data_dir is None else f"data dir {cfg.data_dir}"
        if server.all_interfaces:
            bound = server.bound + [f"{b} (STOMP)" for b in server.stomp_bound]
            bound += [f"{b} (stream)" for b in server.stream_bound]
            bound += [f"{b} (MQTT)" for b in server.mqtt_bound]
            bound += [f"{b} (HTTP)" for b in (server.http.bound if server.http else [])]
            where = f"on all interfaces: {', '.join(bound)}; {where}"
        http = server.http
        urls = " and ".join(u for u in (url, server.stomp_url, server.stream_url,
                                         server.stream_tls_url, server.tls_url,
                                         server.stomp_tls_url, server.mqtt_url,
                                         server.mqtt_tls_url, server.mqtt_ws_url,
                                         server.mqtt_wss_url,
                                         http and http.url,
                                         http and http.https_url) if u)
        log.info("ackmq listening on %s (%s, fsync %s)", urls, where,
                 "on" if cfg.fsync else "OFF")
        if server.all_interfaces and "guest" in cfg.loopback_users:
            log.warning("user 'guest' can only connect via localhost (as RabbitMQ's): "
                        "other hosts are refused with 403 ACCESS_REFUSED")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("shutting down")
        await server.stop()
        log.info("stopped")
        return 0

    return asyncio.run(run())


@dataclass(frozen=True)
class Subcommand:
    """A subcommand whose module (and its dependencies) loads only when it runs, so that
    `ackmq serve` loads the broker and nothing else (no bench, Spark, pika, psutil)."""

    help: str
    module: str
    add_arguments: str  # function(parser) in `module`
    run: str  # function(args) -> exit code in `module`
    extra: str  # the pyproject extra that installs its dependencies


SUBCOMMANDS = {
    "bench": Subcommand("benchmarks, side by side with RabbitMQ", "ackmq.bench.cli",
                        "add_arguments", "run", "bench"),
    "pipeline": Subcommand("land queues into Parquet / publish tables (PySpark)",
                           "ackmq.spark.cli", "add_pipeline_arguments", "run_pipeline",
                           "spark"),
    "demo": Subcommand("the whole story, embedded", "ackmq.spark.cli", "add_demo_arguments",
                       "run_demo", "spark"),
}


def _load(name: str) -> ModuleType | str:
    """The subcommand's module, or what to tell the user when a dependency is missing."""
    cmd = SUBCOMMANDS[name]
    try:
        return importlib.import_module(cmd.module)
    except ImportError as e:
        missing = (getattr(e, "name", None) or str(e)).split(".")[0]
        return (f"ackmq {name}: the Python package {missing!r} is missing; install it with "
                f"pip install 'ackmq[{cmd.extra}]'")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = argparse.ArgumentParser(prog="ackmq", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_parser = sub.add_parser("serve", help="run the broker")
    _serve_args(serve_parser)
    loaded: ModuleType | None = None
    for name, cmd in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=cmd.help)
        if name == command:  # only the one asked for is loaded
            got = _load(name)
            if isinstance(got, str):
                print(got, file=sys.stderr)
                return 2
            loaded = got
            getattr(loaded, cmd.add_arguments)(p)
    from ackmq.ctl import command as ctl
    ctl.add_arguments(sub.add_parser("ctl", help=ctl.HELP, description=ctl.DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    if args.command == "serve" and args.config is not None:
        args = _with_config(parser, serve_parser, argv, args)
    if args.command == "serve":
        return serve(args)
    if args.command == "ctl":
        return ctl.run(args)
    assert loaded is not None
    return int(getattr(loaded, SUBCOMMANDS[args.command].run)(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
