"""Deployment security on real processes: every listener of a scripted cluster and of local_cluster binds
loopback only, a plain-TCP rpc to a TLS worker and nanny is refused, the config rules that decide TLS, the CA
key stays out of the certificate folder, and stop.sh never signals a process that is not its own."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

psutil = pytest.importorskip("psutil")
distributed = pytest.importorskip("distributed")

from multireduce import deploy  # noqa: E402
from multireduce.cluster import local_cluster  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
ENV = {**os.environ, "MR_PYTHON": sys.executable}
TLS_FILES = [("ca_file", "ca.pem"), ("scheduler_cert", "scheduler.pem"), ("scheduler_key", "scheduler-key.pem"),
             ("worker_cert", "worker.pem"), ("worker_key", "worker-key.pem"), ("client_cert", "client.pem"),
             ("client_key", "client-key.pem")]


def sh(*args, timeout=120, check=True, env=None):
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, env=env or ENV)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def certs(tls_certs):
    return tls_certs


def _write(tmp_path, text):
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    return path


def _tls_config(tmp_path, certs, workers=""):
    tls = "\n".join(f'{k} = "{certs / v}"' for k, v in TLS_FILES)
    return _write(tmp_path, '[scheduler]\nhost = "127.0.0.1"\nport = 0\ndashboard = "127.0.0.1:0"\n'
                            f'[tls]\nenabled = true\n{tls}\n[workers]\nkind = "cpu"\nnworkers = 2\n{workers}')


def _listening(pids) -> list[tuple[int, str, int]]:
    out = []
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        out += [(pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return out


def _tree(pid) -> list[int]:
    p = psutil.Process(pid)
    return [pid] + [c.pid for c in p.children(recursive=True)]


def _assert_loopback_only(socks):
    assert socks, "no listening socket found: the check would pass vacuously"
    bad = [s for s in socks if not ipaddress.ip_address(s[1]).is_loopback]
    assert not bad, f"listeners bound beyond loopback (pid, ip, port): {bad}"


# ----------------------------------------------------------------------------- config rules (items 11, 12)

@pytest.mark.parametrize("value", ["1", "0", '"yes"', '"no"', '"true"', '"on"', '""', "1.0", "[]", '"AUTO"'])
def test_tls_enabled_accepts_only_booleans_and_auto(tmp_path, value):
    path = _write(tmp_path, f"[tls]\nenabled = {value}\n")
    with pytest.raises(deploy.ConfigError, match=r"\[tls\] enabled must be"):
        deploy.load(path)


@pytest.mark.parametrize("value,on", [("true", True), ("false", False), ('"auto"', False)])
def test_tls_enabled_real_values_on_loopback(tmp_path, value, on):
    assert deploy.load(_write(tmp_path, f"[tls]\nenabled = {value}\n"))["tls"]["on"] is on


@pytest.mark.parametrize("host", ["", " ", "0.0.0.0", "::", "[::]", "10.1.2.3", "192.168.0.7", "8.8.8.8",
                                  "fe80::1", "2001:db8::1", "::ffff:10.0.0.1", "no-such-host.invalid"])
def test_unspecified_and_remote_hosts_are_not_loopback(host):
    assert deploy.is_loopback(host) is False


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.4.5", "::1", "[::1]", "localhost"])
def test_loopback_hosts(host):
    assert deploy.is_loopback(host) is True


@pytest.mark.parametrize("host", ["10.1.2.3", "2001:db8::1"])
def test_non_loopback_scheduler_requires_tls(tmp_path, host):
    with pytest.raises(deploy.ConfigError, match="TLS cannot be switched off"):
        deploy.load(_write(tmp_path, f'[scheduler]\nhost = "{host}"\n[tls]\nenabled = false\n'))
    assert deploy.load(_write(tmp_path, f'[scheduler]\nhost = "{host}"\n'))["tls"]["on"] is True


@pytest.mark.parametrize("section,text", [
    ("scheduler", 'host = ""'), ("scheduler", 'host = "0.0.0.0"'), ("scheduler", 'host = "::"'),
    ("workers", 'host = "0.0.0.0"'), ("workers", 'host = "::"'), ("workers", 'dashboard = ":0"'),
    ("workers", 'dashboard = "0.0.0.0:8788"'), ("workers", 'dashboard = "[::]:0"')])
def test_wildcard_listeners_are_refused(tmp_path, section, text):
    with pytest.raises(deploy.ConfigError):
        deploy.load(_write(tmp_path, f"[{section}]\n{text}\n[tls]\nenabled = true\n"))


def test_worker_listen_address_defaults(tmp_path):
    cfg = deploy.load(_write(tmp_path, "[scheduler]\nhost = \"127.0.0.1\"\n"))
    assert cfg["workers"]["host"] == "127.0.0.1" and cfg["workers"]["dashboard"].startswith("127.0.0.1:")
    env = deploy.shell_env(cfg)
    assert "MR_WORKER_HOST=127.0.0.1" in env and "MR_WORKER_DASHBOARD=127.0.0.1:0" in env


# ----------------------------------------------------------------------------- certificates (item 14)

@pytest.mark.slow
def test_ca_key_is_not_in_the_copied_folder(certs):
    assert not list(certs.glob("ca-key*")) and not list(certs.glob("*.srl"))
    assert (certs.parent / "certs-ca" / "ca-key.pem").exists()
    assert oct((certs.parent / "certs-ca" / "ca-key.pem").stat().st_mode & 0o777) == "0o600"
    for role in ("scheduler", "worker", "client"):  # the certificates still verify against the CA
        sh("openssl", "verify", "-CAfile", certs / "ca.pem", certs / f"{role}.pem")


def test_ca_dir_inside_cert_dir_is_refused(tmp_path):
    proc = sh("bash", DEPLOY / "make-certs.sh", tmp_path / "c", check=False,
              env={**ENV, "MR_CA_DIR": str(tmp_path / "c" / "ca")})
    assert proc.returncode != 0 and "must not be inside" in proc.stderr
    assert not (tmp_path / "c" / "ca" / "ca-key.pem").exists()


@pytest.mark.slow
def test_ca_dir_option_reuses_the_ca_and_refuses_bad_use(tmp_path):
    first, second, cadir = tmp_path / "first", tmp_path / "second", tmp_path / "keep" / "ca"
    sh("bash", DEPLOY / "make-certs.sh", first, "--ca-dir", cadir, "node1")
    key = (cadir / "ca-key.pem").read_bytes()
    assert oct(cadir.stat().st_mode & 0o777) == "0o700" and not list(first.glob("ca-key*"))
    out = sh("bash", DEPLOY / "make-certs.sh", second, "node2", "--ca-dir", cadir).stdout
    # the same CA signed both sets: a node holding the first ca.pem trusts the second set's certificates
    assert "reused" in out and (cadir / "ca-key.pem").read_bytes() == key
    assert (first / "ca.pem").read_bytes() == (second / "ca.pem").read_bytes()
    for role in ("scheduler", "worker", "client"):
        sh("openssl", "verify", "-CAfile", first / "ca.pem", second / f"{role}.pem")
    text = sh("openssl", "x509", "-in", second / "scheduler.pem", "-noout", "-text").stdout
    assert "DNS:node2" in text and "DNS:node1" not in text
    bad = sh("bash", DEPLOY / "make-certs.sh", tmp_path / "x", "--ca-dir", tmp_path / "x" / "ca", check=False)
    assert bad.returncode == 2 and "must not be inside" in bad.stderr
    bad = sh("bash", DEPLOY / "make-certs.sh", tmp_path / "y", "--bogus", check=False)
    assert bad.returncode == 2 and "unknown option --bogus" in bad.stderr
    (tmp_path / "orphan").mkdir()
    (tmp_path / "orphan" / "ca-key.pem").write_text("x")  # a key without its certificate is not reused
    bad = sh("bash", DEPLOY / "make-certs.sh", tmp_path / "z", "--ca-dir", tmp_path / "orphan", check=False)
    assert bad.returncode == 2 and "no ca.pem" in bad.stderr


# ----------------------------------------------------------------------------- stop.sh (item 15)

def test_stop_does_not_signal_an_unrelated_process(tmp_path):
    cfg = deploy.load(_write(tmp_path, "[scheduler]\nport = 0\n"))
    run = Path(cfg["run"]["dir"])
    run.mkdir(parents=True, exist_ok=True)
    # an unrelated process in its own session, so a group kill would reach it too
    sleeper = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        (run / "scheduler.pid").write_text(f"{sleeper.pid}\n")
        (run / "workers-x.pid").write_text("not-a-pid\n")
        proc = sh("bash", DEPLOY / "stop.sh", tmp_path / "cluster.toml")
        assert "stale pid file" in proc.stderr
        time.sleep(0.3)
        assert sleeper.poll() is None, "stop.sh signalled a process that is not its own"
        assert not (run / "scheduler.pid").exists()
    finally:
        sleeper.kill()
        sleeper.wait()


# ----------------------------------------------------------------------------- real listeners (items 10, 13)

async def _plain_tcp_rpc_refused(address: str) -> None:
    from distributed.core import rpc

    plain = "tcp://" + address.split("://", 1)[1]
    r = rpc(plain, connection_args={}, timeout=5)
    try:
        with pytest.raises((OSError, asyncio.TimeoutError, distributed.comm.CommClosedError, EnvironmentError)):
            await asyncio.wait_for(r.identity(), 8)
    finally:
        await r.close_rpc()


async def _identity(address: str, security) -> dict:
    """The server's answer to an identity rpc made with the client's certificate: the positive control that
    makes the refusals below mean something (the port is live and speaks Dask)."""
    from distributed.core import rpc

    # generous: on a loaded machine a TLS handshake can take seconds; this side only has to succeed
    r = rpc(address, connection_args=security.get_connection_args("client"), timeout=30)
    try:
        return await asyncio.wait_for(r.identity(), 60)
    finally:
        await r.close_rpc()


def _tls_handshake_without_certificate(address: str, ca_file: str) -> None:
    """A TLS client that trusts the cluster's CA but shows no certificate of its own: the server must end
    the handshake (or the connection) instead of reading a request."""
    import socket
    import ssl

    host, port = address.split("://", 1)[1].rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.check_hostname = False
    # a timeout fails the caller's test (it would mean the server waited for a request), so it must be far
    # above what a refusal takes on a loaded machine
    with socket.create_connection((host, int(port)), timeout=60) as raw, ctx.wrap_socket(raw) as tls:
        tls.sendall(b"\0" * 8)  # TLS 1.3 reports a refused client certificate at the first read
        if not tls.recv(1):
            raise ConnectionResetError(f"{address} closed the connection")


@pytest.mark.slow
def test_scripted_cluster_listens_on_loopback_and_refuses_plain_tcp(tmp_path, certs):
    config = _tls_config(tmp_path, certs)
    run = tmp_path / "run"
    try:
        sh("bash", DEPLOY / "start-scheduler.sh", config)
        sh("bash", DEPLOY / "start-workers.sh", config, "n1")
        with deploy.connect(config, timeout=30) as client:
            client.wait_for_workers(2, timeout=60)
            info = client.scheduler_info()
            workers = info["workers"]
            nannies = [w["nanny"] for w in workers.values()]
            assert all(a.startswith("tls://127.0.0.1:") for a in list(workers) + nannies), (workers, nannies)
            assert client.submit(sum, [1, 2, 3]).result() == 6
            _held_paths_call_workers_directly(client)
            pids = _tree(int((run / "scheduler.pid").read_text())) + _tree(int((run / "workers-n1.pid").read_text()))
            socks = _listening(pids)
            _assert_loopback_only(socks)
            # scheduler, its dashboard, 2 nannies, 2 workers, 2 worker dashboards at least
            assert len(socks) >= 8, socks
            log = (run / "workers-n1.log").read_text()
            assert "dashboard at" in log and "127.0.0.1" in log.split("dashboard at")[-1].splitlines()[0]
            sec = deploy.security(deploy.load(config), "client")
            for address in list(workers) + nannies:
                assert asyncio.run(_identity(address, sec))["type"] in ("Worker", "Nanny"), address
                asyncio.run(_plain_tcp_rpc_refused(address))
                with pytest.raises(OSError) as refused:  # ssl.SSLError ("certificate required") or a reset
                    _tls_handshake_without_certificate(address, str(certs / "ca.pem"))
                # a timeout would mean the server accepted the handshake and waited for a request
                assert not isinstance(refused.value, TimeoutError), refused.value
    finally:
        sh("bash", DEPLOY / "stop.sh", config, check=False)


def _held_paths_call_workers_directly(client):
    """The held paths' direct calls to the workers (multireduce.direct._call_each) go over TLS with the
    client's own certificate: with the scheduler's broadcast broken they still run."""
    import dask.array as da
    import distributed
    import numpy as np

    import multireduce as mr

    x = client.persist(da.arange(1, 4001, chunks=1000, dtype=np.float64))
    distributed.wait(x)
    assert mr.sum(x, compute=True) == 8002000.0  # this first run learns the workers through the scheduler

    def no_broadcast(*args, **kwargs):
        raise AssertionError("the scheduler's broadcast was used")

    client._run = no_broadcast
    try:
        assert mr.sum(x, compute=True) == 8002000.0
        assert mr.cumsum(x).persist().compute()[-1] == 8002000.0
    finally:
        del client._run


def test_local_cluster_listens_on_loopback_only():
    with local_cluster(n_workers=2, gpu=False, processes=True) as cluster:
        cluster.wait_for_workers(2) if hasattr(cluster, "wait_for_workers") else None
        pids = _tree(os.getpid())
        socks = _listening(pids)
        _assert_loopback_only(socks)
        addrs = list(cluster.scheduler_info["workers"])
        assert len(addrs) == 2 and all(a.startswith("tcp://127.0.0.1:") for a in addrs)


def test_local_cluster_in_process_listens_on_loopback_only():
    # processes=False is Dask's in-process transport, which takes no host: it used to fail to start
    with local_cluster(n_workers=2, gpu=False, processes=False) as cluster, distributed.Client(cluster) as client:
        assert cluster.scheduler_address.startswith("inproc://")
        assert client.submit(sum, [1, 2, 3]).result() == 6
        _assert_loopback_only(_listening(_tree(os.getpid())))
    with local_cluster(n_workers=1, gpu=False, processes=False, protocol="tcp://") as cluster:
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")


@pytest.mark.parametrize("kwargs, named", [
    ({"host": "0.0.0.0"}, "host='0.0.0.0'"), ({"host": ""}, "host=''"), ({"host": "::"}, "host='::'"),
    ({"host": None}, "host=None"), ({"host": "10.1.2.3"}, "host='10.1.2.3'"),
    ({"host": "tcp://0.0.0.0"}, "host='tcp://0.0.0.0'"), ({"interface": "eth0"}, "interface='eth0'"),
    ({"host": "0.0.0.0", "security": False}, "host='0.0.0.0'"),
    ({"host": "0.0.0.0", "security": distributed.Security()}, "host='0.0.0.0'"),  # no encryption required
])
@pytest.mark.parametrize("gpu", [False, True])
def test_local_cluster_refuses_an_exposed_address_without_tls(kwargs, named, gpu):
    # refused before any process starts, on the GPU path too (where there is no GPU here, it would
    # otherwise fail later for that reason)
    before = set(_tree(os.getpid()))
    with pytest.raises(ValueError, match="not loopback") as info:
        local_cluster(n_workers=1, gpu=gpu, **kwargs)
    assert named in str(info.value) and "security=" in str(info.value)
    assert set(_tree(os.getpid())) == before


def _k8s_container(name: str) -> dict:
    import yaml

    docs = [d for d in yaml.safe_load_all((DEPLOY / "k8s" / f"{name}.yaml").read_text()) if d]
    return next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("name", ["scheduler", "workers"])
def test_kubernetes_pods_bind_the_pod_address_and_loopback_dashboard(name):
    """Without --host a Dask server listens on every interface of the pod; the pod's IP (from the
    downward API) is what the Service and the other pods reach, the dashboard stays on loopback."""
    container = _k8s_container(name)
    args = container["args"]
    assert "--host" in args and args[args.index("--host") + 1] == "$(POD_IP)", args
    assert "--interface" not in args
    assert args[args.index("--dashboard-address") + 1].startswith("127.0.0.1:")
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert {"--tls-ca-file", "--tls-cert", "--tls-key"} <= set(args)
    if name == "scheduler":
        assert args[args.index("--protocol") + 1] == "tls"
    else:
        assert next(a for a in args if "://" in a).startswith("tls://")
