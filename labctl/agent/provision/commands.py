"""Host side of `labctl provision`: read state for many resources at once, carry out ops.

The controller sends plain data: `provision.probe` gets a list of probes and answers with what it
found, in one round trip for every resource on the host; `provision.apply` gets the ops a plan
computed and runs them in order, stopping at the first failure. Files are replaced
atomically (temp file + fsync + rename), keeping mode and owner unless told otherwise.

Which probe kinds and ops there are is declared by the features that own them (each package's
PROBES and OPS, core/ops.py); this module holds provisioning's own and dispatches over them all.
"""

from __future__ import annotations

import base64
import os
import shlex
import shutil
import subprocess
from typing import Any, Dict, List, Optional

from .. import network, provision, sandbox
from ..core.errors import AgentError
from ..core.fsutil import file_state, write_atomic
from ..core.ops import merge
from ..core.parsers import parse_mounts
from ..core.spec import Or, command


def mount_probe(p: Dict[str, Any]) -> Dict[str, Any]:
    path = os.path.realpath(p["path"])
    found: Optional[Dict[str, Any]] = None
    # Bytes, cut by parse_mounts at "\n" and " " alone: a text-mode read would also end a line at
    # a "\r" in someone's mount point, and str.split() at U+2028 or U+00A0 in one.
    with open("/proc/self/mounts", "rb") as f:
        for m in parse_mounts(f.read().decode("utf-8", "surrogateescape")):
            if m["mountpoint"] == path:
                found = {"device": m["device"], "fstype": m["fstype"], "options": m["options"].split(",")}
    if found is None:
        return {"mounted": False}
    sv = os.statvfs(path)
    found.update(
        mounted=True,
        size_bytes=sv.f_frsize * sv.f_blocks,
        used_bytes=sv.f_frsize * (sv.f_blocks - sv.f_bfree),
    )
    return found


