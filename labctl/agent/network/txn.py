"""A network change that undoes itself unless labctl comes back to confirm it.

A change applied over SSH can cut the connection that applied it. So `network.txn_begin` backs up the
network config files and snapshots the live state, then hands the change to a keeper: a
process in its own session, detached from the SSH channel and from labctl, that applies the
change, waits, and unless the transaction was committed by then (`network.txn_commit`, from a fresh
connection that labctl opened after the change), restores the files, re-applies them and
brings the live state back (`live.restore`). labctl killed, the channel cut, the controller's
laptop closed: nothing commits, so the host goes back by itself.

One transaction per host at a time: `current` names the open one, and `network.txn_begin` refuses
while it is open. Each transaction keeps its folder (txn.json, the snapshot, the backed-up
files, the keeper's log) for `network.txn_status` and for a person looking afterwards.
Standard library only, Python 3.8.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Set

from ..core import paths
from ..core.errors import AgentError
from ..core.fsutil import write_atomic, write_json
from ..core.procs import alive
from ..core.spec import Opt, Or, command
from . import live

# The config of every way a Debian or Ubuntu host brings its network up; a change to any of
# them is undone by a revert.
CONFIG_PATHS = (
    "/etc/netplan",
    "/etc/network/interfaces",
    "/etc/network/interfaces.d",
    "/etc/systemd/network",
)
OPEN_STATES = ("armed", "applying", "applied", "reverting")
FINAL_STATES = ("committed", "reverted", "revert_incomplete")
KEEP = 10  # finished transactions kept for a person to read
POLL_S = 0.1
KEEPER_NAME = "labctl-netkeep"


def net_dir() -> str:
    return os.environ.get("LABCTL_NET_DIR") or paths.NET_DIR


def _txn_dir(txn_id: str) -> str:
    problem = paths.component_problem(txn_id)
    if problem or txn_id.startswith("."):
        raise AgentError(f"bad transaction id {txn_id!r}: {problem or 'it starts with a dot'}", "input")
    return os.path.join(net_dir(), txn_id)


@contextmanager
def _locked() -> Iterator[None]:
    """The host's transaction lock: begin, commit, abort and the keeper's state changes are
    one at a time, so a commit and a revert can never both win."""
    os.makedirs(net_dir(), mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(net_dir(), "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read(directory: str) -> Dict[str, Any]:
    with open(os.path.join(directory, "txn.json")) as f:
        return dict(json.load(f))


def _write(directory: str, doc: Dict[str, Any]) -> None:
    write_json(os.path.join(directory, "txn.json"), doc, mode=0o600)


def _current_id() -> Optional[str]:
    try:
        with open(os.path.join(net_dir(), "current")) as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def _clear_current(txn_id: str) -> None:
    if _current_id() == txn_id:
        os.unlink(os.path.join(net_dir(), "current"))


def keeper_alive(doc: Dict[str, Any]) -> bool:
    pid = doc.get("keeper_pid")
    if not isinstance(pid, int) or not alive(pid):
        return False
    # The pid may have been reused since: the keeper names itself (see _name_process).
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() == KEEPER_NAME
    except OSError:
        return False


# --- the config files a revert puts back -------------------------------------------------


def _config_files(extra: List[str]) -> List[str]:
    found: Set[str] = set()
    for base in list(CONFIG_PATHS) + extra:
        if os.path.isdir(base):
            for root, _dirs, files in os.walk(base):
                found.update(os.path.join(root, f) for f in files)
        elif os.path.isfile(base):
            found.add(base)
    return sorted(found)


def backup_files(directory: str, extra: List[str]) -> Dict[str, Any]:
    """Copy every network config file into the transaction's folder; the manifest says what
    existed (path -> mode, sha256), so a revert also removes files the change added."""
    store = os.path.join(directory, "files")
    os.makedirs(store, mode=0o700, exist_ok=True)
    manifest: Dict[str, Any] = {}
    for i, path in enumerate(_config_files(extra)):
        with open(path, "rb") as f:
            data = f.read()
        st = os.stat(path)
        copy = os.path.join(store, str(i))
        write_atomic(copy, data, mode=0o600)
        manifest[path] = {
            "copy": copy,
            "mode": st.st_mode & 0o7777,
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    return {"files": manifest, "watched": list(CONFIG_PATHS) + extra}


def restore_files(backup: Dict[str, Any]) -> List[str]:
    """Put the backed-up files back and remove the ones the change added; what changed."""
    changed: List[str] = []
    manifest = backup["files"]
    for path in _config_files([p for p in backup["watched"] if p not in CONFIG_PATHS]):
        if path not in manifest:
            os.unlink(path)
            changed.append("removed " + path)
    for path, entry in sorted(manifest.items()):
        try:
            with open(path, "rb") as f:
                same = hashlib.sha256(f.read()).hexdigest() == entry["sha256"]
        except FileNotFoundError:
            same = False
        if not same:
            with open(entry["copy"], "rb") as f:
                data = f.read()
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_atomic(path, data, mode=entry["mode"], durable=True)
            changed.append("restored " + path)
    return changed


# --- the keeper ----------------------------------------------------------------------------


def _run(argv: List[str], timeout: float) -> Dict[str, Any]:
    start = time.time()
    try:
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout
        )
        rc: Optional[int] = proc.returncode
        out = proc.stdout.decode("utf-8", "replace")
    except subprocess.TimeoutExpired as e:
        rc, out = (
            None,
            (e.stdout or b"").decode("utf-8", "replace") + f"\n(stopped after {timeout:g} s)",
        )
    except OSError as e:
        rc, out = 127, str(e)
    return {"argv": argv, "rc": rc, "output": out[-4000:], "seconds": round(time.time() - start, 3)}


def _set(directory: str, **changes: Any) -> Dict[str, Any]:
    with _locked():
        doc = _read(directory)
        doc.update(changes)
        _write(directory, doc)
        return doc


def _apply(directory: str, doc: Dict[str, Any]) -> bool:
    """Write the change's files and run its commands; False at the first that fails."""
    steps: List[Dict[str, Any]] = []
    ok = True
    for path, entry in sorted((doc.get("files") or {}).items()):
        try:
            if entry is None:
                if os.path.exists(path):
                    os.unlink(path)
                steps.append({"file": path, "removed": True})
            else:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                write_atomic(path, entry["text"].encode(), mode=int(entry.get("mode", 0o600)), durable=True)
                steps.append({"file": path, "written": True})
        except OSError as e:
            steps.append({"file": path, "error": str(e)})
            ok = False
            break
    if ok:
        for argv in doc.get("commands") or []:
            step = _run(list(argv), float(doc.get("command_timeout", 60)))
            steps.append(step)
            if step["rc"] != 0:
                ok = False
                break
    _set(directory, apply={"steps": steps, "ok": ok, "ended_at": time.time()})
    return ok


