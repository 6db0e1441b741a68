"""One warmed-up JVM class path for every Spark driver the suite starts.

A Spark driver's JVM spends most of its start loading and verifying classes from
PySpark's jars; the suite starts dozens of drivers (every kill test needs a fresh
one). A class-data-sharing archive (JDK 13+ `-XX:ArchiveClassesAtExit`) of one small
local job, dumped once and cached, lets every later driver map those classes instead:
a driver start plus its first job took 41-46 s without it and 22-25 s with it at load
16 on the 2-core machine (docs/robustness.md, "The suite's time").

The archive is used through `$ACKMQ_SPARK_JAVA_OPTIONS` (the product's own hook for
the driver's JVM flags), so drivers started by `pipeline land`, the tests' in-process
sessions and their subprocesses all get it. The JVM checks the archive against the
class path it runs with (same jars, sizes and times, the same Spark conf directory
first): a driver with another `SPARK_CONF_DIR` (the standalone cluster's, an SDP
project's) silently runs without it, as does any JVM if the jars changed. Nothing is
done when no test marked `spark` was collected, when Java or PySpark are missing, or
when `$ACKMQ_SPARK_JAVA_OPTIONS` is already set (the caller's flags win).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

#: where the archive is kept between runs (the JVM refuses a stale one by itself)
CACHE = Path(os.environ.get("ACKMQ_TEST_CACHE", "/var/tmp/ackmq-test-cache"))
#: the warnings of a dump (signed jars, old class versions skipped) and of a driver that
#: cannot use the archive (another class path) would reach the drivers' output
QUIET = "-Xlog:cds=off,cds+dynamic=off"

#: the job whose classes are archived: a session, a shuffle, a Parquet write and read
DUMP_JOB = """\
import sys
from ackmq.spark.pipeline import spark_session
s = spark_session("ackmq-tests-cds")
s.range(1000).repartition(2).write.parquet(sys.argv[1])
assert s.read.parquet(sys.argv[1]).count() == 1000
s.stop()
"""


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(java) if java and os.path.exists(java) else None


def archive_path(java: str) -> Path | None:
    """The cache file for this JVM and this PySpark (None without PySpark)."""
    try:
        import pyspark
    except ImportError:
        return None
    jars = Path(pyspark.__file__).parent / "jars"
    key = "\0".join([java, str(os.stat(java).st_mtime_ns), str(jars), pyspark.__version__,
                     *(f"{p.name}:{p.stat().st_size}" for p in sorted(jars.glob("*.jar")))])
    return CACHE / f"spark-{hashlib.sha1(key.encode()).hexdigest()[:16]}.jsa"


def dump(path: Path, java_options: str) -> None:
    """Run DUMP_JOB in a driver that writes its loaded classes to `path` at exit."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    work = path.with_name(f"dump-{os.getpid()}")
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONF_DIR"}
    env["ACKMQ_SPARK_JAVA_OPTIONS"] = f"{java_options} -XX:ArchiveClassesAtExit={tmp} {QUIET}"
    try:
        subprocess.run([sys.executable, "-c", DUMP_JOB, str(work / "t")], env=env,
                       capture_output=True, timeout=600, check=False)
        if tmp.exists() and tmp.stat().st_size > 0:
            os.replace(tmp, path)  # atomic: another session may be reading the last one
    except subprocess.TimeoutExpired:
        pass
    finally:
        tmp.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def spark_class_archive(request: pytest.FixtureRequest) -> Iterator[Path | None]:
    """The archive every Spark driver of this session maps (None: not used)."""
    java = _java()
    wanted = any(item.get_closest_marker("spark") for item in request.session.items)
    path = archive_path(java) if java and wanted else None
    if path is None or "ACKMQ_SPARK_JAVA_OPTIONS" in os.environ:
        yield None
        return
    from ackmq.spark.pipeline import JAVA_OPTIONS

    if not path.exists():
        # one dump per machine: both Spark lanes' workers start here at once on a fresh
        # machine (CI), and the second would dump the same archive again (a driver's CPU)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(f"{path.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.exists():
                dump(path, JAVA_OPTIONS)
    if not path.exists():  # the dump failed: the drivers start as before
        yield None
        return
    os.environ["ACKMQ_SPARK_JAVA_OPTIONS"] = f"{JAVA_OPTIONS} -XX:SharedArchiveFile={path} {QUIET}"
    try:
        yield path
    finally:
        os.environ.pop("ACKMQ_SPARK_JAVA_OPTIONS", None)
