"""M5-M7 through `ackmq ctl` (rabbitmqctl's policy verbs, texts and exit codes, recorded
from RabbitMQ 3.10's rabbitmqctl), durability (policies.json: kill -9 while policies are
set and changed under confirmed load; nothing confirmed lost, every policy back) and
`--load-definitions` at start."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from conftest import BrokerProcess
from support.pikahelp import confirmed_publisher
from test_mgmt_ctl import ctl, ok

from ackmq.server.conffile import Option, parse


@pytest.fixture(scope="module")
def proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("pol") / "data", "--no-stomp")
    b.start()
    yield b
    b.stop()


def sock(b: BrokerProcess) -> list[str]:
    return ["--data-dir", str(b.data_dir)]


def test_M5_ctl_set_list_clear_as_rabbitmqctl(proc: BrokerProcess) -> None:
    d = sock(proc)
    # RabbitMQ 3.10's rabbitmqctl, recorded
    assert ok(*d, "set_policy", "pc", "^yy", '{"max-length":3}', "--priority", "5",
              "--apply-to", "queues") == (
        'Setting policy "pc" for pattern "^yy" to "{"max-length":3}" with priority "5" '
        'for vhost "/" ...\n')
    r = ctl(*d, "set_policy", "pc2", "^yy", '{"bogus":3}')
    assert (r.returncode, r.stderr) == (69, "Error:\nValidation failed\n\n"
                                            '[{<<"bogus">>,3}] are not recognised policy '
                                            "settings\n\n")
    r = ctl(*d, "set_policy", "pc3", "^yy", "notjson")
    assert (r.returncode, r.stderr) == (69, "Error:\nJSON decoding error. Reason: badarg\n")
    r = ctl(*d, "set_policy", "pc3", "(", '{"max-length":1}')
    assert (r.returncode, r.stderr) == (69, "Error:\nValidation failed\n\npattern should be "
                                            'regular expression but is invalid: {"missing )"'
                                            ",1}\n\n")
    r = ctl(*d, "set_policy", "pc3", "^yy", '{"max-length":1}', "--apply-to", "x")
    assert r.returncode == 69
    assert "apply-to 'x' unrecognised; should be 'queues', 'exchanges' or 'all'" in r.stderr
    assert ok(*d, "list_policies") == (
        'Listing policies for vhost "/" ...\n'
        "vhost\tname\tpattern\tapply-to\tdefinition\tpriority\n"
        '/\tpc\t^yy\tqueues\t{"max-length":3}\t5\n')
    assert ok(*d, "-q", "list_policies") == (
        "vhost\tname\tpattern\tapply-to\tdefinition\tpriority\n"
        '/\tpc\t^yy\tqueues\t{"max-length":3}\t5\n')
    assert ok(*d, "set_operator_policy", "oc", "^yy", '{"max-length":3}', "--priority", "5",
              "--apply-to", "queues") == (
        'Setting operator policy override "oc" for pattern "^yy" to "{"max-length":3}" '
        'with priority "5" for vhost "/" ...\n')
    assert ok(*d, "list_operator_policies") == (
        'Listing operator policy overrides for vhost "/" ...\n'
        "vhost\tname\tpattern\tapply-to\tdefinition\tpriority\n"
        '/\toc\t^yy\tqueues\t{"max-length":3}\t5\n')
    r = ctl(*d, "set_operator_policy", "oc2", "^yy", '{"overflow":"drop-head"}')
    assert r.returncode == 69 and "are not recognised policy settings" in r.stderr
    r = ctl(*d, "clear_policy", "nope")
    assert (r.returncode, r.stdout, r.stderr) == (
        69, 'Clearing policy "nope" on vhost "/" ...\n', "Error:\nParameter does not exist\n")
    assert ok(*d, "clear_policy", "pc") == 'Clearing policy "pc" on vhost "/" ...\n'
    assert ok(*d, "clear_operator_policy", "oc") == (
        'Clearing operator policy "oc" on vhost "/" ...\n')
    assert ok(*d, "list_policies") == 'Listing policies for vhost "/" ...\n'
    r = ctl(*d, "list_policies", "-p", "nov")
    assert (r.returncode, r.stderr) == (65, "Error:\nVirtual host 'nov' does not exist\n")
    # rabbitmqctl checks the policy before the vhost
    r = ctl(*d, "set_policy", "-p", "nov", "pc3", "^yy", "{}")
    assert (r.returncode, r.stderr) == (69, "Error:\nValidation failed\n\nno policy provided\n\n")
    r = ctl(*d, "set_policy", "-p", "nov", "pc3", "^yy", '{"max-length":1}')
    assert (r.returncode, r.stderr) == (65, "Error:\nVirtual host 'nov' does not exist\n")


def test_M5_ctl_ha_keys_accepted_with_a_note(proc: BrokerProcess) -> None:
    d = sock(proc)
    r = ctl(*d, "set_policy", "ha", "^ha-none", '{"ha-mode":"all"}')
    assert r.returncode == 0
    assert "ha-mode take(s) no effect on ackmq" in r.stderr
    ok(*d, "clear_policy", "ha")


def test_M5_ctl_list_queues_policy_column(proc: BrokerProcess) -> None:
    d = sock(proc)
    conn = pika.BlockingConnection(pika.URLParameters(proc.url))
    ch = conn.channel()
    ch.queue_declare("ctl-pol.q")
    ch.queue_declare("ctl-other.q")
    ch.exchange_declare("ctl-pol.x", "fanout")
    try:
        ok(*d, "set_policy", "cp", r"^ctl-pol\.", '{"max-length":10}')
        out = ok(*d, "-q", "list_queues", "name", "policy")
        assert "ctl-pol.q\tcp\n" in out and "ctl-other.q\t\n" in out
        assert "ctl-pol.x\tcp\n" in ok(*d, "-q", "list_exchanges", "name", "policy")
    finally:
        ok(*d, "clear_policy", "cp")
        ch.queue_delete("ctl-pol.q")
        ch.queue_delete("ctl-other.q")
        ch.exchange_delete("ctl-pol.x")
        conn.close()


@pytest.mark.slow
def test_M7_policies_survive_kill_9_under_confirmed_load(tmp_path: Path) -> None:
    """Policies set, changed and cleared while four publishers wait for confirms; kill -9
    in the middle of it, twice: every confirmed message is back, and so is every policy
    whose `set_policy` had answered (the change is saved before the answer)."""
    b = BrokerProcess(tmp_path / "data", "--no-stomp")
    d = ["--data-dir", str(b.data_dir)]
    confirmed: list[str] = []
    expected: dict[str, str] = {}
    try:
        for cycle in range(2):
            b.start()
            conn = pika.BlockingConnection(pika.URLParameters(b.url))
            conn.channel().queue_declare("pol-load", durable=True)
            conn.close()
            stop = threading.Event()
            threads = [threading.Thread(target=confirmed_publisher,
                                        args=(b.url, "pol-load", f"c{cycle}p{i}", confirmed, stop))
                       for i in range(4)]
            for t in threads:
                t.start()
            for i in range(6):  # policies that keep every message (no length limit)
                name = f"p{cycle}-{i % 3}"
                definition = json.dumps({"message-ttl": 3_600_000 + i,
                                         "dead-letter-exchange": f"dlx{i}"})
                ok(*d, "set_policy", name, "^pol-", definition, "--priority", str(i))
                expected[name] = definition
                if i == 4:
                    ok(*d, "clear_policy", f"p{cycle}-0")
                    expected.pop(f"p{cycle}-0")
                time.sleep(0.1)
            ok(*d, "set_operator_policy", f"o{cycle}", "^pol-", '{"expires":86400000}')
            expected[f"o{cycle}"] = '{"expires":86400000}'
            b.kill()
            stop.set()
            for t in threads:
                t.join(30)
            assert not any(t.is_alive() for t in threads)
        b.start()
        listed = ok(*d, "-q", "list_policies") + ok(*d, "-q", "list_operator_policies")
        got = {line.split("\t")[1]: json.loads(line.split("\t")[4])
               for line in listed.splitlines() if line and not line.startswith("vhost\t")}
        assert got == {k: json.loads(v) for k, v in expected.items()}
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        bodies = set()
        while True:
            m = ch.basic_get("pol-load", auto_ack=True)
            if m[0] is None:
                break
            bodies.add(m[2].decode())
        conn.close()
    finally:
        b.stop()
    assert len(confirmed) > 50
    missing = set(confirmed) - bodies
    assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:5]}"


def test_M5_load_definitions_at_start(tmp_path: Path) -> None:
    """`--load-definitions FILE` (rabbitmq.conf's `load_definitions`): a RabbitMQ 3.10
    export's policies, operator policies and queues, imported at start, in force."""
    defs = {"rabbit_version": "3.10.8", "vhosts": [{"name": "/"}],
            "policies": [{"vhost": "/", "name": "cap", "pattern": "^capped$",
                          "apply-to": "queues", "definition": {"max-length": 2},
                          "priority": 0}],
            "parameters": [{"value": {"pattern": "^capped$", "definition": {
                "message-ttl": 60000}, "priority": 0, "apply-to": "all"}, "vhost": "/",
                "component": "operator_policy", "name": "ttl"}],
            "queues": [{"name": "capped", "vhost": "/", "durable": True,
                        "auto_delete": False, "arguments": {}}]}
    path = tmp_path / "defs.json"
    path.write_text(json.dumps(defs))
    assert parse(f"load_definitions = {path}\n", [Option("load_definitions", Path)]) == {
        "load_definitions": path}
    b = BrokerProcess(tmp_path / "data", "--no-stomp", "--load-definitions", str(path))
    b.start()
    try:
        d = ["--data-dir", str(b.data_dir)]
        assert "/\tcap\t^capped$\tqueues\t{\"max-length\":2}\t0" in ok(*d, "list_policies")
        assert "/\tttl\t^capped$\tall\t{\"message-ttl\":60000}\t0" in ok(
            *d, "list_operator_policies")
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(4):
            ch.basic_publish("", "capped", str(i).encode())
        assert ch.queue_declare("capped", passive=True).method.message_count == 2
        conn.close()
    finally:
        b.stop()


@pytest.mark.rabbitmq
def test_M5_ctl_url_policy_verbs_against_rabbitmq_and_ackmq(proc: BrokerProcess) -> None:
    """`ackmq ctl --url` drives /api/policies of RabbitMQ 3.10 and of ackmq alike: the
    same lines, texts and exit codes as over the admin socket."""
    from support.mgmthelp import rabbit_http
    from test_mgmt_ctl import http_of
    rabbit = rabbit_http().replace("http://", "http://guest:guest@")
    name = f"ctl-url-{time.monotonic_ns()}"
    for url in (rabbit, http_of(proc)):
        u = ["--url", url]
        try:
            ok(*u, "set_policy", name, "^ctl-url-none$", '{"max-length":3}', "--priority",
               "5", "--apply-to", "queues")
            assert f'/\t{name}\t^ctl-url-none$\tqueues\t{{"max-length":3}}\t5\n' in ok(
                *u, "-q", "list_policies")
            r = ctl(*u, "set_policy", name, "^x", '{"bogus":3}')
            assert (r.returncode, r.stderr) == (69, 'Error:\nValidation failed\n\n'
                                                    '[{<<"bogus">>,3}] are not recognised '
                                                    "policy settings\n\n")
            ok(*u, "set_operator_policy", name, "^ctl-url-none$", '{"expires":1000}')
            assert f"/\t{name}\t^ctl-url-none$\tall\t" in ok(*u, "list_operator_policies")
            ok(*u, "clear_operator_policy", name)
        finally:
            ctl(*u, "clear_policy", name)
        r = ctl(*u, "clear_policy", name)
        assert (r.returncode, r.stderr) == (69, "Error:\nParameter does not exist\n"), url
