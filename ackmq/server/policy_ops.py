"""Policies and operator policies as the management plane handles them, once for the
HTTP API (/api/policies, /api/operator-policies), the UI, `ackmq ctl set_policy ...`,
definitions files and the config file's `load_definitions`: set, clear, list, the
queue and exchange JSON fields, and the definitions layout (policies in `policies`,
operator policies in `parameters` with component `operator_policy`, as RabbitMQ 3.10
exports them). The model is broker/policy.py; durability store/policyfile.py.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ackmq.broker.policy import Policy, policy_from_json
from ackmq.broker.policy_check import PolicyError

if TYPE_CHECKING:
    from ackmq.broker import BrokerModel

log = logging.getLogger("ackmq.policy")
OPERATOR_COMPONENT = "operator_policy"
# the HTTP API's PUT of a policy says its `no_effect_note` in this response header, as
# the ctl socket says it in its reply's "notes": `ackmq ctl` prints it either way (C6)
NOTE_HEADER = "X-Ackmq-Note"


class NoVhost(LookupError):
    """The vhost named does not exist (the API's 404 vhost_not_found)."""


def attach(broker: BrokerModel, data_dir: Path | None) -> None:
    """At start, before the queues are recovered: the saved policies, and every change
    saved from now on (`<data dir>/policies.json`; nothing on disk without a data dir)."""
    if data_dir is None:
        return
    from ackmq.store.policyfile import PolicyFile
    pf = PolicyFile(data_dir)
    data = pf.load()
    if data:
        broker.policies.load(data)
    broker.policies.save = pf.save


def set_policy(broker: BrokerModel, vhost: str, name: str, body: Any,
               operator: bool = False) -> bool:
    """Add or replace (True when new); checked as RabbitMQ 3.10 does (PolicyError with
    its text), saved, then in force on the vhost's queues and exchanges at once."""
    if vhost not in broker.vhosts:
        raise NoVhost(vhost)
    policy = policy_from_json(vhost, name, body, operator)
    new = broker.policies.get(vhost, name, operator) is None
    broker.policies.set(policy, operator)
    idle = policy.no_effect()
    if idle:
        log.warning("policy %r in vhost %r: %s take(s) no effect on ackmq's single node",
                    name, vhost, ", ".join(idle))
    return new


def clear_policy(broker: BrokerModel, vhost: str, name: str, operator: bool = False) -> bool:
    """False when there is no such policy."""
    return broker.policies.clear(vhost, name, operator)


def list_policies(broker: BrokerModel, vhost: str | None = None,
                  operator: bool = False) -> list[dict[str, Any]]:
    return [p.as_json() for p in broker.policies.list(vhost, operator)]


def no_effect_note(body: Any) -> str | None:
    """What a policy's definition sets that one node ignores (ha-*), said to the user."""
    try:
        idle = Policy("/", "", ".*", dict(body.get("definition") or {})).no_effect()
    except (PolicyError, AttributeError, TypeError):
        return None
    if not idle:
        return None
    return (f"note: {', '.join(idle)} take(s) no effect on ackmq (one node, no "
            "mirroring): accepted for compatibility")


# -- definitions -----------------------------------------------------------------------
def export_entries(broker: BrokerModel, vhost: str | None = None,
                   with_vhost: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(policies, operator-policy parameters) in RabbitMQ's definitions layout."""
    policies = []
    for p in broker.policies.list(vhost):
        j = p.as_json()
        if not with_vhost:
            j.pop("vhost")
        policies.append(j)
    params = []
    for p in broker.policies.list(vhost, operator=True):
        j = p.as_json()
        value = {"pattern": j["pattern"], "definition": j["definition"],
                 "priority": j["priority"], "apply-to": j["apply-to"]}
        params.append({"value": value, **({"vhost": p.vhost} if with_vhost else {}),
                       "component": OPERATOR_COMPONENT, "name": p.name})
    return policies, params


def import_policy(broker: BrokerModel, item: dict[str, Any], vhost: str | None) -> None:
    """One `policies` entry of a definitions file."""
    _import(broker, vhost or str(item.get("vhost", "/")), str(item["name"]), item, False)


def import_operator_policy(broker: BrokerModel, item: dict[str, Any], vhost: str | None) -> None:
    """One `parameters` entry with component `operator_policy`."""
    _import(broker, vhost or str(item.get("vhost", "/")), str(item["name"]),
            item.get("value"), True)


def _import(broker: BrokerModel, vhost: str, name: str, body: Any, operator: bool) -> None:
    try:
        set_policy(broker, vhost, name, body, operator)
    except NoVhost:
        raise PolicyError(f"vhost '{vhost}' does not exist") from None
