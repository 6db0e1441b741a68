"""Policies and operator policies (M5-M7): per vhost, a name, a pattern on queue or
exchange names, what it applies to, a priority and a definition. Of the policies that
match an object the highest priority wins (one policy per object, as RabbitMQ; a tie
goes to the first name in sort order), and so for operator policies.

What a queue or exchange then does comes from ONE function, `queue_arguments` /
`exchange_alternate`: its declared arguments merged with the policy and the operator
policy by RabbitMQ 3.10's rules (rabbit_amqqueue_process's args_policy_lookup and
rabbit_policy:merge_operator_definition):
- policy ⊕ operator policy: a key only one sets comes from it; a key both set takes the
  lower value (every operator-policy key is a numeric limit);
- argument ⊕ that: for the numeric limits (expires, message-ttl, max-length,
  max-length-bytes, delivery-limit, consumer-timeout) the lower value; for every other
  key (dead-letter-exchange and -routing-key, overflow, alternate-exchange, ...) the
  queue's or exchange's own argument, the policy's only when it has none.
Queues keep reading their settings from an `x-` argument dict, so nothing is handled
twice: a policy's key becomes the argument it stands for. Which rule a key follows is
declared with the key (argument_table: `merge`, `no_effect`).

A change (set, clear, vhost deleted) is saved first (`save(snapshot)`, atomic, before the
caller answers), then re-applied at once to every queue and exchange of the vhost
(`Queue.apply_policy`, the exchange's `alternate`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ackmq.broker import argument_table as table
from ackmq.broker.arguments import as_text, declared_type
from ackmq.broker.policy_check import (
    PolicyError,
    check_apply_to,
    check_definition,
    check_priority,
    compile_pattern,
)

if TYPE_CHECKING:
    from ackmq.broker.exchange import Exchange
    from ackmq.broker.queue_type import Queue
    from ackmq.broker.vhost import VHost

_QUEUE_KINDS = {"queues": None, "classic_queues": "classic", "quorum_queues": "quorum",
                "streams": "stream"}


@dataclass(eq=False)
class Policy:
    vhost: str
    name: str
    pattern: str
    definition: dict[str, Any]
    priority: int | float = 0
    apply_to: str = "all"
    regex: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.regex = compile_pattern(self.pattern)

    def as_json(self) -> dict[str, Any]:
        """RabbitMQ's JSON of a policy (/api/policies, definitions files)."""
        return {"vhost": self.vhost, "name": self.name, "pattern": self.pattern,
                "apply-to": self.apply_to, "definition": dict(self.definition),
                "priority": self.priority}

    def applies(self, kind: str, name: str, qtype: str | None) -> bool:
        """`kind` "queue" (of type `qtype`) or "exchange"."""
        at = self.apply_to
        if kind == "exchange":
            ok = at in ("exchanges", "all")
        else:
            ok = at == "all" or (at in _QUEUE_KINDS and _QUEUE_KINDS[at] in (None, qtype))
        return ok and self.regex.search(name) is not None

    def no_effect(self) -> list[str]:
        """The keys that change nothing on ackmq's one node (ha-*, cluster sizes, ...)."""
        return sorted(k for k in self.definition if k in table.INDEX.no_effect)


def policy_from_json(vhost: str, name: str, body: Any, operator: bool = False) -> Policy:
    """A policy from RabbitMQ's JSON (the API's PUT body, a definitions file's entry),
    checked in RabbitMQ's order: the keys it needs, priority, pattern, apply-to, then
    the definition. Raises PolicyError with RabbitMQ's text."""
    if not isinstance(body, dict):
        raise PolicyError("not_json")
    for key in ("pattern", "definition"):
        if key not in body:
            raise PolicyError(f"[{{key_missing,{key}}}]")
    priority = check_priority(body.get("priority", 0))
    compile_pattern(body["pattern"])
    apply_to = check_apply_to(body.get("apply-to", "all"))
    definition = check_definition(body["definition"], operator)
    return Policy(vhost, name, body["pattern"], definition, priority, apply_to)