def meminfo_probe(p: Dict[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isascii() and parts[0].isdigit():
                out[key] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    return {"total_bytes": out.get("MemTotal", 0), "available_bytes": out.get("MemAvailable", 0)}


def command_probe(p: Dict[str, Any]) -> Dict[str, Any]:
    try:
        proc = subprocess.run(
            p["argv"] if "argv" in p else ["/bin/sh", "-c", p["cmd"]],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=float(p.get("timeout", 60)),
        )
    except FileNotFoundError as e:
        return {"rc": 127, "stdout": "", "stderr": str(e)}
    except subprocess.TimeoutExpired:
        return {"rc": None, "stdout": "", "stderr": "timed out", "timed_out": True}
    return {
        "rc": proc.returncode,
        "stdout": proc.stdout.decode("utf-8", "replace"),
        "stderr": proc.stderr.decode("utf-8", "replace")[-4000:],
    }


def which_probe(p: Dict[str, Any]) -> Dict[str, Any]:
    return {"path": shutil.which(p["name"])}


def system_probe(p: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "systemd": os.path.isdir("/run/systemd/system"),
        "apt": shutil.which("apt-get") is not None,
        "uid": os.getuid(),
    }


def ids_probe(p: Dict[str, Any]) -> Dict[str, Any]:
    import grp
    import pwd

    out: Dict[str, Any] = {}
    if p.get("user"):
        try:
            entry = pwd.getpwnam(p["user"])
            out["uid"], out["home"], out["user_gid"] = entry.pw_uid, entry.pw_dir, entry.pw_gid
        except KeyError:
            out["uid_error"] = f"no user {p['user']!r} on this host"
    if p.get("group"):
        try:
            out["gid"] = grp.getgrnam(p["group"]).gr_gid
        except KeyError:
            out["gid_error"] = f"no group {p['group']!r} on this host"
    return out


def authorized_keys_probe(p: Dict[str, Any]) -> Dict[str, Any]:
    """A user's ~/.ssh/authorized_keys: where it is (from the passwd entry), and what it holds."""
    out = ids_probe({"user": p["user"]})
    if "home" in out:
        ssh_dir = os.path.join(out["home"], ".ssh")
        out["ssh_dir"] = file_state({"path": ssh_dir})
        out["path"] = ssh_dir + "/authorized_keys"
        out["file"] = file_state({"path": out["path"], "whole": True})
    return out


# The features whose PROBES and OPS `provision.probe` and `provision.apply` serve. Static
# imports of their packages (declarations only, nothing heavy), so that agent_blob finds them.
FEATURES = (network, provision, sandbox)
PROBES = merge(FEATURES, "PROBES")
OPS = merge(FEATURES, "OPS")


@command(takes={"probes": Or({}, {})}, answers={"results": {"*": {}}}, per_asked=("results", "probes"))
def probe_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """args: {"probes": {key: {"kind": ..., ...}}} -> {"results": {key: {...}}}."""
    results: Dict[str, Any] = {}
    for key, p in args["probes"].items():
        declared = PROBES.get(p.get("kind", ""))
        if declared is None:
            results[key] = {"error": "unknown probe kind {!r}".format(p.get("kind"))}
            continue
        try:
            # Loaded inside the try: a kind whose module fails to import fails alone.
            results[key] = declared.load()(p)
        except Exception as e:  # one unreadable thing must not hide the others
            results[key] = {"error": f"{type(e).__name__}: {e}"}
    return {"results": results}


def write_file_op(op: Dict[str, Any]) -> str:
    data = base64.b64decode(op["b64"]) if "b64" in op else op.get("text", "").encode("utf-8")
    path = op["path"]
    if op.get("backup") and os.path.exists(path):
        shutil.copy2(path, op["backup"])
    uid, gid = op.get("uid"), op.get("gid")
    owner = None if uid is None and gid is None else (-1 if uid is None else uid, -1 if gid is None else gid)
    # A new file the playbook gives no mode gets 0644, whatever the agent's umask.
    mode = op.get("mode")
    if mode is None and not os.path.exists(path):
        mode = 0o644
    write_atomic(path, data, mode=mode, owner=owner, durable=True, mount_point_ok=True)
    return f"wrote {path} ({len(data)} bytes)"


def chmod_op(op: Dict[str, Any]) -> str:
    os.chmod(op["path"], op["mode"])
    if op.get("uid") is not None or op.get("gid") is not None:
        uid = op.get("uid")
        gid = op.get("gid")
        os.chown(op["path"], -1 if uid is None else uid, -1 if gid is None else gid)
    return "set mode {:o} on {}".format(op["mode"], op["path"])


def mkdir_op(op: Dict[str, Any]) -> str:
    os.makedirs(op["path"], exist_ok=True)
    if op.get("mode") is not None:
        os.chmod(op["path"], op["mode"])
    return "made {}".format(op["path"])


def remove_op(op: Dict[str, Any]) -> str:
    try:
        os.unlink(op["path"])
    except FileNotFoundError:
        return "{} was already gone".format(op["path"])
    return "removed {}".format(op["path"])


def short_command(argv: List[str]) -> str:
    """A command as a person reads it in an error: an inline script (`python -c SCRIPT`) or a
    very long argument is named, not printed whole."""
    parts = []
    for a in argv:
        if "\n" in a:
            parts.append(f"<{len(a.strip().splitlines())}-line script>")
        elif len(a) > 120:
            parts.append(shlex.quote(a[:100] + "..."))
        else:
            parts.append(shlex.quote(a))
    return " ".join(parts)


def last_lines(text: str, n: int = 10) -> str:
    """The end of a command's output, where its error is (a traceback's last line, pip's reason)."""
    lines = [line.rstrip() for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-n:])[-2000:]


def run_op(op: Dict[str, Any]) -> str:
    r = command_probe({"argv": op["argv"], "timeout": op.get("timeout", 1800)})
    cmd = short_command(op["argv"])
    if r.get("timed_out"):
        raise AgentError("{} timed out after {}s".format(cmd, op.get("timeout", 1800)), "op_failed")
    if r["rc"] != 0:
        raise AgentError(
            "{} exited {}: {}".format(cmd, r["rc"], last_lines(r["stderr"] or r["stdout"])), "op_failed"
        )
    return f"ran {cmd}"


def _safe_members(tar: Any, dest: str) -> List[Any]:
    out = []
    for m in tar.getmembers():
        target = os.path.realpath(os.path.join(dest, m.name))
        if not (m.isfile() or m.isdir()) or not target.startswith(os.path.realpath(dest) + os.sep):
            raise AgentError(f"the bundle holds {m.name!r}, outside its folder or not a file", "bad_args")
        out.append(m)
    return out


def install_tree_op(op: Dict[str, Any]) -> str:
    """A release of a file tree (a tar.gz), optionally completed by `pip install --target`, put
    in place atomically: unpacked beside the others, then the `current` link swapped by a rename,
    so a reader sees the old release or the new one whole. Older releases are removed after."""
    import io
    import json
    import tarfile

    root, tag = op["root"], op["tag"]
    releases = os.path.join(root, "releases")
    os.makedirs(releases, mode=0o755, exist_ok=True)
    # A new folder every time, even for the same tag (a damaged release put back): `current`
    # keeps pointing at a whole release until the swap.
    name, n = tag, 1
    while os.path.lexists(os.path.join(releases, name)):
        name, n = f"{tag}-{n}", n + 1
    final = os.path.join(releases, name)
    staging = os.path.join(releases, f".{tag}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging, mode=0o755)
    try:
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(op["b64"])), mode="r:gz") as tar:
            tar.extractall(staging, members=_safe_members(tar, staging))
        pip = op.get("pip")
        if pip:
            target = os.path.join(staging, "lib")
            argv = [pip["python"], "-m", "pip", "install", "--quiet", "--no-input", "--target", target]
            run_op({"argv": [*argv, *pip["requirements"]], "timeout": pip.get("timeout", 1800)})
        write_atomic(
            os.path.join(staging, "install.json"),
            json.dumps(op["record"], sort_keys=True).encode(),
            mode=0o644,
        )
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    link = os.path.join(root, "current")
    tmp_link = link + f".{os.getpid()}.tmp"
    if os.path.lexists(tmp_link):
        os.unlink(tmp_link)
    os.symlink(os.path.join("releases", name), tmp_link)
    os.replace(tmp_link, link)
    for old in os.listdir(releases):
        if old != name and not old.startswith("."):
            shutil.rmtree(os.path.join(releases, old), ignore_errors=True)
    return f"installed release {tag} in {root}"


def remove_tree_op(op: Dict[str, Any]) -> str:
    if not os.path.lexists(op["path"]):
        return "{} was already gone".format(op["path"])
    shutil.rmtree(op["path"])
    return "removed {}".format(op["path"])


@command(takes={"ops": Or(["any"], [])}, answers={"done": ["any"]})
def apply_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """args: {"ops": [...]}; runs them in order and stops at the first failure."""
    done: List[str] = []
    for i, op in enumerate(args["ops"]):
        declared = OPS.get(op.get("op", ""))
        if declared is None:
            raise AgentError("unknown op {!r}".format(op.get("op")), "bad_args")
        try:
            done.append(declared.load()(op))
        except (AgentError, OSError) as e:
            message = e.message if isinstance(e, AgentError) else str(e)
            kind = e.kind if isinstance(e, AgentError) else "op_failed"
            raise AgentError(
                f"op {i + 1} ({op.get('op')}) failed after {len(done)} done: {message}", kind
            ) from None
    return {"done": done}
