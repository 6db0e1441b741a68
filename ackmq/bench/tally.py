"""Bodies that carry their sequence number, and the tally that checks each of n arrived
exactly once: a broker that drops or duplicates fails the run instead of winning it
(the STOMP and MQTT workloads)."""

from __future__ import annotations

SEQ_DIGITS = 10      # the body's sequence-number prefix


def seq_body(i: int, size: int) -> bytes:
    head = b"%0*d" % (SEQ_DIGITS, i)
    return head + b"x" * max(0, size - len(head))


class Tally:
    """Which of n sequence numbers arrived, and how often: once each, or the run fails."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.seen = bytearray(n)
        self.got = 0
        self.duplicates = 0
        self.strangers = 0

    def add(self, body: bytes) -> None:
        try:
            i = int(body[:SEQ_DIGITS])
        except ValueError:
            self.strangers += 1
            return
        if not 0 <= i < self.n:
            self.strangers += 1
        elif self.seen[i]:
            self.duplicates += 1
        else:
            self.seen[i] = 1
            self.got += 1

    def check(self, what: str) -> None:
        if self.got != self.n or self.duplicates or self.strangers:
            raise RuntimeError(f"{what}: {self.got:,} of {self.n:,} messages received, "
                               f"{self.duplicates} duplicates, {self.strangers} unexpected")
