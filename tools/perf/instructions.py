"""Instructions per message, counted by callgrind (noise does not move them):
`python -m tools.perf.instructions [--modes cycle transient confirm roundtrip store] [--pure]`.

- `cycle`: the model alone, in process — `ChannelModel.basic_publish` of 100 bytes, its
  delivery to a consumer and `basic_ack` (tools/perf/trace_cost.py's loop, tracer off).
- `transient`, `confirm`, `roundtrip`: the served broker (tools/perf/callgrind_publish.sh):
  transient pika publishes; persistent confirm-each publishes (each waits for its
  confirm: the lone message's path); transient publishes then a consumer acking each.
- `store`: the store alone, in process — one persistent message added and committed
  inline (written, fdatasynced, its callback run): its share of `confirm`
  (tools/perf/store_commit.py).
Each figure is (total at N − total at 0) / N, so start-up and shutdown cancel out (the
package's bytecode is written first, so nothing is compiled from source inside one run only).
`--pure` runs the pure-Python hot path (ACKMQ_PURE=1) where a compiled build is installed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from tools import ROOT, python_env
from tools.perf.callgrind import total

N = {"cycle": 20_000, "transient": 2_000, "confirm": 1_000, "roundtrip": 2_000, "store": 2_000}
CYCLE = ("import sys; from tools.perf.trace_cost import measure; "
         "n = int(sys.argv[1]); measure('off', rounds=1 if n else 0, per_round=n)")


def _total(text: str) -> int:
    n = total(text)
    if n is None:
        raise RuntimeError(f"no callgrind total in: {text[-500:]}")
    return n


def _run_in_process(mode: str, n: int, env: dict[str, str], tmp: Path) -> int:
    out = tmp / f"{mode}-{n}.cg"
    code = ["-c", CYCLE] if mode == "cycle" else ["-m", "tools.perf.store_commit"]
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                    sys.executable, *code, str(n)],
                   env={**env, "PYTHONHASHSEED": "0"}, cwd=ROOT, check=True,
                   capture_output=True, timeout=3600)
    return _total(out.read_text(errors="replace"))


def _run_served(mode: str, n: int, env: dict[str, str], tmp: Path) -> int:
    arg = "" if mode == "transient" else mode
    proc = subprocess.run(["bash", str(ROOT / "tools/perf/callgrind_publish.sh"), str(ROOT),
                           str(n), str(tmp / f"{mode}-{n}"), arg],
                          env={**env, "PYTHON": sys.executable}, cwd=ROOT, check=True,
                          capture_output=True, text=True, timeout=3600)
    return _total(proc.stdout)


def measure(mode: str, n: int, pure: bool) -> float:
    env = python_env()
    if pure:
        env["ACKMQ_PURE"] = "1"
    run = _run_in_process if mode in ("cycle", "store") else _run_served
    with tempfile.TemporaryDirectory(prefix="ackmq-instr-") as d:
        return (run(mode, n, env, Path(d)) - run(mode, 0, env, Path(d))) / n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", nargs="+", choices=list(N), default=list(N))
    p.add_argument("--pure", action="store_true", help="ACKMQ_PURE=1: the pure-Python hot path")
    p.add_argument("--scale", type=float, default=1.0, help="multiply each mode's N")
    a = p.parse_args(argv)
    # bytecode written first: with PYTHONDONTWRITEBYTECODE a module imported lazily by the
    # first message would be parsed and compiled inside the measured run only
    import compileall
    compileall.compile_dir(str(ROOT / "ackmq"), quiet=1)
    from ackmq import native
    mode_, why = native.mode()
    build = "pure (ACKMQ_PURE=1)" if a.pure else f"{mode_} ({why})"
    print(f"hot path: {build}", flush=True)
    for mode in a.modes:
        n = max(1, int(N[mode] * a.scale))
        print(f"{mode}: measuring {n} messages and 0 under callgrind …", file=sys.stderr, flush=True)
        print(f"{mode:10} {measure(mode, n, a.pure):>10,.0f} instructions per message (N={n})",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
