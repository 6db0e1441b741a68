"""Which tests may run beside which, when `./run test` runs the suite on three workers
(pytest-xdist with the scheduler below; docs/robustness.md, "The suite's time").

Every test broker listens on free ports and keeps its data in its own temp dir, so
most files can run beside any other. Three kinds may not, and each goes to groups
that run on a single worker, one test after the other:
- `spark` and `spark-pipelines`: the Spark drivers and clusters, in two lanes of about
  equal time (the Spark tests are the longest part of the suite: in one lane they were
  its critical path, 1,637 s of a 1,679 s run); more at once on a 2-core machine would
  starve each other past their own deadlines. The class-data archive is dumped
  atomically, so both lanes may make it on a fresh machine;
- `lazyfs`: the power-cut runs, which mount LazyFS;
- `rabbitmq-global`: the files that change the reference RabbitMQ's state for everyone
  on it (its memory and disk alarms, users, vhosts, permissions, policies, limits,
  definitions, plugins) or read its totals. A file whose text has one of the marks but
  that only ever talks to brokers of its own (`OWN_BROKERS_ONLY`: ackmq's own `ctl
  add_user`, its own `/api/overview`, a docstring naming rabbitmqctl) is not in it.
Any other file is its own group (its module fixtures start once). The big groups are
handed out first, so the last worker to finish is not left with them.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

#: what in a test file's text marks it as touching the reference broker's shared state
GLOBAL_MARKS = (
    "rabbitmqctl", "vm_memory", "disk_free", "/api/policies", "/api/operator-policies",
    "/api/users", "/api/permissions", "/api/topic-permissions", "/api/vhost-limits",
    "/api/user-limits", "/api/global-parameters", "/api/parameters", "/api/definitions",
    "/api/vhosts", "/api/overview", "add_user", "set_permissions", "set_policy",
    "add_vhost", "set_vhost_limits", "rabbitmq-plugins",
)
#: files with a mark of GLOBAL_MARKS that never reach the reference RabbitMQ (every broker
#: they talk to is an ackmq of their own; no `rabbitmq_url`, no fixture parametrized over
#: the reference): their own groups, so the serial rabbitmq-global lane is not made longer
#: by them (the listener fuzz alone is 11 tests of 10-20 s)
OWN_BROKERS_ONLY = ("test_admission", "test_amqp10_alarms_crash", "test_cli",
                    "test_ctl_await", "test_ctl_vocabulary", "test_delayed_durability",
                    "test_fuzz_listeners", "test_mgmt_hostile", "test_model_operations",
                    "test_mqtt", "test_mqtt_tls", "test_peek_ui", "test_scheduled_bounds",
                    "test_stomp_tls", "test_store_crashsim", "test_stream_batch",
                    "test_ui", "test_ui_http")
#: the Spark files of the second Spark lane: `pipeline land`, SDP and what lands
#: through them (the connector's source, sink and cluster files stay in `spark`)
SPARK_PIPELINES = ("test_spark_pipeline", "test_spark_sdp", "test_spark_audit",
                   "test_spark_mqtt", "test_client_resend")
#: files of a Spark lane of which only these tests start Spark: the others are the file's
#: own group (test_client_resend's cuts and kills without Spark: ~150 s of a 1,615 s
#: spark-pipelines lane, the longest lane of a run)
SPARK_TESTS_ONLY = {"test_client_resend": (
    "test_idempotent_producer_cut_50_times_then_landed_each_id_once_in_the_table",)}
#: files named test_spark* that never start Spark (the reader's and the staging's
#: protocol driven by hand, the progress counter, the stream protocol's probes and the
#: CLI's checks before Spark starts): each is its own group, not a serial Spark lane's
#: (~50 s of the `spark` lane). Not test_spark_sizing: its AvailableNow batch waits for
#: deliveries to pause 0.2 s, and beside the run's busiest files it once landed 580 of
#: the 1,000 it asserts (a fresh clone's run, load ~7)
NO_SPARK = ("test_spark_progress", "test_spark_reader", "test_spark_staging",
            "test_spark_stream_wire")
#: groups handed out first (the longest), in this order
FIRST = ("rabbitmq-global", "spark", "spark-pipelines", "lazyfs")
#: the longest files of their own group (30-90 s each in a run of the suite), handed out
#: right after FIRST, longest first: a long file handed out last would leave its worker
#: running alone at the end of the run
LONG = ("test_fuzz_listeners.py", "test_store_crashsim.py", "test_streams.py",
        "test_scheduled_bounds.py", "test_wheel.py", "test_mqtt.py", "test_qos.py",
        "test_native.py", "test_stomp_ack.py", "test_stream_tracking.py", "test_soak.py",
        "test_client_crash.py", "test_amqp_table.py", "test_delay_celery_dramatiq.py",
        "test_ui.py", "test_shovel_durability.py")


@functools.cache
def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


@functools.cache
def group_of_file(path: Path) -> str:
    """The lane of a test file (see the module's docstring)."""
    name, text = path.name, _text(path)
    if path.stem in NO_SPARK:
        return name
    if name.startswith("test_spark") or "mark.spark" in text:
        return "spark-pipelines" if path.stem in SPARK_PIPELINES else "spark"
    if "lazyfs" in name:
        return "lazyfs"
    if not text or (path.stem not in OWN_BROKERS_ONLY
                    and any(mark in text for mark in GLOBAL_MARKS)):
        return "rabbitmq-global"
    return name


def group_of(nodeid: str, root: Path) -> str:
    """The lane of a test by its node id (`tests/test_x.py::test_y[z]`)."""
    path = root / nodeid.split("::", 1)[0]
    spark_tests = SPARK_TESTS_ONLY.get(path.stem)
    if spark_tests is not None and "::" in nodeid \
            and nodeid.split("::", 1)[1].split("[", 1)[0] not in spark_tests:
        return path.name
    return group_of_file(path)


def order(items: list[pytest.Item], root: Path) -> None:
    """Put the big groups first, then the long files (stable: a file's tests keep their
    order)."""
    rank = {g: i for i, g in enumerate(FIRST + LONG)}
    items.sort(key=lambda it: rank.get(group_of_file(it.path), len(rank)))


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduling with each lane one scope: a lane's tests go to one
    worker, in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    root = config.rootpath
    # xdist hands out scopes by their number of tests unless told not to: the lanes go
    # in the order the workers collected them (`order` above: the longest first)
    config.option.loadscopereorder = False

    class LaneScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid, root)

    return LaneScheduling(config, log)
