"""Messages held back from a queue's consumers until the commit that makes them durable.

An MQTT QoS 2 publish (SPEC N3) must not reach a consumer before its store batch is
fdatasynced: a power cut would undo the message and its packet id, the client would
resend it, and a consumer that took the first copy would get a second one (docs/mqtt.md,
"QoS 2 across a power cut"). Such a publish asks its durable queues to `hold`: from
then on the queue's new entries wait here, in publish order, and each batch goes to the
ready list once the commit it was written in is durable (and every batch before it has
gone, so the queue's order is kept). Entries published after a hold in the same queue
wait behind it (for at most that commit), so the ready list stays in seq order.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ackmq.broker.queue_type import QueueEntry


class HeldBatch:
    """The entries one commit makes durable (those published from one `hold` until the
    next)."""

    __slots__ = ("entries", "durable")

    def __init__(self) -> None:
        self.entries: list[QueueEntry] = []
        self.durable = False


class Holding:
    """A queue's held entries: batches in publish order."""

    __slots__ = ("batches",)

    def __init__(self) -> None:
        self.batches: deque[HeldBatch] = deque()

    def start(self) -> HeldBatch:
        """A new batch: what the queue takes from now on waits for the caller's commit."""
        b = HeldBatch()
        self.batches.append(b)
        return b

    def add(self, entry: QueueEntry) -> None:
        self.batches[-1].entries.append(entry)

    def durable(self, batch: HeldBatch) -> list[QueueEntry]:
        """`batch`'s commit is durable: the entries that may go to consumers now, in
        order (none while an earlier batch still waits)."""
        batch.durable = True
        out: list[QueueEntry] = []
        batches = self.batches
        while batches and batches[0].durable:
            out.extend(batches.popleft().entries)
        return out

    def take_all(self) -> list[QueueEntry]:
        """Every held entry, taken out (purge); the batches stay to meet their commits."""
        out: list[QueueEntry] = []
        for b in self.batches:
            out.extend(b.entries)
            b.entries = []
        return out

    def __bool__(self) -> bool:
        return bool(self.batches)

    def __len__(self) -> int:
        return sum(len(b.entries) for b in self.batches)
