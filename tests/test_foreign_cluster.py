"""`ray job submit` to a Ray cluster started from another virtualenv than the project's (Ray 2.60.0 and its own
dependencies, none of the job's others): the job ends in the preflight's one line (pipeline/preflight.py) naming
what is missing and the runtime_env that provides it, not in a ModuleNotFoundError traceback. The cluster is a real
`ray start --head`, on its own ports and temp dir, stopped with its own process group (never `ray stop`, which would
stop every Ray on the machine)."""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import ROOT, stop_ray_node

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def foreign_venv(tmp_path_factory):
    """A virtualenv with only ray[default] installed (from the package index `make setup` uses)."""
    venv = tmp_path_factory.mktemp("foreign") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "ray[default]==2.60.0"], capture_output=True,
                         text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr[-2000:]
    return venv


@pytest.fixture
def foreign_cluster(foreign_venv):
    """A head node of the foreign virtualenv's Ray (`ray start --block`); yields its dashboard address. Its temp dir
    is short: Ray's socket paths under it must fit a Unix socket's 107 characters."""
    dash = free_port()
    temp = tempfile.mkdtemp(prefix="rayf", dir="/tmp")
    env = dict(os.environ, PATH=f"{foreign_venv / 'bin'}:{os.environ['PATH']}", RAY_AUTH_MODE="disabled")
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    cmd = [str(foreign_venv / "bin" / "ray"), "start", "--head", "--block", "--num-cpus", "1",
           "--port", str(free_port()), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash),
           "--ray-client-server-port", str(free_port()), "--temp-dir", temp,
           "--disable-usage-stats"]
    log = open(os.path.join(temp, "start.log"), "w")
    head = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", dash), timeout=1).close()
                break
            except OSError:
                assert head.poll() is None, open(log.name).read()[-3000:]
                time.sleep(1)
        else:
            pytest.fail("the foreign cluster's dashboard never answered")
        yield address, env
    finally:
        stop_ray_node(head, temp)  # every process of this cluster names its temp dir; none of another Ray's does
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def test_a_cluster_without_the_job_packages_gets_the_one_line(foreign_cluster, foreign_venv, tmp_path):
    address, env = foreign_cluster
    submit = subprocess.run(
        [str(foreign_venv / "bin" / "ray"), "job", "submit", "--address", address, "--working-dir", str(ROOT), "--",
         "python", "jobs/parse_corpus.py", "--input", "samples", "--output", str(tmp_path / "out")],
        env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    logs = submit.stdout + submit.stderr
    assert submit.returncode != 0, logs[-3000:]
    assert "failed" in logs.lower(), logs[-3000:]
    # the driver's stderr, which Ray prints as it streams the logs and again in the failure's last lines
    [line] = {ln.strip() for ln in logs.splitlines() if "lacks the job's packages" in ln}
    assert line.startswith("Error: this Python") and "/bin/python" in line, line
    assert "--runtime-env configs/runtime_env.yaml" in line and "pyarrow" in line and "torch" in line, line
    assert "ModuleNotFoundError" not in logs and "Traceback" not in logs, logs[-3000:]
    assert not (tmp_path / "out").exists()
