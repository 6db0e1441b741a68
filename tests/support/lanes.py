"""Which tests may run beside which, when `./run test` runs the suite on two workers
(pytest-xdist, `--dist loadgroup`; docs/robustness.md, "The suite's time").

Every test broker listens on free ports and keeps its data in its own temp dir, so
most files can run beside any other. Three kinds may not, and each goes to one group
that runs on a single worker, one test after the other:
- `spark`: the Spark drivers and clusters; two at once on a 2-core machine would starve
  each other past their own deadlines (and they share one class-data archive);
- `lazyfs`: the power-cut runs, which mount LazyFS;
- `rabbitmq-global`: the files that change the reference RabbitMQ's state for everyone
  on it (its memory and disk alarms, users, vhosts, permissions, policies, limits,
  definitions, plugins) or read its totals.
Any other file is its own group (its module fixtures start once). The big groups are
handed out first, so the last worker to finish is not left with them.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

#: what in a test file's text marks it as touching the reference broker's shared state
GLOBAL_MARKS = (
    "rabbitmqctl", "vm_memory", "disk_free", "/api/policies", "/api/operator-policies",
    "/api/users", "/api/permissions", "/api/topic-permissions", "/api/vhost-limits",
    "/api/user-limits", "/api/global-parameters", "/api/parameters", "/api/definitions",
    "/api/vhosts", "/api/overview", "add_user", "set_permissions", "set_policy",
    "add_vhost", "set_vhost_limits", "rabbitmq-plugins",
)
#: groups handed out first (the longest), in this order
FIRST = ("spark", "rabbitmq-global", "lazyfs")


@functools.cache
def _touches_global_state(path: Path) -> bool:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True
    return any(mark in text for mark in GLOBAL_MARKS)


def group_of(item: pytest.Item) -> str:
    """The lane a test runs in (see the module's docstring)."""
    name = item.path.name
    if item.get_closest_marker("spark") is not None or name.startswith("test_spark"):
        return "spark"
    if "lazyfs" in name:
        return "lazyfs"
    if _touches_global_state(item.path):
        return "rabbitmq-global"
    return name


def assign(items: list[pytest.Item]) -> None:
    """Mark each test with its group and put the big groups first (stable: a file's
    tests keep their order)."""
    rank = {g: i for i, g in enumerate(FIRST)}
    groups = {}
    for item in items:
        g = groups[item.nodeid] = group_of(item)
        item.add_marker(pytest.mark.xdist_group(g))
    items.sort(key=lambda it: rank.get(groups[it.nodeid], len(FIRST)))
