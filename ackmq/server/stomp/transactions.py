"""STOMP transactions (W8): BEGIN, COMMIT and ABORT of named transactions, kept here
and replayed at COMMIT (the model's one-per-channel transaction is not used), and the
receipts owed once a SEND's, or a COMMIT's, publishes are confirmed (W7)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ackmq.protocol.stomp import Frame
from ackmq.server.stomp.refusal import Refused, quoted


class Receipt:
    """A receipt owed once `remaining` publishes are confirmed (one SEND, or a COMMIT's)."""

    __slots__ = ("id", "remaining", "what")

    def __init__(self, receipt_id: str | None, what: str) -> None:
        self.id = receipt_id
        self.remaining = 0
        self.what = what  # for the ERROR text when a publish is refused


class Transactions:
    """The transaction frames of `StompConnection` (a part of it, kept apart)."""

    txs: dict[str, list[tuple[Any, ...]]]
    _send: Callable[..., None]
    _settle: Callable[..., None]
    _write_receipt: Callable[[str], None]

    def _tx_name(self, f: Frame) -> str:
        tx = f.headers.get("transaction")
        if tx is None:
            raise Refused("Missing transaction",
                           f"{quoted(f.command)} must include a 'transaction' header\n")
        return tx

    def _tx(self, name: str) -> list[tuple[Any, ...]]:
        actions = self.txs.get(name)
        if actions is None:
            raise Refused("Bad transaction", f"Invalid transaction identifier: {quoted(name)}\n")
        return actions

    def _on_begin(self, f: Frame) -> None:
        name = self._tx_name(f)
        if name in self.txs:
            raise Refused("Bad transaction", f"Transaction {quoted(name)} is already open\n")
        self.txs[name] = []

    def _on_commit(self, f: Frame) -> None:
        name = self._tx_name(f)
        actions = self._tx(name)
        del self.txs[name]
        receipt = f.headers.get("receipt")
        group = Receipt(receipt, f"COMMIT of {quoted(name)}") if receipt is not None else None
        for action in actions:
            if action[0] == "send":
                _kind, frame, text, dest = action
                self._send(frame, text, dest, frame.headers.get("receipt"), group)
            else:
                self._settle(*action)
        if receipt is not None and group is not None and group.remaining == 0:
            self._write_receipt(receipt)

    def _on_abort(self, f: Frame) -> None:
        name = self._tx_name(f)
        self._tx(name)
        del self.txs[name]  # sends dropped, acks never made: those deliveries stay unacked
