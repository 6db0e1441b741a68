"""C4: every queue / exchange / consume argument and policy key is declared once, in
broker/argument_table.py, and validation, policy checks, policy application, the API's
policy path and the UI read that declaration (in-process: the table is the model's)."""

from __future__ import annotations

import ast
import pathlib
from typing import Any

import pytest

from ackmq.broker import argument_table as table
from ackmq.broker.argument_table import LOWER, Key, index
from ackmq.broker.arguments import check_consume_arguments, check_queue_arguments, equivalence_keys
from ackmq.broker.errors import SoftError
from ackmq.broker.policy import Policy, effective_arguments, policy_from_json
from ackmq.broker.policy_check import PolicyError
from ackmq.server.http import ui

ROOT = pathlib.Path(__file__).resolve().parents[1] / "ackmq"
# modules that name keys without declaring their rules: clients send them (and may not
# import the broker), STOMP's SUBSCRIBE headers are RabbitMQ's plugin's own list
NOT_DECLARATIONS = {"client/options.py", "spark/amqp.py", "server/stomp/subscriptions.py"}


def test_C4_every_key_is_declared_once() -> None:
    """One row per (name, scope) and per policy key; each type's capability places are
    1..n; and no module but the table holds a collection of two or more keys (the
    declarations once spelt out in arguments.py, policy_check.py, policy.py, the UI)."""
    seen = [(k.name, k.scope) for k in table.KEYS]
    assert len(seen) == len(set(seen))
    policy_keys = [k.policy_key for k in table.KEYS if k.policy is not None]
    assert len(policy_keys) == len(set(policy_keys))
    for scope in (table.QUEUE, table.CONSUME):
        for t in table.QUEUE_TYPES:
            places = sorted(k.types[t] for k in table.KEYS if k.scope == scope and t in k.types)
            assert places == list(range(1, len(places) + 1)), (scope, t)
    names = {k.name for k in table.KEYS} | set(policy_keys)
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "broker/argument_table.py" or rel in NOT_DECLARATIONS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Tuple | ast.List | ast.Set):
                elts: list[Any] = node.elts
            elif isinstance(node, ast.Dict):
                elts = [k for k in node.keys if k is not None]
            else:
                continue
            hits = [e.value for e in elts if isinstance(e, ast.Constant) and e.value in names]
            if len(hits) >= 2:
                found.append((rel, node.lineno, hits))
    assert found == []


NEW = Key("x-ackmq-test-limit", check=table._non_neg, own=True,
          policy=table._p_nonneg("test limit"), operator=True, merge=LOWER, abbr="TLim")


def _refused(args: dict[str, Any], consume: bool = False) -> str | None:
    try:
        if consume:
            check_consume_arguments(args, "q", "/")
        else:
            check_queue_arguments(args, "q", "/")
    except SoftError as e:
        return e.text
    return None


def _policy(definition: dict[str, Any], operator: bool = False) -> Policy | str:
    """What PUT /api/policies (and /api/operator-policies) answers: it calls
    policy_from_json (server/policy_ops.py); the UI form and ctl call the same."""
    try:
        return policy_from_json("/", "p", {"pattern": ".*", "definition": definition},
                                operator)
    except PolicyError as e:
        return e.text


@pytest.fixture
def with_new_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(table, "INDEX", index((*table.KEYS, NEW)))


def test_C4_a_key_not_in_the_table_is_known_nowhere() -> None:
    """Without the row: no check of its value, not compared on redeclare, not a policy
    key, no UI label (the other half of the next test)."""
    assert _refused({"x-ackmq-test-limit": -1}) is None
    assert "x-ackmq-test-limit" not in equivalence_keys("classic")
    assert _policy({"ackmq-test-limit": 3}) == (
        'Validation failed\n\n[{<<"ackmq-test-limit">>,3}] are not recognised policy '
        "settings\n")
    assert effective_arguments({"x-ackmq-test-limit": 10}, {"ackmq-test-limit": 3}) == \
        {"x-ackmq-test-limit": 10}
    assert ui._short_arg("x-ackmq-test-limit") == "x-ackmq-test-limit"


def test_C4_a_key_added_to_the_table_alone_is_known_everywhere(with_new_key: None) -> None:
    """One row added to the table: declare checks its value (and only on the types its
    row says), a redeclare compares it, a policy and an operator policy may set it (the
    API's path) with the row's text, a policy folds into the argument by the row's rule,
    and the UI labels it."""
    text = "PRECONDITION_FAILED - invalid arg 'x-ackmq-test-limit' for queue 'q' in vhost '/'"
    assert _refused({"x-ackmq-test-limit": -1}) == f"{text}: {{value_negative,-1}}"
    assert _refused({"x-ackmq-test-limit": "a"}) == f'{text}: "expected integer, got longstr"'
    assert _refused({"x-ackmq-test-limit": 5}) is None
    assert _refused({"x-ackmq-test-limit": -1, "x-queue-type": "quorum"}) is not None
    assert _refused({"x-ackmq-test-limit": -1}, consume=True) is None  # not `consume`
    assert "x-ackmq-test-limit" in equivalence_keys("classic")
    assert "x-ackmq-test-limit" not in equivalence_keys("stream")
    assert _policy({"ackmq-test-limit": -1}) == \
        "Validation failed\n\n-1 is not a valid test limit\n"
    assert isinstance(_policy({"ackmq-test-limit": 3}), Policy)
    assert isinstance(_policy({"ackmq-test-limit": 3}, operator=True), Policy)
    assert effective_arguments({"x-ackmq-test-limit": 10}, {"ackmq-test-limit": 3}) == \
        {"x-ackmq-test-limit": 3}
    assert effective_arguments({}, {"ackmq-test-limit": 3}) == {"x-ackmq-test-limit": 3}
    assert ui._short_arg("x-ackmq-test-limit") == "TLim"
    # and through the model and the operation the HTTP API, the UI form and ctl call
    from ackmq.broker import BrokerModel, NullScheduler
    from ackmq.server import policy_ops

    broker = BrokerModel(NullScheduler())
    broker.start()
    vh = broker.vhosts["/"]
    with pytest.raises(SoftError, match="value_negative"):
        vh.declare_queue("bad", False, False, False, False, {"x-ackmq-test-limit": -1}, None)
    q = vh.declare_queue("q", False, False, False, False, {"x-ackmq-test-limit": 10}, None)
    with pytest.raises(PolicyError, match="is not a valid test limit"):
        policy_ops.set_policy(broker, "/", "p", {"pattern": "^q$",
                                                 "definition": {"ackmq-test-limit": "x"}})
    policy_ops.set_policy(broker, "/", "p", {"pattern": "^q$",
                                             "definition": {"ackmq-test-limit": 4}})
    assert broker.policies.queue_arguments(q)["x-ackmq-test-limit"] == 4


