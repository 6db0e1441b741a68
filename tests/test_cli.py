"""The `ackmq` command: `serve` loads the broker and nothing else, a subcommand whose
dependency is missing says what to install, and a bad --data-dir is named as such."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

# what `ackmq serve` must not pay for at start (the bench's and Spark's dependencies)
NOT_FOR_SERVE = ("pika", "aio_pika", "psutil", "pyarrow", "pyspark", "matplotlib",
                 "ackmq.bench", "ackmq.spark", "ackmq.client")


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)


def test_serve_help_loads_no_bench_spark_or_client_modules() -> None:
    r = run_python("import sys, json, contextlib, io\n"
                   "import ackmq.cli\n"
                   "with contextlib.redirect_stdout(io.StringIO()):\n"
                   "    try:\n"
                   "        ackmq.cli.main(['serve', '--help'])\n"
                   "    except SystemExit:\n"
                   "        pass\n"
                   "print(json.dumps(sorted(sys.modules)))")
    assert r.returncode == 0, r.stderr
    mods = json.loads(r.stdout.splitlines()[-1])
    assert "ackmq.server.config" in mods  # the serve options were built
    loaded = [m for m in mods if m.split(".")[0] in NOT_FOR_SERVE or m.startswith(
        tuple(n + "." for n in NOT_FOR_SERVE)) or m in NOT_FOR_SERVE]
    assert loaded == []


def test_subcommand_with_a_missing_dependency_names_the_extra_to_install() -> None:
    """pyspark made unimportable: `ackmq pipeline` says so (it used to vanish from the
    command line as an unknown subcommand)."""
    r = run_python("import sys\n"
                   "sys.modules['pyspark'] = None\n"
                   "from ackmq.cli import main\n"
                   "sys.exit(main(['pipeline', '--help']))")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "'pyspark' is missing" in r.stderr and "pip install 'ackmq[spark]'" in r.stderr
    assert "Traceback" not in r.stderr


def test_data_dir_that_is_a_file_is_named_as_the_problem(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "data"
    not_a_dir.write_text("a file, not a directory")
    r = subprocess.run([sys.executable, "-m", "ackmq", "serve", "--port", "0", "--no-stomp",
                        "--data-dir", str(not_a_dir)], capture_output=True, text=True,
                       timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode == 3, out
    assert f"data directory {not_a_dir}" in out and "not a directory" in out
    assert "cannot listen" not in out and "Traceback" not in out


REPO = Path(__file__).resolve().parents[1]


def _checkout(tmp_path: Path) -> Path:
    """A checkout whose .venv is already set up: `run` and pyproject.toml copied, the
    venv's python and `ackmq` pointing at this interpreter and this tree's package, the
    install stamp current — so ./run installs nothing (the shared venv stays as it is)."""
    co = tmp_path / "checkout"
    (co / ".venv" / "bin").mkdir(parents=True)
    for name in ("run", "pyproject.toml", "setup.py"):
        (co / name).write_bytes((REPO / name).read_bytes())
    (co / "run").chmod(0o755)
    (co / "ackmq").symlink_to(REPO / "ackmq")  # the compiled modules' sources, in the stamp
    (co / ".venv" / "bin" / "python").symlink_to(sys.executable)
    ackmq = co / ".venv" / "bin" / "ackmq"
    ackmq.write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m ackmq "$@"\n')
    ackmq.chmod(0o755)
    from ackmq.native_modules import NATIVE  # what ./run's stamp covers, in its order
    sources = ["pyproject.toml", "setup.py", *(m.replace(".", "/") + ".py" for m in NATIVE)]
    digest = hashlib.sha1(b"".join((co / f).read_bytes() for f in sources)).hexdigest()
    (co / ".venv" / ".ackmq-stamp-server").write_text(digest + "\n")
    return co


def test_run_ctl_and_serve_resolve_relative_paths_where_the_user_stands(tmp_path: Path) -> None:
    """The README's `ackmq ctl` through `./run ctl`; `./run` changes to the checkout for
    its set-up, but serve's --data-dir and ctl's --data-dir and export/import files are
    the user's: relative to the directory `./run` was started from."""
    run = _checkout(tmp_path) / "run"
    user = tmp_path / "user"
    user.mkdir()
    serve = subprocess.Popen([str(run), "serve", "--port", "0", "--no-stomp", "--no-http",
                              "--data-dir", "data"], cwd=user, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        assert serve.stdout is not None
        seen = []
        for line in serve.stdout:
            seen.append(line)
            if "amqp://" in line:
                break
        else:
            raise AssertionError("".join(seen))
        assert (user / "data").is_dir(), seen
        assert not (run.parent / "data").exists()

        def ctl(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([str(run), "ctl", "--data-dir", "data", *args], cwd=user,
                                  capture_output=True, text=True, timeout=120)

        r = ctl("add_vhost", "relative-paths")
        assert r.returncode == 0, r.stdout + r.stderr
        r = ctl("export_definitions", "out.json")
        assert r.returncode == 0, r.stdout + r.stderr
        defs = json.loads((user / "out.json").read_text())
        assert "relative-paths" in {v["name"] for v in defs["vhosts"]}
        r = ctl("delete_vhost", "relative-paths")
        assert r.returncode == 0, r.stdout + r.stderr
        r = ctl("import_definitions", "out.json")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "relative-paths" in ctl("list_vhosts").stdout
    finally:
        serve.terminate()
        serve.wait(30)
