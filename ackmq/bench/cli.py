"""`ackmq bench`: argument parsing and the A/B run loop."""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from ackmq.bench import report
from ackmq.bench.brokers import (
    BenchSetupError,
    Target,
    activemq,
    check_stomp_url,
    check_url,
    local_rabbitmq,
    mosquitto,
    probe,
    probe_mqtt_target,
    probe_stomp_target,
    rabbitmq_mqtt,
    rabbitmq_stomp,
    start_ackmq,
)
from ackmq.bench.context import DEFAULT_PREFETCH, DEFAULT_STOMP_PREFETCH, Options, RunContext
from ackmq.bench.progress import Progress
from ackmq.bench.stats import schedule
from ackmq.bench.workloads import AMQP_WORKLOADS, MQTT_WORKLOADS, STOMP_WORKLOADS, WORKLOADS


def _prefetch_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of ints: {text}") from exc
    if not values or any(v < 0 or v > 65535 for v in values):
        raise argparse.ArgumentTypeError("prefetch values must be 0..65535")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `ackmq bench` (also `python -m ackmq.bench`)."""
    parser.description = ("Benchmark any AMQP 0-9-1 broker; with a second one, run both "
                          "alternately (A B A B ...) and report medians and their ratio.")
    parser.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                        help="workloads to run (default: all AMQP ones, or with --stomp all "
                             "STOMP ones): " + ", ".join(WORKLOADS))
    parser.add_argument("--url", help="broker under test (A), e.g. amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--compare", metavar="URL", help="broker to compare against (B)")
    parser.add_argument("--ackmq", action="store_true",
                        help="start `python -m ackmq serve` as the broker under test")
    parser.add_argument("--rabbitmq", action="store_true",
                        help="compare against a local RabbitMQ on 127.0.0.1:5672 "
                             "(started if installed but not running)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs per workload and broker, alternating brokers (default 3)")
    parser.add_argument("--messages", type=int, help="message count for every workload "
                        "(overrides the defaults: 50,000 for confirms/tx, 1M for memory, ...)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply every default message count (e.g. 0.1 for a quick look)")
    parser.add_argument("--rate", type=float, default=5000.0,
                        help="latency: offered publish rate, msgs/s (default 5000)")
    parser.add_argument("--prefetch", type=_prefetch_list, default=DEFAULT_PREFETCH,
                        help="consume-prefetch sweep, comma-separated (default 1,10,100,300,1000,0)")
    parser.add_argument("--data-dir", type=Path,
                        help="data directory for --ackmq and the fdatasync floor "
                             "(default: a fresh directory under /var/tmp)")
    stomp = _family_options(
        parser, "STOMP", "STOMP 1.2 workloads against up to N brokers in one run "
        "(A B C A B C ...), ratios of A (the first) to each other one", STOMP_WORKLOADS,
        "a STOMP broker, stomp://user:pass@host:port/vhost",
        "add RabbitMQ's STOMP plugin on 127.0.0.1:61623",
        "add ActiveMQ Classic on 127.0.0.1:61613 (/work/shared/tools/activemq-local start)")
    stomp.add_argument("--stomp-prefetch", type=_prefetch_list, default=DEFAULT_STOMP_PREFETCH,
                       help="stomp-consume-ci sweep, comma-separated (default 1,100,1000)")
    _family_options(
        parser, "MQTT", "MQTT 3.1.1 workloads against up to N brokers in one run, as the "
        "STOMP ones", MQTT_WORKLOADS,
        "an MQTT broker, mqtt://[user:pass@]host:port",
        "add Mosquitto on 127.0.0.1:1884 (/work/shared/tools/mosquitto-local start)",
        "add RabbitMQ's MQTT plugin on 127.0.0.1:1883 (QoS 2 downgraded to 1 there)")
    parser.add_argument("--json", metavar="FILE", help="write every run and the summary as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="draw the prefetch sweep and latency")


def _label_uniquely(targets: list[Target]) -> None:
    """Two runs of the same product get -A, -B, ... (their position) after the label."""
    labels = [t.label for t in targets]
    for i, t in enumerate(targets):
        if labels.count(t.label) > 1:
            t.label += f"-{chr(ord('A') + i)}"


# The brokers each family of workloads takes, by option; one family's workloads refuse
# another's brokers before anything starts.
_FAMILIES: dict[str, tuple[str, ...]] = {
    "AMQP": ("--url", "--compare", "--rabbitmq"),
    "STOMP": ("--stomp-url", "--rabbitmq-stomp", "--activemq"),
    "MQTT": ("--mqtt-url", "--mosquitto", "--rabbitmq-mqtt"),
}


def _only_brokers_of(args: argparse.Namespace, family: str) -> None:
    for other, flags in _FAMILIES.items():
        given = [f for f in flags if getattr(args, f[2:].replace("-", "_"))]
        if other != family and given:
            if other == "AMQP":
                switch = f"run without --{family.lower()}"
            elif family == "AMQP":
                switch = f"add --{other.lower()}"
            else:
                switch = f"add --{other.lower()} (not --{family.lower()})"
            raise BenchSetupError(
                f"{given[0]} is for the {other} workloads: {switch}; the {family} workloads "
                f"take {family} brokers: {', '.join(_FAMILIES[family])}, --ackmq")


def _family_options(parser: argparse.ArgumentParser, family: str, description: str,
                    workloads: list[str], url_form: str,
                    *reference_help: str) -> argparse._ArgumentGroup:
    """A family's options: run its workloads, its brokers by URL, its reference brokers
    (the flags after the URL one in _FAMILIES, helped in that order); `url_form`: what a
    URL names and how it is written."""
    group = parser.add_argument_group(family, description)
    name = family.lower()
    url_flag, *references = _FAMILIES[family]
    group.add_argument(f"--{name}", action="store_true",
                       help=f"run the {family} workloads (" + ", ".join(workloads) + ")")
    group.add_argument(url_flag, metavar="URL", action="append", default=[],
                       help=f"{url_form}; repeatable; the first is A unless --ackmq")
    for flag, help_ in zip(references, reference_help, strict=True):
        group.add_argument(flag, action="store_true", help=help_)
    return group


def _open_targets(starts: list[Callable[[], Target]], first: Callable[[], Target] | None,
                  nothing: str) -> list[Target]:
    """Start each target in turn, closing those started when one fails; `first` (ackmq
    beside references) starts last, so a reference that is not running costs no ackmq
    start, and is listed first. None at all: `nothing to benchmark: give <nothing>`."""
    targets: list[Target] = []
    try:
        for start in starts:
            targets.append(start())
        if first is not None:
            targets.insert(0, first())
    except BaseException:
        for t in targets:
            t.close()
        raise
    if not targets:
        raise BenchSetupError(f"nothing to benchmark: give {nothing}")
    _label_uniquely(targets)
    return targets


def _stomp_targets(args: argparse.Namespace) -> list[Target]:
    _only_brokers_of(args, "STOMP")
    for url in args.stomp_url:  # before anything starts
        try:
            check_stomp_url(url)
        except BenchSetupError as exc:
            raise BenchSetupError(f"--stomp-url: {exc}") from None
    starts: list[Callable[[], Target]] = [partial(probe_stomp_target, u) for u in args.stomp_url]
    if args.rabbitmq_stomp:
        starts.append(rabbitmq_stomp)
    if args.activemq:
        starts.append(activemq)
    first = partial(start_ackmq, args.data_dir, stomp=True) if args.ackmq else None
    return _open_targets(starts, first,
                         "--ackmq, --stomp-url URL, --rabbitmq-stomp or --activemq")


def _mqtt_target(url: str) -> Target:
    try:
        return probe_mqtt_target(url)
    except BenchSetupError as exc:
        raise BenchSetupError(f"--mqtt-url: {exc}") from None


def _ackmq_mqtt(data_dir: Path | None) -> Target:
    t = start_ackmq(data_dir, mqtt=True)
    t.label = "ackmq"
    return t


def _mqtt_targets(args: argparse.Namespace) -> list[Target]:
    _only_brokers_of(args, "MQTT")
    starts: list[Callable[[], Target]] = [partial(_mqtt_target, u) for u in args.mqtt_url]
    if args.mosquitto:
        starts.append(mosquitto)
    if args.rabbitmq_mqtt:
        starts.append(rabbitmq_mqtt)
    first = partial(_ackmq_mqtt, args.data_dir) if args.ackmq else None
    return _open_targets(starts, first,
                         "--ackmq, --mqtt-url URL, --mosquitto or --rabbitmq-mqtt")


def _targets(args: argparse.Namespace) -> list[Target]:
    _only_brokers_of(args, "AMQP")
    if args.url and args.ackmq:
        raise BenchSetupError("--url and --ackmq both name the broker under test; pick one")
    if args.compare and args.rabbitmq:
        raise BenchSetupError("--compare and --rabbitmq both name the comparison; pick one")
    for flag, url in (("--url", args.url), ("--compare", args.compare)):
        if url is not None:  # before anything starts: a typo must not cost a broker start
            try:
                check_url(url)
            except BenchSetupError as exc:
                raise BenchSetupError(f"{flag}: {exc}") from None
    starts: list[Callable[[], Target]] = []
    if args.url:
        starts.append(partial(probe, Target(args.url)))
    elif args.ackmq:
        starts.append(partial(start_ackmq, args.data_dir))
    if args.compare:
        starts.append(partial(probe, Target(args.compare)))
    elif args.rabbitmq:
        starts.append(local_rabbitmq)
    return _open_targets(starts, None, "--url URL, --ackmq or --rabbitmq")


def run_one(workload: str, target: Target, options: Options, rnd: int) -> dict[str, Any]:
    """One run; failures are recorded, not raised, so one bad run does not lose the rest."""
    ctx = RunContext(workload, target, options)
    rec: dict[str, Any] = {"workload": workload, "broker": target.label, "round": rnd,
                           "ok": False, "error": None}
    try:
        WORKLOADS[workload].run(ctx)
        rec["ok"] = True
    except Exception as exc:  # noqa: BLE001 - report and go on
        rec["error"] = f"{type(exc).__name__}: {exc}"
        rec["traceback"] = traceback.format_exc()
    finally:
        names = ctx.queues + ctx.exchanges
        gone = ctx.cleanup()
        rec["deleted"] = names if gone else []
        rec["left_empty"] = [] if gone else names  # STOMP-only broker: drained, not deleted
    rec.update(metrics=[asdict(m) for m in ctx.metrics], wall_s=ctx.wall_s,
               client_cpu_s=ctx.client_cpu_s, broker_cpu_s=ctx.broker_cpu_s,
               messages=ctx.messages, extra=ctx.extra)
    return rec


def run(args: argparse.Namespace) -> int:
    """Entry point of `ackmq bench`; returns the exit status."""
    stomp = args.stomp or any(w in STOMP_WORKLOADS for w in args.workloads)
    mqtt = args.mqtt or any(w in MQTT_WORKLOADS for w in args.workloads)
    if stomp and mqtt:
        print("STOMP and MQTT workloads cannot share a run; run them separately",
              file=sys.stderr)
        return 2
    names = list(dict.fromkeys(args.workloads)) or (
        STOMP_WORKLOADS if stomp else MQTT_WORKLOADS if mqtt else AMQP_WORKLOADS)
    unknown = [w for w in names if w not in WORKLOADS]
    if unknown:
        print(f"unknown workload(s): {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}",
              file=sys.stderr)
        return 2
    if mqtt and any(not WORKLOADS[w].mqtt for w in names):
        print("AMQP and MQTT workloads cannot share a run (Mosquitto has no AMQP); "
              "run them separately", file=sys.stderr)
        return 2
    if stomp and any(not WORKLOADS[w].stomp for w in names):
        print("AMQP and STOMP workloads cannot share a run (ActiveMQ has no AMQP); "
              "run them separately", file=sys.stderr)
        return 2
    if args.rounds < 1:
        print("--rounds must be at least 1", file=sys.stderr)
        return 2
    options = Options(messages=args.messages, scale=args.scale, rate=args.rate,
                      prefetch=tuple(args.prefetch),
                      floor_dir=str(args.data_dir) if args.data_dir else None,
                      stomp_prefetch=tuple(args.stomp_prefetch))
    try:
        targets = (_stomp_targets(args) if stomp else _mqtt_targets(args) if mqtt
                   else _targets(args))
    except BenchSetupError as exc:
        print(f"ackmq bench: {exc}", file=sys.stderr)
        return 2
    labels = [t.label for t in targets]
    by_label = {t.label: t for t in targets}
    plan = schedule(names, labels, args.rounds)
    meta: dict[str, Any] = {
        "command": shlex.join(sys.argv),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(),
        "cpus": os.cpu_count(), "python": platform.python_version(), "rounds": args.rounds,
        "options": asdict(options), "workloads": names,
        "brokers": [{"label": t.label, "url": t.public_url(), "product": t.product,
                     "version": t.version, "pid": t.pid,
                     "protocol": "stomp" if stomp else "mqtt" if mqtt else "amqp"}
                    for t in targets],
    }
    print("brokers: " + "; ".join(f"{t.label} = {t.product} {t.version} at {t.public_url()}"
                                  f" (pid {t.pid or 'unknown'})" for t in targets))
    progress = Progress(len(plan))
    runs: list[dict[str, Any]] = []
    try:
        for wl, rnd, label in plan:
            progress.show(f"{wl} on {label}, round {rnd + 1}/{args.rounds}")
            runs.append(run_one(wl, by_label[label], options, rnd))
            progress.step()
    except KeyboardInterrupt:
        progress.clear()
        print("interrupted; reporting the runs so far", file=sys.stderr)
    finally:
        progress.clear()
        for t in targets:
            t.close()
    rows = report.summarize(runs, labels)
    print(report.format_table(rows, runs, labels), end="")
    meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    meta["physical_floor"] = report.floor_summary(
        [r for r in runs if r["workload"] == "confirms-individual"])
    if args.json:
        report.write_json(args.json, meta, runs, rows)
        print(f"wrote {args.json}")
    if args.plot:
        report.plot(args.plot, rows, labels)
        print(f"wrote {args.plot}")
    return 0 if runs and all(r["ok"] for r in runs) and len(runs) == len(plan) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ackmq bench")
    add_arguments(parser)
    return run(parser.parse_args(argv))