def _revert(directory: str, reason: str) -> None:
    doc = _read(directory)
    report: Dict[str, Any] = {"reason": reason, "started_at": time.time()}
    try:
        with open(os.path.join(directory, "backup.json")) as f:
            backup = json.load(f)
        report["files"] = restore_files(backup)
    except (OSError, ValueError) as e:
        report["files_error"] = str(e)
        report["files"] = []
    if report["files"]:
        # The restored files are what the host boots with; re-applying them is how its
        # network service learns of them. Failures here are kept: live.restore still runs.
        report["reapply"] = [
            _run(list(argv), float(doc.get("command_timeout", 60))) for argv in doc.get("reapply") or []
        ]
    with open(os.path.join(directory, "snapshot.json")) as f:
        old = json.load(f)
    owned = live.owned_links(old, live.snapshot(), change_text(doc))
    report["owned_links"] = owned
    report.update(live.restore(old, owned))
    report["ended_at"] = time.time()
    state = "reverted" if not report["differences"] else "revert_incomplete"
    with _locked():
        doc = _read(directory)
        doc.update(state=state, revert=report)
        _write(directory, doc)
        _clear_current(doc["id"])


def change_text(doc: Dict[str, Any]) -> str:
    """All the change says, for finding the links it owns (see live.owned_links)."""
    parts = [json.dumps(doc.get("commands") or [])]
    parts += [str((entry or {}).get("text", "")) for entry in (doc.get("files") or {}).values()]
    return "\n".join(parts)


