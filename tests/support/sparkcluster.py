"""A Spark standalone cluster for the tests (S6): a master and two workers started from
PySpark's own `spark-class`, each worker in a private /tmp (a mount namespace), so a
file one process writes under its temp dir is invisible to the others, as on separate
hosts. Everything the processes must share (lake, checkpoint) lives under `shared`,
outside /tmp. A checkout (its .venv, PySpark, the working directory) that lives under
/tmp is bound back into each worker's private /tmp (`keep_under_tmp`). Root and
`unshare` are needed; without them the fixture skips, saying so.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

UNSHARE = ("unshare", "-m", "--propagation", "private")
#: the daemons are small on a shared 2-core machine; executors get 512 MiB each
DAEMON_MEMORY = "256m"
WORKER_MEMORY = "900m"
DEFAULTS = {
    "spark.executor.memory": "512m",
    "spark.executor.cores": "1",
    "spark.cores.max": "2",
    "spark.task.maxFailures": "4",
    "spark.ui.enabled": "false",
    # a killed worker's tasks rerun elsewhere soon, not after the default 60 s
    "spark.network.timeout": "30s",
    "spark.network.timeoutInterval": "10s",
    "spark.executor.heartbeatInterval": "5s",
    # the workers share a host name but not /tmp: fetch shuffle blocks over the network as
    # from another host, not from the (invisible) local disk of the other executor
    "spark.shuffle.readHostLocalDisk": "false",
    "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


def keep_under_tmp() -> list[str]:
    """The entries of /tmp a worker must still see: those holding this checkout, the
    Python running the tests (its venv), PySpark and the working directory. Empty when
    all of them live elsewhere."""
    here = Path(__file__).resolve().parents[2]
    paths = [here, Path(sys.prefix), Path(sys.executable).parent, Path(spark_home()),
             Path.cwd()]
    keep = set()
    for p in paths:
        for q in {p, p.resolve()}:
            if q.is_relative_to("/tmp") and q != Path("/tmp"):
                keep.add(q.relative_to("/tmp").parts[0])
    return sorted(keep)


def private_tmp_command(cmd: list[str]) -> list[str]:
    """`cmd` in a new mount namespace with an empty tmpfs on /tmp, the entries of
    `keep_under_tmp()` bound back from the host's /tmp (reached through the shell's
    working directory, taken before the tmpfs hides it), then run from the caller's
    working directory."""
    steps = ["cd /tmp", "mount -t tmpfs tmpfs /tmp"]
    for name in keep_under_tmp():
        q = shlex.quote(name)
        steps.append(f"mkdir /tmp/{q} && mount --no-canonicalize --rbind ./{q} /tmp/{q}")
    steps += [f"cd {shlex.quote(os.getcwd())}", "exec " + shlex.join(cmd)]
    return [*UNSHARE, "sh", "-c", " && ".join(steps)]


def private_tmp_unavailable() -> str | None:
    """Why workers cannot get a private /tmp here, or None."""
    if shutil.which("unshare") is None:
        return "no unshare(1) on PATH"
    r = subprocess.run([*UNSHARE, "sh", "-c", "mount -t tmpfs tmpfs /tmp && test ! -e /tmp/.x"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return f"unshare -m / mount tmpfs failed (need root): {r.stderr.strip()[:200]}"
    return None


class SparkCluster:
    """`spark://127.0.0.1:<port>` with two one-core workers; `kill_worker(i)` SIGKILLs a
    worker with its executor and Python workers, `start_worker(i)` brings it back."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.shared = base / "shared"  # lake, checkpoints: what every host must see
        self.shared.mkdir(parents=True, exist_ok=True)
        self.conf = base / "conf"
        self.conf.mkdir(exist_ok=True)
        self.port = _free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        (self.conf / "spark-defaults.conf").write_text(
            "".join(f"{k} {v}\n" for k, v in DEFAULTS.items()))
        # a driver started with this environment (SPARK_CONF_DIR) gets the defaults above
        self.env = dict(os.environ, SPARK_HOME=spark_home(), SPARK_CONF_DIR=str(self.conf),
                        SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1",
                        SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
                        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
                        PYSPARK_PYTHON=sys.executable)

    @property
    def driver_env(self) -> dict[str, str]:
        """The environment of a driver on this cluster: `env`, but when the suite's
        class-data archive is in use (support/sparkjvm.py) the defaults above go as
        `--conf`s (PYSPARK_SUBMIT_ARGS) instead of SPARK_CONF_DIR, whose directory at the
        head of the class path makes the JVM refuse the archive: the driver then starts
        as fast as a local one. JDK_JAVA_OPTIONS carries the archive to a driver whose
        script builds its own session (support/cluster_direct.py)."""
        java_options = self.env.get("ACKMQ_SPARK_JAVA_OPTIONS", "")
        if "SharedArchiveFile" not in java_options:
            return dict(self.env)
        env = {k: v for k, v in self.env.items() if k != "SPARK_CONF_DIR"}
        env["PYSPARK_SUBMIT_ARGS"] = " ".join(
            f"--conf {shlex.quote(f'{k}={v}')}" for k, v in DEFAULTS.items()) + " pyspark-shell"
        env["JDK_JAVA_OPTIONS"] = java_options
        return env

    def _spawn(self, name: str, argv: list[str], private_tmp: bool) -> None:
        cmd = [os.path.join(spark_home(), "bin", "spark-class"), *argv]
        if private_tmp:
            cmd = private_tmp_command(cmd)
        log = open(self.base / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                            env=self.env, start_new_session=True)
        log.close()

    def start(self, timeout: float = 180.0) -> None:
        self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(self.port), "--webui-port", str(_free_port())],
                    private_tmp=False)
        for i in (1, 2):
            self.start_worker(i, wait=False)
        self.wait_workers(2, timeout)

    def start_worker(self, i: int, wait: bool = True) -> None:
        work = self.base / f"worker{i}"
        work.mkdir(exist_ok=True)
        self._spawn(f"worker{i}", ["org.apache.spark.deploy.worker.Worker", "--host",
                                   "127.0.0.1", "--cores", "1", "--memory", WORKER_MEMORY,
                                   "--webui-port", str(_free_port()), "--work-dir", str(work),
                                   self.url], private_tmp=True)
        if wait:
            self.wait_workers(self.registrations() + 1, 120.0)

    def registrations(self) -> int:
        log = self.base / "master.log"
        return log.read_text(errors="replace").count("Registering worker") if log.exists() else 0

    def wait_workers(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.registrations() < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Spark cluster: {self.registrations()} of {n} workers "
                                   f"registered; see {self.base}/*.log")
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"Spark {name} exited ({p.returncode}); "
                                       f"see {self.base}/{name}.log")
            time.sleep(0.5)

    def worker_pids(self, i: int) -> list[int]:
        """The worker's process group: its JVM, executors and their Python workers."""
        p = self.procs.get(f"worker{i}")
        if p is None or p.poll() is not None:
            return []
        out = subprocess.run(["pgrep", "-g", str(p.pid)], capture_output=True, text=True)
        return [int(x) for x in out.stdout.split()]

    def kill_worker(self, i: int) -> None:
        p = self.procs.pop(f"worker{i}", None)
        if p is None:
            return
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(30)

    def stop(self) -> None:
        for name in sorted(self.procs, reverse=True):  # workers first, then the master
            p = self.procs[name]
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(30)
        self.procs.clear()


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[SparkCluster]:
    why = private_tmp_unavailable()
    if why:
        pytest.skip(f"Spark cluster tests need private /tmp per worker: {why}")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java (no java on PATH, no JAVA_HOME)")
    # not under /tmp: every worker mounts its own empty /tmp over it
    base = Path(tempfile.mkdtemp(prefix="ackmq-spark-cluster-", dir="/var/tmp"))
    cluster = SparkCluster(base)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        if not os.environ.get("ACKMQ_KEEP_CLUSTER"):
            shutil.rmtree(base, ignore_errors=True)
