"""deploy/: a secured cluster started, used and stopped by the scripts alone (two worker "nodes" on
loopback, real TLS certificates), refused connections, the config rules, and the SLURM, Kubernetes and
wheelhouse files."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import yaml

distributed = pytest.importorskip("distributed")

import multireduce as mr  # noqa: E402
from multireduce import deploy  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
ENV = {**os.environ, "MR_PYTHON": sys.executable}


def sh(*args, timeout=120, check=True):
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, env=ENV)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def certs(tls_certs):
    return tls_certs


def _config(tmp_path, certs, **scheduler):
    lines = ["[scheduler]", 'host = "127.0.0.1"', "port = 0", 'dashboard = "127.0.0.1:0"']
    lines += [f"{k} = {v!r}" for k, v in scheduler.items()]
    lines += ["[tls]", "enabled = true"] + [
        f'{k} = "{certs / v}"' for k, v in [("ca_file", "ca.pem"), ("scheduler_cert", "scheduler.pem"),
                                             ("scheduler_key", "scheduler-key.pem"), ("worker_cert", "worker.pem"),
                                             ("worker_key", "worker-key.pem"), ("client_cert", "client.pem"),
                                             ("client_key", "client-key.pem")]]
    lines += ["[workers]", 'kind = "cpu"', "nworkers = 1"]
    path = tmp_path / "cluster.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _tls_without_client_certificate(port: int, ca_file: str) -> None:
    """Speak TLS to the scheduler, trusting its CA but offering no certificate of our own."""
    import socket
    import ssl

    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.check_hostname = False
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw) as tls:
        tls.sendall(b"\0" * 8)
        if not tls.recv(1):  # the server hung up without a word
            raise ConnectionResetError("closed")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _other_ca_client(d: Path) -> Path:
    """A client certificate from a CA the cluster does not trust (EC keys: milliseconds, where make-certs.sh's
    four RSA-3072 keys take seconds); ca.pem, client.pem and client-key.pem in ``d``."""
    d.mkdir()
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    sh("openssl", "req", "-x509", *ec, "-days", "2", "-subj", "/CN=other-ca", "-keyout", d / "ca-key.pem",
       "-out", d / "ca.pem")
    sh("openssl", "req", *ec, "-subj", "/CN=other-client", "-keyout", d / "client-key.pem", "-out", d / "client.csr")
    sh("openssl", "x509", "-req", "-in", d / "client.csr", "-CA", d / "ca.pem", "-CAkey", d / "ca-key.pem",
       "-CAcreateserial", "-days", "2", "-out", d / "client.pem")
    return d


@pytest.mark.slow
def test_secured_cluster_start_use_stop(tmp_path, certs):
    config = _config(tmp_path, certs)
    cfg = deploy.load(config)
    run = Path(cfg["run"]["dir"])
    pids = []
    try:
        sh("bash", DEPLOY / "start-scheduler.sh", config)
        sh("bash", DEPLOY / "start-workers.sh", config, "node-a")
        sh("bash", DEPLOY / "start-workers.sh", config, "node-b")
        pids = [int(p.read_text()) for p in run.glob("*.pid")]
        address = deploy.scheduler_address(cfg)
        assert address.startswith("tls://127.0.0.1:")
        with deploy.connect(config, timeout=30) as client:
            client.wait_for_workers(2, timeout=60)
            names = {w["name"] for w in client.scheduler_info()["workers"].values()}
            assert names == {"node-a", "node-b"}
            x = np.random.default_rng(0).integers(-1000, 1000, size=100_003)
            d = da.from_array(x, chunks=7_001)
            assert client.compute(mr.sum(d)).result() == x.sum()
            np.testing.assert_array_equal(client.compute(mr.cumsum(d)).result(), np.cumsum(x))
        # the dashboard listens on loopback only
        assert "127.0.0.1" in (run / "scheduler.log").read_text().split("dashboard at")[-1].splitlines()[0]

        # refused: a plain TCP client, a TLS client without a certificate, one with another CA's certificate
        port = address.rsplit(":", 1)[1]
        with pytest.raises((OSError, TimeoutError)):
            distributed.Client(f"tcp://127.0.0.1:{port}", timeout=3)
        from distributed.security import Security

        with pytest.raises(OSError):  # ssl.SSLError is an OSError: "certificate required"
            _tls_without_client_certificate(int(port), cfg["tls"]["ca_file"])
        other = _other_ca_client(tmp_path / "other-ca")
        with pytest.raises((OSError, TimeoutError)):
            distributed.Client(address, timeout=3, security=Security(
                tls_ca_file=str(other / "ca.pem"), tls_client_cert=str(other / "client.pem"),
                tls_client_key=str(other / "client-key.pem"), require_encryption=True))
    finally:
        out = sh("bash", DEPLOY / "stop.sh", config)
    assert "stopped 3 process groups" in out.stdout
    # stop.sh has sent SIGKILL to what outlived SIGTERM; the kernel may still be reaping them
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pids and not any(_alive(p) for p in pids)
    assert not list(run.glob("*.pid"))
    left = subprocess.run(["pgrep", "-f", str(cfg["scheduler"]["scheduler_file"])], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"processes left behind: {left.stdout}"


def test_config_rules(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[scheduler]\nhost = "10.1.2.3"\n[tls]\nenabled = false\n')
    with pytest.raises(deploy.ConfigError, match="TLS cannot be switched off for the non-loopback"):
        deploy.load(bad)
    auto = tmp_path / "auto.toml"
    auto.write_text('[scheduler]\nhost = "10.1.2.3"\n')
    assert deploy.load(auto)["tls"]["on"] is True  # on by default off loopback
    loop = tmp_path / "loop.toml"
    loop.write_text('[scheduler]\nhost = "127.0.0.1"\n')
    assert deploy.load(loop)["tls"]["on"] is False
    typo = tmp_path / "typo.toml"
    typo.write_text('[scheduler]\nhots = "x"\n')
    with pytest.raises(deploy.ConfigError, match=r"unknown keys \['hots'\]"):
        deploy.load(typo)
    with pytest.raises(deploy.ConfigError, match="does not exist"):
        deploy.load(tmp_path / "missing.toml")
    template = deploy.load(DEPLOY / "cluster.toml")
    assert template["scheduler"]["dashboard"].startswith("127.0.0.1")
    with pytest.raises(deploy.ConfigError, match="make-certs.sh"):
        deploy.security(deploy.load(auto))


def test_kubernetes_manifests_are_consistent():
    docs = [d for f in sorted((DEPLOY / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("Deployment", "multireduce-scheduler"), ("Service", "multireduce-scheduler"),
            ("Deployment", "multireduce-workers")} <= kinds
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    sched, svc = by_name[("Deployment", "multireduce-scheduler")], by_name[("Service", "multireduce-scheduler")]
    workers = by_name[("Deployment", "multireduce-workers")]
    for dep in (sched, workers):
        assert dep["spec"]["selector"]["matchLabels"] == dep["spec"]["template"]["metadata"]["labels"]
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        assert {"--tls-ca-file", "--tls-cert", "--tls-key"} <= set(args)
    assert svc["spec"]["selector"] == sched["spec"]["template"]["metadata"]["labels"]
    sargs = sched["spec"]["template"]["spec"]["containers"][0]["args"]
    assert sargs[sargs.index("--dashboard-address") + 1].startswith("127.0.0.1")
    wc = workers["spec"]["template"]["spec"]["containers"][0]
    assert int(wc["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    assert any(a.startswith("tls://multireduce-scheduler:") for a in wc["args"])
    assert {"name": "NCCL_NVLS_ENABLE", "value": "0"} in wc["env"]


def test_slurm_script_and_shell_syntax():
    for script in list(DEPLOY.glob("*.sh")) + [DEPLOY / "slurm" / "multireduce.sbatch"]:
        sh("bash", "-n", script)
    text = (DEPLOY / "slurm" / "multireduce.sbatch").read_text()
    assert "#SBATCH --ntasks-per-node=1" in text
    for step in ("start-scheduler.sh", "start-workers.sh", "stop.sh", "MR_FOREGROUND=1"):
        assert step in text


@pytest.mark.slow
def test_wheelhouse_collects_the_dask_stack(tmp_path):
    """The air-gapped install set (network: the package registry only). --no-self: multireduce's own wheel
    is the one tests/test_packaging.py builds and opens, by the same command."""
    proc = sh("bash", DEPLOY / "wheelhouse.sh", tmp_path / "wh", "--only-missing", "--no-self", timeout=600,
              check=False)
    network = ("NewConnectionError", "Temporary failure in name resolution", "Network is unreachable",
               "Connection refused", "Max retries exceeded")
    if proc.returncode != 0 and any(sign in proc.stderr for sign in network):
        pytest.skip(f"the package registry is not reachable here: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = {p.name.split("-")[0].lower() for p in (tmp_path / "wh").glob("*.whl")}
    assert {"dask", "distributed", "partd", "locket", "tblib", "zict", "tornado"} <= names
    assert "multireduce" not in names