def keep(directory: str) -> None:
    """The keeper: apply, then wait for a commit until the deadline, else revert."""
    doc = _read(directory)
    start = time.monotonic()
    deadline = start + float(doc["revert_after"])
    time.sleep(float(doc.get("apply_delay", 1.0)))  # labctl's answer to network.txn_begin gets out first
    _set(directory, state="applying", applying_at=time.time())
    ok = _apply(directory, doc)
    with _locked():
        doc = _read(directory)
        if doc.get("state") == "applying":
            doc["state"] = "applied" if ok else "reverting"
            doc["applied_at"] = time.time()
            _write(directory, doc)
    if not ok:
        _revert(directory, "the change failed on the host")
        return
    while True:
        with _locked():
            doc = _read(directory)
            if doc.get("state") == "committed":
                return
            why = None
            if doc.get("abort"):
                why = "labctl asked for it: " + str(doc["abort"])
            elif time.monotonic() >= deadline:
                why = "not confirmed within {:g} s".format(float(doc["revert_after"]))
            if why:
                doc["state"] = "reverting"
                doc["reverting_at"] = time.time()
                _write(directory, doc)
        if why:
            _revert(directory, why)
            return
        time.sleep(POLL_S)


def _name_process(name: bytes) -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.prctl(15, name, 0, 0, 0)  # PR_SET_NAME: `ps` shows the keeper for what it is
    except (OSError, AttributeError):
        pass


