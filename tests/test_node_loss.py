"""Node loss on a two-node Ray cluster on this machine: a head (`ray start --head`) and a worker (`ray start
--address`), both on 127.0.0.1, each in its own session and temp dir, started and stopped here (never `ray stop`,
which would stop every Ray on the machine). The job joins it through RAY_ADDRESS, as inside `ray job submit`.

Its pools are four half-CPU actors (two engines, two rasterizers) on 3 logical CPUs (head 2, worker 1): no node holds
them all, so Ray Data spreads them, and the head alone still holds them all once the worker is gone (a cluster that
loses a node and keeps the room for its pools; one that shrinks below them waits for room)."""
import json
import os
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from conftest import ROOT, stop_ray_node
from pipeline.config import StorageConfig
from pipeline.output import OutputStore
from pipeline.storage import resolve
from test_job_ray import BACKEND, assert_exactly_once, make_pdfs

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]
RAY = shutil.which("ray", path=os.path.dirname(sys.executable)) or "ray"
N_DOCS = 14
POOLS = """\
parse: {num_actors: 2, cpus_per_actor: 0.5}
raster: {num_actors_min: 2, num_actors_max: 2, cpus_per_actor: 0.5}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ports(*flags) -> list[str]:
    """Each of Ray's per-node ports on a free one: another Ray on this machine keeps its defaults."""
    return [a for f in flags for a in (f, str(free_port()))]


class Node:
    def __init__(self, proc: subprocess.Popen, temp: str, log, manager_port: int):
        self.proc, self.temp, self.log, self.manager_port = proc, temp, log, manager_port

    def raylet(self) -> psutil.Process | None:
        """This node's raylet: the one process named raylet whose command line has this node's manager port."""
        for p in psutil.process_iter(["name", "cmdline"]):
            cmd = p.info["cmdline"] or []
            if cmd and cmd[0].endswith("raylet") and f"--node_manager_port={self.manager_port}" in cmd:
                return p
        return None

    def actors(self, name: str) -> list[psutil.Process]:
        """The job's actor processes on this node whose title names `name`: the raylet's own children (Ray's
        workers), not their children, which inherit the title of the worker that forked them."""
        raylet = self.raylet()
        if raylet is None:
            return []
        out = []
        try:
            children = raylet.children(recursive=False)
        except psutil.Error:  # a raylet that ended (or a zombie) between the look-up and now
            return []
        for p in children:
            try:
                if name in " ".join(p.cmdline()):
                    out.append(p)
            except psutil.Error:
                pass
        return out


