"""C6: `ackmq ctl` speaks one vocabulary. Every verb that both ways to a broker serve
gives the same output (exit code, stdout, stderr) over the local admin socket and over
`--url` (the management HTTP API of the same broker), successes and refusals alike;
the verbs only the socket serves are named, so a new verb has to say which it is."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator

import pika
import pytest
from conftest import BrokerProcess
from support.stomphelp import Raw
from test_mgmt_ctl import ctl, http_of

from ackmq.ctl import access, global_parameters, policies, scheduled, topology
from ackmq.ctl.command import VERBS


@pytest.fixture(scope="module")
def proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("c6") / "data")
    b.start()
    yield b
    b.stop()


# the verbs only the admin socket serves (with --url they say so, exit 64)
SOCKET_ONLY = {
    "set_topic_permissions", "clear_topic_permissions", "list_topic_permissions",
    "list_user_topic_permissions", "set_vhost_limits", "clear_vhost_limits",
    "list_vhost_limits", "set_user_limits", "clear_user_limits", "list_user_limits",
    "set_vm_memory_high_watermark", "set_disk_free_limit", "alarms",
    # the shovel verbs (docs/shovels.md): over HTTP, /api/shovels and /api/parameters
    "shovel_status", "delete_shovel", "restart_shovel", "replay_messages"}


def _cases(u: str, vh: str, q: str) -> list[tuple[list[str], list[str] | None]]:
    """(a verb with its arguments, what undoes it between the socket's run and the
    API's) in an order in which both runs meet the same state."""
    pol = ["set_policy", "p-" + u, "^c6", '{"max-length":5}', "--priority", "3",
           "--apply-to", "queues"]
    ha = ["set_policy", "ha-" + u, "^c6ha", '{"ha-mode":"all","max-length":5}']
    return [
        (["add_user", u, "pw"], ["delete_user", u]),
        (["add_user", u, "pw"], None),  # refused: exists
        (["change_password", u, "pw2"], None),
        (["set_user_tags", u, "management", "monitoring"], None),
        (["set_user_tags", "nobody-" + u, "management"], None),  # refused
        (["list_users"], None),
        (["add_vhost", vh], ["delete_vhost", vh]),
        (["list_vhosts"], None),
        (["set_permissions", "-p", vh, u, "^c", "^w", "^r"], None),
        (["list_permissions", "-p", vh], None),
        (["list_user_permissions", u], None),
        (["trace_on", "-p", vh], None),
        (["trace_off", "-p", vh], None),
        (pol, ["clear_policy", "p-" + u]),
        (ha, ["clear_policy", "ha-" + u]),  # its "no effect" note
        (["set_policy", "bad-" + u, "^c6", '{"bogus":1}'], None),  # refused
        (["set_policy", "bad-" + u, "^c6", "notjson"], None),  # refused
        (["set_policy", "-p", "nov-" + u, "x", "^c6", '{"max-length":1}'], None),
        (["list_policies"], None),
        (["-q", "list_policies"], None),
        (["clear_policy", "p-" + u], ["set_policy", *pol[1:]]),
        (["clear_policy", "p-" + u], None),  # refused: none
        (["list_policies", "-p", "nov-" + u], None),  # refused: no vhost
        (["set_operator_policy", "o-" + u, "^c6", '{"max-length":9}'],
         ["clear_operator_policy", "o-" + u]),
        (["list_operator_policies"], None),
        (["clear_operator_policy", "o-" + u], ["set_operator_policy", "o-" + u, "^c6",
                                               '{"max-length":9}']),
        (["set_global_parameter", "g-" + u, '{"1":"v"}'],
         ["clear_global_parameter", "g-" + u]),
        (["set_global_parameter", "g-" + u, "notjson"], None),  # refused
        (["list_global_parameters"], None),
        (["clear_global_parameter", "g-" + u], ["set_global_parameter", "g-" + u, "1"]),
        (["clear_global_parameter", "g-" + u], None),  # refused: none
        (["list_scheduled_messages"], None),
        (["list_scheduled_messages", "-p", "nov-" + u], None),  # refused: no vhost
        (["delete_scheduled_message", "nojob-" + u], None),  # refused: no job
        (["delete_scheduled_message", "-p", "nov-" + u, "nojob"], None),  # no vhost
        (["list_queues", "name", "messages", "durable"], None),
        (["list_exchanges"], None),
        (["list_bindings"], None),
        (["list_consumers"], None),
        (["list_connections", "user", "vhost"], None),
        (["list_channels", "user", "number"], None),
        (["list_stream_connections"], None),
        (["list_stream_consumers"], None),
        (["list_stream_publishers"], None),
        (["list_stream_group_consumers", "--stream", q, "--reference", "g"], None),  # none
        (["list_stream_tracking", "nope-" + u], None),  # refused: no stream
        (["list_stream_tracking", q], None),  # refused: not a stream
        (["purge_queue", q], None),
        (["purge_queue", "nope-" + u], None),  # refused
        (["delete_queue", "nope-" + u], None),  # refused
        (["clear_permissions", "-p", vh, u], None),
        (["delete_vhost", vh], ["add_vhost", vh]),
        (["delete_vhost", vh], None),  # refused: gone
        (["delete_user", u], ["add_user", u, "pw"]),
        (["delete_user", u], None),  # refused: gone
    ]


def _schedule(b: BrokerProcess, queue: str) -> None:
    """A STOMP SEND held for an hour (ActiveMQ's AMQ_SCHEDULED_DELAY): one job listed."""
    raw = Raw(socket.create_connection(("127.0.0.1", b.stomp_port), timeout=10))
    try:
        raw.connect()
        raw.send("SEND", {"destination": f"/queue/{queue}", "AMQ_SCHEDULED_DELAY": "3600000",
                          "receipt": "r1"}, b"later")
        assert raw.recv().command == "RECEIPT"
    finally:
        raw.close()


def test_C6_every_verb_same_output_over_socket_and_url(proc: BrokerProcess) -> None:
    url, d = http_of(proc), str(proc.data_dir)
    tag = uuid.uuid4().hex[:6]
    u, vh, q = "c6u-" + tag, "c6vh-" + tag, "c6q-" + tag
    _schedule(proc, q)
    conn = pika.BlockingConnection(pika.URLParameters(proc.url))
    try:
        ch = conn.channel()
        ch.queue_declare(q, durable=True)
        ch.basic_consume(q, lambda *a: None)
        cases = _cases(u, vh, q)
        both = {v for args, _ in cases for v in args if v in VERBS or v in topology.VERBS}
        # every verb --url serves is compared here, and the rest is named above
        served = set(access.VERBS) | set(policies.VERBS) | set(scheduled.VERBS) \
            | set(topology.VERBS) | set(global_parameters.VERBS)
        assert served - {"status", "environment", "delete_queue", "close_connection"} <= both
        assert set(VERBS) - served - {"import_definitions", "export_definitions"} \
            == SOCKET_ONLY
        differ = []
        for args, undo in cases:
            over_socket = ctl("--data-dir", d, *args)
            if undo is not None:
                r = ctl("--data-dir", d, *undo)
                assert r.returncode == 0, (undo, r.stderr)
            over_url = ctl("--url", url, *args)
            got = [(r.returncode, r.stdout, r.stderr) for r in (over_socket, over_url)]
            if got[0] != got[1]:
                differ.append((args, *got))
        assert differ == [], "\n".join(map(repr, differ))
        listed = ctl("--url", url, "-q", "list_scheduled_messages").stdout.splitlines()
        assert len(listed) == 2 and f"\t{q}\t" in listed[1], listed  # the job compared
        for verb in sorted(SOCKET_ONLY):  # with --url: said plainly, nothing done
            names = VERBS[verb][0]
            extra = ["--user", u] if verb == "list_user_limits" else []
            r = ctl("--url", url, verb, *extra, *["x" for n in names if n[-1] not in "*?"])
            assert (r.returncode, r.stderr) == (64, f"Error:\n{verb} is not available "
                                                    "with --url (the admin socket only)\n")
    finally:
        conn.close()


def test_C6_policy_note_said_over_both_ways(proc: BrokerProcess) -> None:
    """A policy whose ha-* keys take no effect on one node is accepted with the same
    note over the admin socket and over the HTTP API."""
    url, d = http_of(proc), str(proc.data_dir)
    name = "ha-note-" + uuid.uuid4().hex[:6]
    for way in (["--data-dir", d], ["--url", url]):
        r = ctl(*way, "set_policy", name, "^hanote", '{"ha-mode":"all"}')
        assert r.returncode == 0, r.stderr
        assert r.stderr == ("note: ha-mode take(s) no effect on ackmq (one node, no "
                            "mirroring): accepted for compatibility\n"), way
        assert ctl(*way, "clear_policy", name).returncode == 0