def test_C4_the_index_is_rabbitmqs_lists() -> None:
    """The derived lists are RabbitMQ 3.10's (capabilities, operator_policy_validator),
    so deriving them changed nothing a client sees."""
    ix = table.INDEX
    assert ix.type_args["quorum"] == (
        "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-dead-letter-strategy",
        "x-expires", "x-max-length", "x-max-length-bytes", "x-max-in-memory-length",
        "x-max-in-memory-bytes", "x-overflow", "x-single-active-consumer", "x-queue-type",
        "x-quorum-initial-group-size", "x-delivery-limit", "x-message-ttl",
        "x-queue-leader-locator")
    assert ix.type_args["stream"] == (
        "x-max-length-bytes", "x-queue-type", "x-max-age", "x-stream-max-segment-size-bytes",
        "x-initial-cluster-size", "x-queue-leader-locator")
    assert ix.operator == {"expires", "message-ttl", "max-length", "max-length-bytes",
                           "max-in-memory-length", "max-in-memory-bytes", "delivery-limit"}
    assert ix.consumer_args == {"classic": ("x-cancel-on-ha-failover", "x-priority", "x-credit"),
                                "quorum": ("x-priority", "x-credit"),
                                "stream": ("x-stream-offset", "x-credit")}
    assert ix.exchange_equivalence == ("alternate-exchange", "x-delayed-delivery")


def _broker_imports(module: str) -> set[str]:
    """The ackmq.broker modules `module` imports, at any level (local imports too)."""
    tree = ast.parse((ROOT / "broker" / f"{module}.py").read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ackmq.broker"):
            mod = node.module or ""
            out.update({mod} if mod != "ackmq.broker" else
                       {f"ackmq.broker.{a.name}" for a in node.names})
    return out


def test_C4_the_table_is_at_the_bottom_and_retry_does_not_import_arguments() -> None:
    """The table imports only the model's errors; retry reads the table, not
    arguments.py (they imported each other, through local imports)."""
    assert _broker_imports("argument_table") == {"ackmq.broker.errors"}
    assert "ackmq.broker.arguments" not in _broker_imports("retry")
    assert "ackmq.broker.retry" not in _broker_imports("arguments")


def test_C4_one_erlang_renderer() -> None:
    """erlang.py renders every Erlang term the texts hold (arguments, policies, streams,
    x-match, expiration), and lays out a long tuple as ~p does, for both texts that
    break one (an expiration's reason, a policy's pattern error)."""
    from ackmq.broker.message import parse_expiration
    from ackmq.protocol.amqp.erlang import Atom, Chars, erl_term, reason

    assert erl_term((Atom("longstr"), "a\"b")) == '{longstr,<<"a\\"b">>}'
    assert erl_term([{"k": None}, True, 1.5, Chars("x")]) == '[#{<<"k">> => null},true,1.5,"x"]'
    assert reason("max_less_than_min", 5, 7) == "{max_less_than_min,5,7}"
    assert reason("invalid_overflow") == "invalid_overflow"
    tail = "a" * 60
    with pytest.raises(SoftError) as e:
        parse_expiration("1" + tail)
    head = f"invalid expiration '1{tail}': "
    assert e.value.text == \
        f'PRECONDITION_FAILED - {head}{{leftover_string,\n{" " * (len(head) + 1)}"{tail}"}}'
    with pytest.raises(SoftError) as e:
        parse_expiration("1" + tail[:10])
    assert e.value.text.endswith(f"{{leftover_string,\"{tail[:10]}\"}}")
    prefix = "pattern should be regular expression but is invalid: "
    assert _policy_pattern("[") == (
        f'Validation failed\n\n{prefix}{{"missing terminating ] for character class",\n'
        f'{" " * (len(prefix) + 1)}1}}\n')
    assert _policy_pattern("(") == f'Validation failed\n\n{prefix}{{"missing )",1}}\n'


def _policy_pattern(pattern: str) -> str:
    try:
        policy_from_json("/", "p", {"pattern": pattern, "definition": {"expires": 1}})
    except PolicyError as e:
        return e.text
    raise AssertionError("accepted")