def _start(args, env, temp, manager_port) -> Node:
    log = open(os.path.join(temp, "start.log"), "w")
    proc = subprocess.Popen([RAY, "start", "--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1",
                             "--temp-dir", temp, "--node-manager-port", str(manager_port), *args],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return Node(proc, temp, log, manager_port)


def _stop(node: Node) -> None:
    """The node's `ray start --block` group, then any process naming its temp dir or under its raylet."""
    also = []
    raylet = node.raylet()
    if raylet is not None:
        try:
            also = raylet.children(recursive=True) + [raylet]
        except psutil.Error:
            pass
    stop_ray_node(node.proc, node.temp, also)
    node.log.close()
    shutil.rmtree(node.temp, ignore_errors=True)


@pytest.fixture
def two_nodes():
    """(head, worker, env for a driver joining them): head 2 CPUs, worker 1 CPU, both alive before the test runs."""
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    gcs = free_port()
    nodes = []
    try:
        head_temp = tempfile.mkdtemp(prefix="rh", dir="/tmp")  # short: Ray's socket paths must fit 107 characters
        nodes.append(_start(["--head", "--port", str(gcs), "--num-cpus", "2", "--include-dashboard=false",
                             *_ports("--dashboard-port", "--ray-client-server-port", "--object-manager-port",
                                     "--metrics-export-port",
                                     "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                                     "--runtime-env-agent-port")],
                            env, head_temp, free_port()))
        _wait_nodes(env, gcs, 1, nodes)
        worker_temp = tempfile.mkdtemp(prefix="rw", dir="/tmp")
        nodes.append(_start(["--address", f"127.0.0.1:{gcs}", "--num-cpus", "1",
                             *_ports("--object-manager-port", "--metrics-export-port", "--dashboard-agent-listen-port",
                                     "--dashboard-agent-grpc-port", "--runtime-env-agent-port")],
                            env, worker_temp, free_port()))
        _wait_nodes(env, gcs, 2, nodes)
        yield nodes[0], nodes[1], dict(env, RAY_ADDRESS=f"127.0.0.1:{gcs}")
    finally:
        for node in reversed(nodes):
            _stop(node)


def _wait_nodes(env, gcs: int, n: int, nodes: list[Node], timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for node in nodes:
            if node.proc.poll() is not None:
                node.log.flush()
                pytest.fail(f"ray start exited: {open(node.log.name).read()[-2000:]}")
        if all(node.raylet() for node in nodes):
            status = subprocess.run([RAY, "status", "--address", f"127.0.0.1:{gcs}"], env=env, capture_output=True,
                                    text=True, timeout=60)
            if status.stdout.count("node_") >= n:
                return
        time.sleep(1)
    pytest.fail(f"the cluster did not reach {n} node(s) in {timeout:.0f} s")


def _start_job(tmp_path, env, n_docs: int = N_DOCS):
    make_pdfs(tmp_path / "in", n_docs)
    (tmp_path / "pools.yaml").write_text(POOLS)
    args = [sys.executable, str(ROOT / "jobs/parse_corpus.py"), "--config", str(tmp_path / "pools.yaml"),
            "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "ckpt"),
            "--backend", BACKEND, "--device", "cpu", "--max-tokens", "32", "--batch-size", "2", "--commit-every", "1"]
    out = open(tmp_path / "job.log", "w")
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _committed(tmp_path) -> int:
    return len(list((tmp_path / "out" / "documents").glob("*.parquet")))


def _finish(proc, tmp_path, timeout: float) -> str:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"the job did not finish in {timeout:.0f} s after the kill:\n"
                    f"{(tmp_path / 'job.log').read_text()[-4000:]}")
    return (tmp_path / "job.log").read_text()


def _check_finished(proc, tmp_path, log: str, n_docs: int = N_DOCS) -> dict:
    """The job exited 0 with every document once, all ok with both pages; its run summary."""
    assert proc.returncode == 0, log[-4000:]
    store = OutputStore(resolve(str(tmp_path / "out"), StorageConfig()))
    docs, _ = assert_exactly_once(store, {f"file://{tmp_path}/in/doc{i:02d}.pdf" for i in range(n_docs)})
    assert set(docs.column("status").to_pylist()) == {"ok"}
    [run] = list((tmp_path / "out" / "runs").glob("*.json"))
    stats = json.loads(run.read_text())
    assert stats["documents_ok"] == n_docs and stats["pages"] == 2 * n_docs
    return stats


def test_worker_node_lost_mid_run_every_document_once(two_nodes, tmp_path, tiny_checkpoint):
    head, worker, env = two_nodes
    shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    t0 = time.time()
    proc = _start_job(tmp_path, env)
    try:
        deadline, on_worker = time.time() + 300, []
        while time.time() < deadline and proc.poll() is None:
            on_worker = worker.actors("ParseStage") + worker.actors("RasterizeStage")
            if _committed(tmp_path) >= 2 and on_worker:
                break
            time.sleep(0.2)
        assert proc.poll() is None, (tmp_path / "job.log").read_text()[-3000:]
        assert on_worker, "no actor of the job ran on the worker node: the test would not test anything"
        assert head.actors("ParseStage") + head.actors("RasterizeStage"), "the actors did not spread over both nodes"
        engines_lost = len(worker.actors("ParseStage"))
        before = _committed(tmp_path)
        assert before < N_DOCS, "the job was done before the node was lost"
        raylet = worker.raylet()
        os.kill(raylet.pid, signal.SIGKILL)  # the worker node's raylet alone: its node is lost with what ran on it
        log = _finish(proc, tmp_path, 420)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stats = _check_finished(proc, tmp_path, log)
    assert stats["engine_restarts"] >= engines_lost, stats  # an engine on the lost node was started again elsewhere
    print(f"node lost at {before} of {N_DOCS} committed with {[p.pid for p in on_worker]} on it; "
          f"engine restarts {stats.get('engine_restarts')}; {time.time() - t0:.0f} s")


def test_engine_actor_killed_mid_batch_is_redone_and_counted(two_nodes, tmp_path, tiny_checkpoint):
    head, worker, env = two_nodes
    shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    # more documents than the node-loss test: a fast machine must not finish them between two looks at the engines
    n_docs = 3 * N_DOCS
    proc = _start_job(tmp_path, env, n_docs)
    try:
        deadline, victim = time.time() + 300, None
        while time.time() < deadline and proc.poll() is None and victim is None:
            # mid-batch: a document committed, and an engine working (its CPU time rising)
            engines = head.actors("ParseStage") + worker.actors("ParseStage") if _committed(tmp_path) else []
            victim = next(iter(_busy(engines)), None)
            time.sleep(0.1)
        assert victim is not None, "no busy engine actor seen: " + (tmp_path / "job.log").read_text()[-3000:]
        before = _committed(tmp_path)
        assert before < n_docs, "the job was done before the engine was killed"
        victim.kill()  # the engine's process alone
        print(f"killed engine {victim.pid} ({' '.join(victim.cmdline())[:60] if victim.is_running() else 'gone'})")
        log = _finish(proc, tmp_path, 420)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stats = _check_finished(proc, tmp_path, log, n_docs)
    assert stats["engine_restarts"] >= 1, stats
    assert "engine restarts" in log, log[-2000:]
    print(f"engine {victim.pid} killed at {before} of {n_docs} committed; engine restarts {stats['engine_restarts']}")


def _busy(procs: list[psutil.Process], window: float = 0.3) -> list[psutil.Process]:
    """Those of `procs` that used CPU time over one shared `window`."""
    def cpu(p):
        try:
            return sum(p.cpu_times()[:2])
        except psutil.Error:
            return None
    before = [cpu(p) for p in procs]
    if procs:
        time.sleep(window)
    return [p for p, a in zip(procs, before) if a is not None and (cpu(p) or 0) - a > 0.05]
