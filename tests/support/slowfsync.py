"""os.fdatasync (the store's durability call) slowed down, recording when each call
ended: a test can then show an answer went out only after the fsync it waited for."""

from __future__ import annotations

import os
import threading
import time


class SlowFsync:
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.real = os.fdatasync
        self.done: list[float] = []
        self.lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        time.sleep(self.delay)
        self.real(fd)
        with self.lock:
            self.done.append(time.monotonic())
