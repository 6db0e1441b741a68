"""Run the Eclipse Paho MQTT interoperability suites (eclipse/paho.mqtt.testing,
`interoperability/client_test.py` for 3.1.1, `client_test5.py` for 5.0) from a checkout
you give against one broker, and print one line per test (ok / FAIL / ERROR) and the
totals. Nothing is fetched and nothing of the suites is kept here (docs/mqtt.md has the
side-by-side results for ackmq, Mosquitto and RabbitMQ).

    python -m tools.perf.paho_interop CHECKOUT/interoperability --suite 5 --port 1883

The suites parse their own options and then call `unittest.main()` on sys.argv, which
their options confuse (`-h` is taken for `--help`): this runs the script as `__main__`
with `--hostname/--port` only and gives unittest an argv of its own."""

from __future__ import annotations

import argparse
import os
import runpy
import socket
import sys
import unittest
from typing import Any

SUITES = {"3.1.1": "client_test.py", "5": "client_test5.py"}


def run(checkout: str, suite: str, host: str, port: int, tests: list[str],
        min_timeout: float = 0.0) -> int:
    """The suite's tests (or those named) against host:port; returns failures+errors.
    `min_timeout`: the suites' clients wait 0.5 s for a CONNACK, which a loaded machine
    misses; a socket timeout below this is raised to it."""
    if min_timeout:
        real_settimeout = socket.socket.settimeout

        def settimeout(sock: socket.socket, t: float | None) -> None:
            real_settimeout(sock, t if t is None else max(t, min_timeout))

        socket.socket.settimeout = settimeout  # type: ignore[method-assign]
    script = os.path.join(checkout, SUITES[suite])
    sys.path.insert(0, checkout)  # the suites import their own `mqtt` package
    result: list[unittest.TestResult] = []
    real_main = unittest.main

    def main(*args: Any, **kwargs: Any) -> unittest.TestProgram:
        kwargs.update(argv=["paho", "-v", *tests], exit=False)
        program = real_main(*args, **kwargs)
        result.append(program.result)
        return program

    unittest.main = main  # type: ignore[assignment,misc]
    sys.argv = [script, "--hostname", host, "--port", str(port)]
    os.chdir(checkout)
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        unittest.main = real_main  # type: ignore[misc]
    r = result[0]
    print(f"\n{SUITES[suite]} against {host}:{port}: {r.testsRun} run, "
          f"{r.testsRun - len(r.failures) - len(r.errors)} passed, "
          f"{len(r.failures)} failed, {len(r.errors)} errors")
    for case, _ in r.failures:
        print("FAIL", case.id())
    for case, _ in r.errors:
        print("ERROR", case.id())
    return len(r.failures) + len(r.errors)


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkout", help="a paho.mqtt.testing checkout's interoperability/ dir")
    p.add_argument("--suite", choices=sorted(SUITES), default="3.1.1")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=1883)
    p.add_argument("--min-timeout", type=float, default=0.0,
                   help="raise the suites' socket timeouts (0.5 s) to this, on a loaded machine")
    p.add_argument("tests", nargs="*", help="only these (Test.test_name)")
    a = p.parse_args()
    sys.exit(1 if run(os.path.abspath(a.checkout), a.suite, a.host, a.port, a.tests,
                         a.min_timeout) else 0)


if __name__ == "__main__":
    cli()