def _lower(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else min(a, b)


def _num(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def merged_definition(policy: Policy | None, op: Policy | None) -> dict[str, Any]:
    """RabbitMQ's effective_policy_definition: the policy's keys, the operator policy's,
    and for a key both set the lower value."""
    out = dict(policy.definition) if policy is not None else {}
    if op is not None:
        for k, v in op.definition.items():
            out[k] = _lower(_num(out.get(k)), _num(v)) if k in out else v
    return out


def effective_arguments(arguments: dict[str, Any], definition: dict[str, Any]) -> dict[str, Any]:
    """A queue's declared arguments with a merged policy definition folded in as `x-`
    arguments: the lower value for the numeric limits, the argument's otherwise."""
    if not definition:
        return arguments
    out = dict(arguments)
    lower_wins, argument_wins = table.INDEX.lower_wins, table.INDEX.argument_wins
    for key, value in definition.items():
        arg = lower_wins.get(key)
        if arg is not None:
            low = _lower(_num(arguments.get(arg)), _num(value))
            if low is not None:
                out[arg] = low
            continue
        arg = argument_wins.get(key)
        if arg is not None and arguments.get(arg) is None:
            out[arg] = value
    return out


class PolicyOwner(Protocol):
    """The broker as its policy book sees it (`BrokerModel`, above the book in broker's
    inner layers, satisfies it)."""

    @property
    def vhosts(self) -> dict[str, VHost]: ...
    def request_flush(self) -> None: ...


class PolicyBook:
    """Every vhost's policies and operator policies, and what they apply to."""

    def __init__(self, broker: PolicyOwner) -> None:
        self.broker = broker
        # (operator?) -> vhost -> name -> Policy
        self._books: dict[bool, dict[str, dict[str, Policy]]] = {False: {}, True: {}}
        # called with the snapshot BEFORE a change takes effect (durable, atomic)
        self.save: Callable[[dict[str, Any]], None] | None = None
        self._batched: set[str] | None = None  # inside batch(): the vhosts changed

    # -- reading ------------------------------------------------------------------
    def list(self, vhost: str | None = None, operator: bool = False) -> list[Policy]:
        book = self._books[operator]
        vhosts = [vhost] if vhost is not None else sorted(book)
        return [p for v in vhosts for _n, p in sorted(book.get(v, {}).items())]

    def get(self, vhost: str, name: str, operator: bool = False) -> Policy | None:
        return self._books[operator].get(vhost, {}).get(name)

    def match(self, vhost: str, kind: str, name: str, qtype: str | None = None,
              operator: bool = False) -> Policy | None:
        """The policy in force on an object: the highest priority of those that match."""
        best: Policy | None = None
        for p in self._books[operator].get(vhost, {}).values():
            if p.applies(kind, name, qtype) and (
                    best is None or p.priority > best.priority
                    or (p.priority == best.priority and p.name < best.name)):
                best = p
        return best

    def in_force(self, vhost: str, kind: str, name: str,
                 qtype: str | None = None) -> tuple[Policy | None, Policy | None]:
        """(policy, operator policy) on an object."""
        if not self._books[False].get(vhost) and not self._books[True].get(vhost):
            return None, None
        return (self.match(vhost, kind, name, qtype),
                self.match(vhost, kind, name, qtype, operator=True))

    def queue_arguments(self, q: Queue) -> dict[str, Any]:
        """THE effective settings of a queue: its arguments ⊕ policy ⊕ operator policy."""
        if q.exclusive_owner is not None and q.name.startswith("amq.rabbitmq.reply-to."):
            return q.arguments
        pol, op = self.in_force(q.vhost.name, "queue", q.name, declared_type(q.arguments))
        return effective_arguments(q.arguments, merged_definition(pol, op))

    def apply_exchange(self, vhost: str, x: Exchange) -> None:
        """THE effective settings of an exchange: its alternate exchange is its
        argument's, else its policy's; `x.policy` names the policy in force."""
        pol = self.match(vhost, "exchange", x.name) if x.name else None
        ae = as_text(x.arguments.get("alternate-exchange"))
        if ae is None and pol is not None:
            ae = as_text(pol.definition.get("alternate-exchange"))
        x.alternate = ae or None
        x.policy = pol.name if pol is not None else None

    # -- changing -----------------------------------------------------------------
    def set(self, policy: Policy, operator: bool = False) -> None:
        """Add or replace a policy (saved first), then re-apply it to its vhost."""
        self._change(policy.vhost, operator, lambda b: b.__setitem__(policy.name, policy))

    def clear(self, vhost: str, name: str, operator: bool = False) -> bool:
        """False when there is no such policy (nothing changes)."""
        if self.get(vhost, name, operator) is None:
            return False
        self._change(vhost, operator, lambda b: b.pop(name, None))
        return True

    def forget_vhost(self, vhost: str) -> None:
        """A deleted vhost's policies go with it (RabbitMQ's runtime parameters)."""
        if any(vhost in b for b in self._books.values()):
            self._save(self._snapshot(drop_vhost=vhost))
            for b in self._books.values():
                b.pop(vhost, None)

    def _change(self, vhost: str, operator: bool, edit: Callable[[dict[str, Policy]], Any]) -> None:
        book = dict(self._books[operator].get(vhost, {}))
        edit(book)
        old = self._books[operator].get(vhost)
        self._books[operator][vhost] = book
        if self._batched is not None:  # saved and re-applied once, at the batch's end
            if not book:
                self._books[operator].pop(vhost, None)
            self._batched.add(vhost)
            return
        try:
            self._save(self._snapshot())
        except BaseException:
            if old is None:
                self._books[operator].pop(vhost, None)
            else:
                self._books[operator][vhost] = old
            raise
        if not book:
            self._books[operator].pop(vhost, None)
        self.reapply(vhost)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Many changes (a definitions import): in the books at once (a queue declared
        later in the batch is made under them), saved once and re-applied once per
        vhost at the end. A failed save undoes the whole batch and raises."""
        if self._batched is not None:
            yield
            return
        before = {op: dict(b) for op, b in self._books.items()}  # books are replaced,
        self._batched = set()                                    # never edited in place
        try:
            yield
        finally:
            touched, self._batched = self._batched, None
            if touched:
                try:
                    self._save(self._snapshot())
                except BaseException:
                    self._books = before
                    raise
                for vhost in sorted(touched):
                    self.reapply(vhost)

    def _save(self, snapshot: dict[str, Any]) -> None:
        if self.save is not None:
            self.save(snapshot)

    def reapply(self, vhost: str | None = None) -> None:
        """Recompute the effective settings of every queue and exchange (of one vhost)."""
        if vhost is None and not any(self._books.values()):
            return  # at start with no policies: nothing to do
        vhosts: Iterable[VHost] = self.broker.vhosts.values() if vhost is None else \
            [v for v in (self.broker.vhosts.get(vhost),) if v is not None]
        for vh in vhosts:
            for x in list(vh.exchanges.values()):
                if x.name:
                    self.apply_exchange(vh.name, x)
            for q in list(vh.queues.values()):
                apply = getattr(q, "apply_policy", None)
                if apply is not None and not q.deleted:
                    apply()
        self.broker.request_flush()

    # -- durability -----------------------------------------------------------------
    def _snapshot(self, drop_vhost: str | None = None) -> dict[str, Any]:
        return {"policies": [p.as_json() for p in self.list() if p.vhost != drop_vhost],
                "operator_policies": [p.as_json() for p in self.list(operator=True)
                                      if p.vhost != drop_vhost]}

    def snapshot(self) -> dict[str, Any]:
        """What `save` writes: RabbitMQ's definitions layout of both kinds."""
        return self._snapshot()

    def load(self, data: dict[str, Any]) -> None:
        """Policies saved by `snapshot` (at start, before the queues are recovered)."""
        for operator, key in ((False, "policies"), (True, "operator_policies")):
            for p in data.get(key) or []:
                pol = policy_from_json(p["vhost"], p["name"], p, operator)
                self._books[operator].setdefault(pol.vhost, {})[pol.name] = pol
