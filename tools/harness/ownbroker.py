"""An `ackmq serve` of a run's own, with its whole log in a file (the hostile-input runs
check that log for tracebacks and kill -9 the broker to check durability)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


class OwnBroker:
    """`python -m ackmq serve` in a fresh data dir, its whole log in a file."""

    def __init__(self, extra: list[str], work_dir: Path | None = None,
                 stomp: bool = False, mqtt: bool = False) -> None:
        """Data dir and log in `work_dir` (kept), else in a new directory under /var/tmp
        (not tmpfs: fsync must cost what it costs) whose data dir `stop` removes."""
        base = "/var/tmp" if os.path.isdir("/var/tmp") else None
        self.owned = work_dir is None
        work = work_dir or Path(tempfile.mkdtemp(prefix="ackmq-fuzz-", dir=base))
        work.mkdir(parents=True, exist_ok=True)
        self.data_dir = work / "data"
        self.log_path = work / "broker.log"
        self.extra = extra
        self.stomp = stomp  # False: --no-stomp (the AMQP-only runs)
        self.mqtt = mqtt  # False: --no-mqtt
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.port = 0

    def start(self, timeout: float = 60.0) -> str:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        offset = self.log_path.stat().st_size
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ackmq", "serve", "--port", str(self.port),
             *([] if self.stomp else ["--no-stomp"]), *([] if self.mqtt else ["--no-mqtt"]),
             "--http-port", "0",
             *([] if "--stream-port" in self.extra else ["--no-stream"]),
             "--data-dir", str(self.data_dir), *self.extra],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_path.read_bytes()[offset:].decode(errors="replace")
            m = re.search(r"listening on (amqp://\S+)", text)
            if m:
                self.url = m.group(1)
                self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])
                return self.url
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"ackmq did not start; see {self.log_path}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def terminate(self) -> None:
        """SIGTERM (a clean stop), the data dir kept for the next start."""
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()
            self.proc.wait(120)

    def stop(self, keep_log: bool = False) -> None:
        """Stop it; a work dir of our own goes too (all but the log with `keep_log`)."""
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.owned:
            shutil.rmtree(self.data_dir if keep_log else self.data_dir.parent,
                          ignore_errors=True)
            if keep_log:
                print(f"broker log kept: {self.log_path}", file=sys.stderr)


LOG_TROUBLE = re.compile(r"Traceback|Fatal error|Exception in callback|end of turn failed"
                         r"|Task exception was never retrieved|Unhandled exception"
                         r"|admin request failed")


def log_trouble(path: Path | None) -> list[str]:
    """Lines of a broker log that show an unhandled exception."""
    if path is None or not path.exists():
        return []
    with open(path, errors="replace") as f:
        return [line.rstrip() for line in f if LOG_TROUBLE.search(line)]
