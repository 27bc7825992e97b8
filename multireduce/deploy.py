"""The cluster configuration shared by ``deploy/`` scripts and clients, and the client helper.

One TOML file (``deploy/cluster.toml`` is the template) says where the scheduler is, which TLS files to
use, and how workers are started. The shell scripts read it through ``python -m multireduce.deploy env
FILE``; a notebook connects with ``multireduce.deploy.connect(FILE)``.

TLS with client certificates is on by default ("auto") for any scheduler address that is not loopback,
and cannot be switched off for one; the dashboard binds to loopback unless the file says otherwise.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import socket
import sys
from pathlib import Path

try:  # Python >= 3.11
    import tomllib
except ImportError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULTS = {
    "scheduler": {"host": "127.0.0.1", "port": 8786, "dashboard": "127.0.0.1:8787",
                  "scheduler_file": "run/scheduler.json"},
    "tls": {"enabled": "auto", "ca_file": "certs/ca.pem", "scheduler_cert": "certs/scheduler.pem",
            "scheduler_key": "certs/scheduler-key.pem", "worker_cert": "certs/worker.pem",
            "worker_key": "certs/worker-key.pem", "client_cert": "certs/client.pem",
            "client_key": "certs/client-key.pem"},
    "workers": {"host": "", "dashboard": "127.0.0.1:0", "kind": "auto", "nworkers": "auto", "nthreads": 1, "memory_limit": "auto",
                "rmm_pool_size": "", "device_memory_limit": "", "enable_spilling": True},
    "run": {"dir": "run"},
}
_PATH_KEYS = {("scheduler", "scheduler_file"), ("run", "dir")} | {
    ("tls", k) for k in DEFAULTS["tls"] if k != "enabled"}


class ConfigError(ValueError):
    pass


def is_loopback(host: str) -> bool:
    """True only for an address that cannot be reached from another machine. "" and the wildcards
    ("0.0.0.0", "::") mean *every* interface to a listener, so they are not loopback."""
    if not isinstance(host, str) or not host.strip():
        return False
    host = host.strip().strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
        except OSError:
            return False


def load(path: str | os.PathLike) -> dict:
    """The configuration with defaults filled in and relative paths made absolute (from the file's folder)."""
    path = Path(path).expanduser().resolve()
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
    cfg = {section: dict(values) for section, values in DEFAULTS.items()}
    for section, values in raw.items():
        if section not in cfg or not isinstance(values, dict):
            raise ConfigError(f"config file {path}: unknown section [{section}]; expected one of {sorted(cfg)}")
        unknown = set(values) - set(cfg[section])
        if unknown:
            raise ConfigError(f"config file {path}: unknown keys {sorted(unknown)} in [{section}]; "
                              f"expected some of {sorted(cfg[section])}")
        cfg[section].update(values)
    for section, key in _PATH_KEYS:
        value = str(cfg[section][key])
        cfg[section][key] = str((path.parent / Path(value).expanduser()).resolve()) if value else ""
    enabled = cfg["tls"]["enabled"]
    loopback = is_loopback(str(cfg["scheduler"]["host"]))
    # compare types: 1 == True and 0 == False in Python, so `1 in (True,)` would let 1/0 through
    if not (type(enabled) is bool or (type(enabled) is str and enabled == "auto")):
        raise ConfigError(f"config file {path}: [tls] enabled must be \"auto\", true or false; got {enabled!r}")
    if enabled is False and not loopback:
        raise ConfigError(f"config file {path}: TLS cannot be switched off for the non-loopback scheduler address "
                          f"{cfg['scheduler']['host']!r}; use \"auto\" or true")
    cfg["tls"]["on"] = bool(enabled is True or (enabled == "auto" and not loopback))
    for key in ("host", "dashboard"):
        if not isinstance(cfg["workers"][key], str):
            raise ConfigError(f"config file {path}: [workers] {key} must be a string; got {cfg['workers'][key]!r}")
    # listeners bind only the interface the file names: workers and nannies on a loopback scheduler stay on
    # loopback; otherwise "" means "the interface that routes to the scheduler", found on each node
    if not cfg["workers"]["host"] and loopback:
        cfg["workers"]["host"] = "127.0.0.1"
    wildcard = ("", "0.0.0.0", "::", "[::]")
    if cfg["workers"]["host"] in wildcard[1:] or cfg["scheduler"]["host"] in wildcard:
        raise ConfigError(f"config file {path}: a wildcard address binds every interface; name one in "
                          f"[scheduler] host and [workers] host (got {cfg['scheduler']['host']!r}, "
                          f"{cfg['workers']['host']!r})")
    dash_host = cfg["workers"]["dashboard"].rpartition(":")[0]
    if dash_host.strip("[]") in wildcard:
        raise ConfigError(f"config file {path}: [workers] dashboard {cfg['workers']['dashboard']!r} binds every "
                          "interface; give host:port, e.g. \"127.0.0.1:0\"")
    cfg["config_file"] = str(path)
    return cfg


def scheduler_address(cfg: dict) -> str:
    """From the scheduler file when the scheduler wrote one (port 0 works), else host:port."""
    sf = cfg["scheduler"]["scheduler_file"]
    if sf and os.path.exists(sf):
        with open(sf) as f:
            return json.load(f)["address"]
    protocol = "tls" if cfg["tls"]["on"] else "tcp"
    return f"{protocol}://{cfg['scheduler']['host']}:{cfg['scheduler']['port']}"


def security(cfg: dict, role: str = "client"):
    """A ``distributed.Security`` for ``role`` ("client", "worker", "scheduler"); None without TLS."""
    if not cfg["tls"]["on"]:
        return None
    from distributed.security import Security

    tls = cfg["tls"]
    for key in ("ca_file", f"{role}_cert", f"{role}_key"):
        if not os.path.exists(tls[key]):
            raise ConfigError(f"TLS file {key} = {tls[key]!r} does not exist; make the certificates with "
                              "deploy/make-certs.sh")
    kw = {"tls_ca_file": tls["ca_file"], "require_encryption": True,
          f"tls_{role}_cert": tls[f"{role}_cert"], f"tls_{role}_key": tls[f"{role}_key"]}
    return Security(**kw)


def connect(config: str | os.PathLike, **kwargs):
    """A ``distributed.Client`` for the cluster that ``config`` describes, with the client certificate."""
    from distributed import Client

    cfg = load(config)
    return Client(scheduler_address(cfg), security=security(cfg, "client"), **kwargs)


def shell_env(cfg: dict) -> str:
    """``MR_*`` shell assignments for the deploy scripts."""
    out = {
        "MR_CONFIG": cfg["config_file"],
        "MR_HOST": cfg["scheduler"]["host"],
        "MR_PORT": cfg["scheduler"]["port"],
        "MR_DASHBOARD": cfg["scheduler"]["dashboard"],
        "MR_SCHEDULER_FILE": cfg["scheduler"]["scheduler_file"],
        "MR_TLS": int(cfg["tls"]["on"]),
        "MR_RUN_DIR": cfg["run"]["dir"],
        "MR_WORKER_HOST": cfg["workers"]["host"],
        "MR_WORKER_DASHBOARD": cfg["workers"]["dashboard"],
        "MR_WORKER_KIND": cfg["workers"]["kind"],
        "MR_NWORKERS": cfg["workers"]["nworkers"],
        "MR_NTHREADS": cfg["workers"]["nthreads"],
        "MR_MEMORY_LIMIT": cfg["workers"]["memory_limit"],
        "MR_RMM_POOL_SIZE": cfg["workers"]["rmm_pool_size"],
        "MR_DEVICE_MEMORY_LIMIT": cfg["workers"]["device_memory_limit"],
        "MR_ENABLE_SPILLING": int(bool(cfg["workers"]["enable_spilling"])),
    }
    for key in DEFAULTS["tls"]:
        if key != "enabled":
            out[f"MR_TLS_{key.upper()}"] = cfg["tls"][key]
    return "\n".join(f"{k}={shlex.quote(str(v))}" for k, v in out.items())


def route_source(host: str, port: int) -> str:
    """This node's address on the interface that routes to ``host`` (a UDP connect sends no packet)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((host, int(port) or 9))
        return s.getsockname()[0]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2 or argv[0] not in ("env", "address", "worker-host"):
        print("usage: python -m multireduce.deploy {env|address|worker-host} CONFIG", file=sys.stderr)
        return 2
    try:
        cfg = load(argv[1])
    except ConfigError as exc:
        print(f"multireduce.deploy: {exc}", file=sys.stderr)
        return 2
    if argv[0] == "worker-host":
        print(cfg["workers"]["host"] or route_source(cfg["scheduler"]["host"], cfg["scheduler"]["port"]))
    else:
        print(shell_env(cfg) if argv[0] == "env" else scheduler_address(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