def _detach(directory: str) -> int:
    """Start the keeper as a grandchild in its own session (the SSH channel's end, its
    watchdog and a SIGHUP do not reach it) with no file of this process open; its pid."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child; the integration tests check what it did
        try:
            os.close(r)
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_IGN)
            _name_process(KEEPER_NAME.encode())  # before its pid is told: keeper_alive checks the name
            null = os.open(os.devnull, os.O_RDONLY)
            log = os.open(
                os.path.join(directory, "keeper.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
            )
            os.dup2(null, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.write(w, str(os.getpid()).encode())
            os.close(w)
            os.closerange(3, 4096)
            os.chdir("/")
            sys.stdout = os.fdopen(1, "w", buffering=1)
            sys.stderr = sys.stdout
            keep(directory)
        except BaseException as e:
            try:
                sys.stderr.write(f"keeper failed: {type(e).__name__}: {e}\n")
            finally:
                os._exit(1)
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    data = b""
    while True:
        chunk = os.read(r, 64)
        if not chunk:
            break
        data += chunk
    os.close(r)
    if not data:
        raise AgentError(f"the keeper did not start (see {directory}/keeper.log)", "failed")
    return int(data)


# --- the agent commands --------------------------------------------------------------------


def _public(doc: Dict[str, Any]) -> Dict[str, Any]:
    out = {k: v for k, v in doc.items() if k != "files"}
    out["files"] = sorted(doc.get("files") or {})
    out["keeper_running"] = keeper_alive(doc)
    return out


def open_transaction() -> Optional[Dict[str, Any]]:
    """The transaction still open on this host (its keeper may have died), or None."""
    txn_id = _current_id()
    if txn_id is None:
        return None
    try:
        doc = _read(_txn_dir(txn_id))
    except (OSError, ValueError, AgentError):
        return {"id": txn_id, "state": "unreadable"}
    return _public(doc) if doc.get("state") not in FINAL_STATES else None


def _prune() -> None:
    try:
        names = [n for n in os.listdir(net_dir()) if os.path.isfile(os.path.join(net_dir(), n, "txn.json"))]
    except FileNotFoundError:
        return
    names.sort(key=lambda n: os.path.getmtime(os.path.join(net_dir(), n, "txn.json")))
    current = _current_id()
    for name in names[:-KEEP]:
        if name != current:
            shutil.rmtree(os.path.join(net_dir(), name), ignore_errors=True)


@command(
    takes={
        "id": Or("str", ""),
        "label": Or("str", "network change"),
        "revert_after": Opt("num", 90.0),
        "files": Or({}, {}),
        "commands": Or(["any"], []),
        "reapply": Or(["any"], []),
        "command_timeout": Opt("num?", None),  # null or left out: half of revert_after, at most 60 s
        "apply_delay": Opt("num", 1.0),
    },
    answers={"id?": "str", "keeper_pid?": "int?", "deadline_at?": "time"},
)
def begin_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """args: {id, label, revert_after, files: {path: {text, mode} | None}, commands: [argv],
    reapply: [argv], command_timeout, apply_delay}. Refused while another one is open."""
    txn_id = args["id"]
    directory = _txn_dir(txn_id)
    revert_after = args["revert_after"]
    if not 1 <= revert_after <= 3600:
        raise AgentError(f"revert_after must be 1-3600 s, not {revert_after:g}", "input")
    with _locked():
        other = open_transaction()
        if other is not None:
            raise AgentError(
                "another network transaction is open on this host: {} ({}, state {}, {})".format(
                    other.get("id"),
                    other.get("label", "?"),
                    other.get("state"),
                    "its keeper reverts it by itself"
                    if other.get("keeper_running")
                    else "its keeper is not running",
                ),
                "busy",
            )
        _prune()
        os.makedirs(directory, mode=0o700)
        files = args["files"]
        write_json(os.path.join(directory, "backup.json"), backup_files(directory, sorted(files)), mode=0o600)
        write_json(os.path.join(directory, "snapshot.json"), live.snapshot(), mode=0o600)
        doc = {
            "id": txn_id,
            "label": args["label"],
            "state": "armed",
            "created_at": time.time(),
            "deadline_at": time.time() + revert_after,
            "revert_after": revert_after,
            "files": files,
            "commands": args["commands"],
            "reapply": args["reapply"],
            "command_timeout": min(60.0, revert_after / 2)
            if args["command_timeout"] is None
            else args["command_timeout"],
            "apply_delay": args["apply_delay"],
        }
        _write(directory, doc)
        with open(os.path.join(net_dir(), "current"), "w") as f:
            f.write(txn_id)
    pid = _detach(directory)
    _set(directory, keeper_pid=pid)
    return {"id": txn_id, "keeper_pid": pid, "deadline_at": doc["deadline_at"], "dir": directory}


@command(
    takes={"id": Or("str", ""), "compare": Opt("bool", False)},
    answers={"state?": "str?", "differences?": (["str"], "null")},
)
def status_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """args: {id, compare: bool}. The transaction's record; with compare, what of the live
    state differs from the snapshot taken before the change."""
    directory = _txn_dir(args["id"])
    try:
        doc = _read(directory)
    except FileNotFoundError:
        raise AgentError("no network transaction {} on this host".format(args["id"]), "not_found") from None
    out = _public(doc)
    if args["compare"]:
        with open(os.path.join(directory, "snapshot.json")) as f:
            old = json.load(f)
        now = live.snapshot()
        out["differences"] = live.differences(old, now, live.owned_links(old, now, change_text(doc)))
    return out


@command(
    takes={"id": Or("str", "")},
    answers={"committed": "bool", "state?": "str?"},
)
def commit_command(args: Dict[str, Any]) -> Dict[str, Any]:
    directory = _txn_dir(args["id"])
    with _locked():
        doc = _read(directory)
        if doc.get("state") == "applied" and not doc.get("abort"):
            doc.update(state="committed", committed_at=time.time())
            _write(directory, doc)
            _clear_current(doc["id"])
            return {"committed": True, "state": "committed"}
        return {"committed": False, "state": doc.get("state")}


@command(
    takes={"id": Or("str", ""), "reason": Or("str", "aborted")},
    answers={"state?": "str?", "keeper_running?": "bool"},
)
def abort_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """Ask the keeper to revert now (labctl's verification failed)."""
    directory = _txn_dir(args["id"])
    with _locked():
        doc = _read(directory)
        if doc.get("state") in OPEN_STATES and not doc.get("abort"):
            doc["abort"] = args["reason"]
            _write(directory, doc)
        return {"state": doc.get("state"), "keeper_running": keeper_alive(doc)}


def open_probe(p: Dict[str, Any]) -> Dict[str, Any]:
    """Provision probe kind "net_txn": the open transaction, for a preflight."""
    return {"open": open_transaction()}
