"""rabbitmq-streams' `list_stream_group_consumers` and `list_stream_tracking` (RabbitMQ
3.11+; the stream plugin's CLI commands are the reference: their banners, columns and
error texts). The group's consumers are read from the stream consumers' listing
(`/api/stream/consumers`, so `--url` also reads a RabbitMQ with the stream management
plugin); the tracking from the admin socket or ackmq's `/api/stream/tracking`."""

from __future__ import annotations

from typing import Any

from ackmq.ctl.errors import CtlError

Item = dict[str, Any]
VERBS = ("list_stream_group_consumers", "list_stream_tracking")
GROUP_COLUMNS = ("subscription_id", "connection_name", "state")
TRACKING_COLUMNS = ("type", "name", "tracking_value")


def group_consumers(consumers: list[Item], stream: str, reference: str) -> list[Item]:
    """The single active consumers of `reference` on `stream`, the active one first."""
    rows = [{"subscription_id": c.get("subscription_id"),
             "connection_name": (c.get("connection_details") or {}).get("name"),
             "state": "active" if c.get("active") else "inactive"}
            for c in consumers
            if (c.get("queue") or {}).get("name") == stream
            and (c.get("properties") or {}).get("name") == reference
            and (c.get("properties") or {}).get("single-active-consumer") == "true"]
    return sorted(rows, key=lambda r: r["state"] != "active")


def _print(banner: str, rows: list[Item], cols: list[str], known: tuple[str, ...],
           formatter: str, quiet: bool) -> int:
    from ackmq.ctl.topology import text_value
    unknown = [c for c in cols if c not in known]
    if unknown:
        raise CtlError(f"Info key(s) {','.join(unknown)} are not supported", 64)
    if formatter == "json":
        import json
        print(json.dumps([{c: r[c] for c in cols} for r in rows]))
        return 0
    if not quiet:
        print(banner)
    if rows:
        print("\t".join(cols))
        for r in rows:
            print("\t".join(text_value(r[c]) for c in cols))
    return 0


def run(args: Any, src: Any) -> int:
    vhost = args.vhost or "/"
    if args.verb == "list_stream_group_consumers":
        rows = group_consumers(src.items("stream/consumers", vhost), args.stream,
                               args.reference)
        if not args.quiet and args.formatter != "json":
            print("Listing group consumers ...")
        if not rows:
            raise CtlError("The group does not exist", 70)
        return _print("", rows, list(args.columns or GROUP_COLUMNS), GROUP_COLUMNS,
                      args.formatter, True)
    which = "offset" if args.offset else "writer" if args.writer else None
    rows = [r for r in src.tracking(vhost, args.stream) if which in (None, r["type"])]
    return _print(f"Listing tracking information for stream {args.stream} ...", rows,
                  list(TRACKING_COLUMNS), TRACKING_COLUMNS, args.formatter, args.quiet)


def add_parsers(sub: Any) -> None:
    vp = sub.add_parser("list_stream_group_consumers")
    vp.add_argument("--stream", required=True)
    vp.add_argument("--reference", required=True)
    vp.add_argument("--vhost", "-p", default="/")
    vp.add_argument("columns", nargs="*", help="columns (default: "
                    f"{' '.join(GROUP_COLUMNS)})")
    vp.add_argument("--formatter", choices=("table", "json"), default="table")
    vp = sub.add_parser("list_stream_tracking")
    vp.add_argument("stream")
    which = vp.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="offsets and writers (default)")
    which.add_argument("--offset", action="store_true", help="consumers' stored offsets")
    which.add_argument("--writer", action="store_true",
                       help="named publishers' last publishing ids (deduplication)")
    vp.add_argument("--vhost", "-p", default="/")
    vp.add_argument("--formatter", choices=("table", "json"), default="table")
