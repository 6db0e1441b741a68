"""The admin socket's resource alarm verbs (U5 at run time): rabbitmqctl's
`set_vm_memory_high_watermark`, `set_disk_free_limit` and `alarms`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ackmq.broker.access import AccessError
from ackmq.server.alarms import parse_disk_limit, parse_watermark
from ackmq.server.ctl.errors import nargs

if TYPE_CHECKING:
    from ackmq.server.context import HttpContext


def handle(ctx: HttpContext, verb: str, args: list[str]) -> dict[str, Any]:
    """U5 at run time, rabbitmqctl's `set_vm_memory_high_watermark <fraction> |
    absolute <value>` and `set_disk_free_limit <disk_limit> | mem_relative
    <fraction>` (exit 65 on a bad value, as rabbitmqctl), and the alarms now set."""
    monitor = ctx.alarms
    assert monitor is not None  # a running broker has its resource monitor
    if verb == "alarms":
        nargs(args, 0, "alarms")
        lim = monitor.limits
        return {"ok": True, "columns": ["alarm", "used", "limit"], "rows": [
            [f"{r}", str(monitor.rss if r == "memory" else monitor.disk_free),
             str(lim.memory_limit if r == "memory" else lim.disk_free_limit)]
            for r in sorted(lim.active)]}
    memory = verb == "set_vm_memory_high_watermark"
    keyword = "absolute" if memory else "mem_relative"
    if not (len(args) == 1 or (len(args) == 2 and args[0] == keyword)):
        raise AccessError("Bad argument.\nusage: " + (
            "set_vm_memory_high_watermark <fraction> | absolute <value>" if memory else
            "set_disk_free_limit <disk_limit> | mem_relative <fraction>"), 65)
    try:
        if memory:
            if len(args) == 2:
                limit = parse_watermark("absolute:" + args[1])
            else:  # rabbitmqctl takes a fraction here, an amount after `absolute`
                try:
                    fraction = float(args[0])
                except ValueError:
                    raise AccessError("Bad argument.\nusage: set_vm_memory_high_"
                                      "watermark <fraction> | absolute <value>", 65) from None
                if not 0.0 <= fraction <= 1.0:
                    raise ValueError("The threshold should be a fraction between "
                                     "0.0 and 1.0")
                limit = parse_watermark(args[0])
            monitor.set_watermark(limit)
        else:
            limit = parse_disk_limit(("mem_relative:" if len(args) == 2 else "")
                                     + args[-1])
            monitor.set_disk_limit(limit)
    except ValueError as e:
        raise AccessError(f"Bad argument: {e}", 65) from e
    ctx.request_flush()
    return {"ok": True}
