"""The step protocol: how one body of client behaviour runs under two I/O models.

Sessions, consumers, producers and the shared connection (session.py, consumer.py,
producer.py, connection.py) never do I/O and never block. Everything of theirs that has
to wait is a generator — a *step* generator, named with a `_g` suffix — that yields what
it waits for and lets a *driver* do the waiting:

- `yield (future, deadline)`: wait for a future of the core (a reply, a confirm, a
  delivery). `deadline` is a `time.monotonic()` time, or None for no deadline; a None
  future just waits until the deadline. The driver sends back the future's result, or
  throws its exception, or throws `TimeoutError` at the deadline.
- `yield (OP, argument)`, OP one of the sentinels below: ask the driver for I/O that is
  not a future — reconnect, open a socket, sleep, call a listener, wait for listener work.
  What that raises (a `ClientError`, or a listener's exception for CALL) is thrown back in.

`yield from` composes steps, so one operation (commit, send with confirm, recover) reads
as straight-line code (simplified from session.commit_g):

    def commit_g(self, deadline):
        self.check_tx()
        yield from wait(self.chan.rpc(C.Tx.Commit(), (C.Tx.CommitOk,)), deadline)
        self.tx_consumed.clear()

The two drivers run the same generators. The sync one (`sync.Connection._drive`) runs
each step under the connection's lock and waits by reading the socket in the calling
thread (or waiting on the thread that does); the asyncio one (`aio.AsyncConnection._drive`)
awaits the future or the I/O. So the client's state is only touched between yields — under
the sync connection's lock, or in one event-loop turn — and a behaviour (J1–J10) is written
and tested once.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any

Step = Generator[tuple[Any, Any], Any, Any]
"""A step generator: yields `(future | OP | None, deadline | argument)`, returns a result.
The second element is a deadline (float | None) for a future, the OP's argument
otherwise (CALL's is `(fn, message)`), so it is not one type."""

# Steps that ask the driver for I/O instead of a future, `(OP, argument)`. They are bare
# object() sentinels: a driver tells them from futures by `type(x) is object`.
RECONNECT = object()  # ensure the connection (reconnect if lost and allowed); arg unused
OPEN = object()       # open a new socket + AMQP handshake; arg unused
SLEEP = object()      # pause; arg: the monotonic time to wake up (no socket reads)
CALL = object()       # call a listener: arg (fn, message); a coroutine's result is awaited;
                      # what it raises is thrown back into the generator
IDLE = object()       # wait until a listener consumer may have work, or arg (a deadline)


def deadline_in(seconds: float | None) -> float | None:
    """The monotonic deadline `seconds` from now (None: no deadline)."""
    return None if seconds is None else time.monotonic() + seconds


def wait(fut: Any, deadline: float | None) -> Step:
    """Wait for one future; its result, or its exception raised here."""
    return (yield (fut, deadline))


def sleep_until(until: float) -> Step:
    """Pause until a monotonic time, reading the socket meanwhile (unlike SLEEP)."""
    try:
        yield (None, until)
    except TimeoutError:
        pass
