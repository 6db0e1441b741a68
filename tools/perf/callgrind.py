"""What the callgrind measures in tools/perf share: a free port, a run's total from a
callgrind output, the broker started and stopped under valgrind, and zeroing / dumping
a running process's counters."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def total(text: str) -> int | None:
    """The total instructions in a callgrind output (or callgrind_annotate's), if any."""
    m = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
    return int(m.group(1)) if m else None


def zero(pid: int) -> None:
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)


def dump(pid: int, out: str, label: str) -> int:
    """Dump the counters since the last zeroing; the phase's total instructions."""
    before = set(Path(out).parent.glob(Path(out).name + ".*"))
    subprocess.run(["callgrind_control", "-d", label, str(pid)], check=True,
                   capture_output=True)
    for _ in range(600):
        for f in set(Path(out).parent.glob(Path(out).name + ".*")) - before:
            n = total(f.read_text(errors="replace"))
            if n is not None:
                return n
        time.sleep(0.5)
    raise RuntimeError("callgrind did not dump")


def start(work: Path, out: str, serve_args: list[str]
          ) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
    """`python -m ackmq serve SERVE_ARGS --data-dir WORK/data` under callgrind (counters to
    `out`), its output in WORK/broker.log; returns once it listens (valgrind is slow)."""
    log = open(work / "broker.log", "wb")  # noqa: SIM115 - handed to the child; stop() closes
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
         sys.executable, "-m", "ackmq", "serve", *serve_args, "--data-dir", str(work / "data")],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONHASHSEED": "0"})
    for _ in range(1200):
        if b"listening on" in (work / "broker.log").read_bytes():
            break
        time.sleep(0.5)
    return proc, log


def stop(proc: subprocess.Popen[bytes], log: IO[bytes], data_dir: Path) -> None:
    """Stop the broker under valgrind (SIGINT: callgrind writes its last dump), close its
    log, drop its data."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
    shutil.rmtree(data_dir, ignore_errors=True)
