"""The hardened container a sandboxed program runs in, as Docker Engine API JSON (pure).

The controller builds the config here and sends it to the sandbox host's agent, which creates
containers from it as it is: the agent (stdlib, Python 3.8) never decides a limit itself.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

MIB = 1024 * 1024
SANDBOX_UID = 65534  # nobody
IDLE_CMD = ["sleep", "infinity"]  # the init's only child: the container idles until an exec runs


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 256
    cpus: float = 1.0
    pids: int = 64
    work_mb: int = 64
    tmp_mb: int = 64
    output_bytes: int = MIB  # stdout and stderr each, counted while streaming
    timeout_s: float = 10.0  # wall time of the run (compile has its own, the same)
    nofile: int = 256
    fsize_mb: int = 64

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _tmpfs(size_mb: int, exec_ok: bool) -> str:
    # nosuid/nodev always; noexec unless a compiled program must run from there.
    # owned by the sandbox user: Docker copies the mount point's own mode (root's 0755 for
    # /work) over any mode= option, and then nobody could write there.
    opts = [
        "rw",
        "nosuid",
        "nodev",
        f"size={size_mb}m",
        f"uid={SANDBOX_UID}",
        f"gid={SANDBOX_UID}",
        "mode=0700",
    ]
    opts.insert(1, "exec" if exec_ok else "noexec")  # said either way: Docker's default is noexec
    return ",".join(opts)


def pool_id(config: dict[str, Any]) -> str:
    """Containers from the same config share a pool: its id is the config's hash."""
    blob = json.dumps({k: v for k, v in config.items() if k != "Labels"}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def container_config(image: str, lang: str, limits: Limits, compiled: bool) -> dict[str, Any]:
    """POST /containers/create body for one sandbox container of `lang`.

    `compiled`: the language runs a binary it built in /work, so /work may not be noexec
    (/tmp stays noexec either way). Labels carry the pool id (the hash of everything else), so
    an agent started later adopts only idle containers made with exactly these limits.
    """
    memory = limits.memory_mb * MIB
    host_config: dict[str, Any] = {
        "NetworkMode": "none",
        "ReadonlyRootfs": True,
        "Tmpfs": {"/work": _tmpfs(limits.work_mb, compiled), "/tmp": _tmpfs(limits.tmp_mb, False)},
        "CapDrop": ["ALL"],
        "SecurityOpt": ["no-new-privileges"],  # the default seccomp profile stays: not "seccomp=unconfined"
        "PidsLimit": limits.pids,
        "Memory": memory,
        "MemorySwap": memory,  # equal: no swap on top of the memory limit
        "NanoCpus": int(limits.cpus * 1e9),
        # No nproc ulimit: RLIMIT_NPROC counts every process of the uid on the whole host, and
        # every sandbox runs as nobody, so 32 idle containers (init + sleep) would use up 64 and
        # the next one's init could not fork. PidsLimit caps each container's own processes.
        "Ulimits": [
            {"Name": "nofile", "Soft": limits.nofile, "Hard": limits.nofile},
            {"Name": "fsize", "Soft": limits.fsize_mb * MIB, "Hard": limits.fsize_mb * MIB},
        ],
        "Init": True,
        "LogConfig": {"Type": "none", "Config": {}},
        "AutoRemove": True,  # a killed container is removed by dockerd itself, off the run's path
        "IpcMode": "private",
        "ShmSize": limits.tmp_mb * MIB,
    }
    config: dict[str, Any] = {
        "Image": image,
        "Cmd": IDLE_CMD,
        "User": f"{SANDBOX_UID}:{SANDBOX_UID}",
        "WorkingDir": "/work",
        "Env": ["HOME=/tmp", "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"],
        "NetworkDisabled": True,
        "AttachStdin": False,
        "AttachStdout": False,
        "AttachStderr": False,
        "Tty": False,
        "HostConfig": host_config,
    }
    config["Labels"] = {"labctl.sandbox": "1", "labctl.lang": lang, "labctl.pool": pool_id(config)}
    return config


def docker_run_argv(config: dict[str, Any], argv: list[str]) -> list[str]:
    """`docker run --rm` with the same limits as `config`, running `argv`: the bench's baseline."""
    hc = config["HostConfig"]
    out = ["docker", "run", "--rm", "-i", "--network", "none", "--read-only"]
    for path, opts in hc["Tmpfs"].items():
        out += ["--tmpfs", f"{path}:{opts}"]
    out += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
    out += ["--pids-limit", str(hc["PidsLimit"]), "--memory", str(hc["Memory"])]
    out += ["--memory-swap", str(hc["MemorySwap"]), "--cpus", str(hc["NanoCpus"] / 1e9)]
    for u in hc["Ulimits"]:
        out += ["--ulimit", f"{u['Name']}={u['Soft']}:{u['Hard']}"]
    out += ["--init", "--log-driver", "none", "--ipc", "private", "--shm-size", str(hc["ShmSize"])]
    out += ["--user", config["User"], "--workdir", config["WorkingDir"]]
    for e in config["Env"]:
        out += ["--env", e]
    for k, v in config["Labels"].items():
        if k != "labctl.pool":
            out += ["--label", f"{k}={v}"]
    return [*out, config["Image"], *argv]
