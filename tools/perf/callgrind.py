"""What the callgrind measures in tools/perf share: a free port, a run's total from a
callgrind output, and zeroing / dumping a running process's counters."""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
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
