"""Ship labctl's agent to a host as a zipapp, cached there by content hash, and call it.

The agent (labctl/agent/) is stdlib-only Python that runs with the host's own
interpreter and answers one JSON object per call: one round trip per step. The zipapp
is uploaded once per version; later calls find it by hash and run straight away.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import json
import shlex
import threading
import uuid
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labctl.agent import paths
from labctl.errors import HostError
from labctl.fanout import HostRun, on_host
from labctl.inventory.model import Host
from labctl.transport.base import LineCallback

if TYPE_CHECKING:
    from labctl.context import Context

ROOT_MAIN = b"from labctl.agent.__main__ import main\nimport sys\nsys.exit(main())\n"
# Runs the agent from a zip held in memory (argv), for calls that must not write to the
# host, such as `provision --check` before the agent is cached there.
IN_MEMORY = r"""
import base64, importlib.abc, importlib.util, io, sys, zipfile
z = zipfile.ZipFile(io.BytesIO(base64.b64decode(sys.argv[1])))
names = set(z.namelist())
class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        base = name.replace(".", "/")
        for cand, pkg in ((base + "/__init__.py", True), (base + ".py", False)):
            if cand in names:
                return importlib.util.spec_from_loader(name, self, origin="mem:" + cand, is_package=pkg)
        return None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        name = module.__spec__.origin[4:]
        exec(compile(z.read(name), name, "exec"), module.__dict__)
sys.meta_path.insert(0, Finder())
sys.argv = ["agent"] + sys.argv[2:]
from labctl.agent.__main__ import main
sys.exit(main())
"""
MISSING_RC = 197  # the wrapper's "no agent of this hash here yet"
MAX_ARGV = 100_000
# AgentFailed kinds for what went wrong around the agent rather than inside it.
CANCELLED = "cancelled"  # the caller's cancel flag closed the command
NO_PYTHON = "no_python"  # the host has no interpreter at its `python`
NO_JSON = "no_json"  # the agent printed no answer: killed, crashed, or an interpreter too old
_EPOCH = (2020, 1, 1, 0, 0, 0)  # fixed timestamps keep the hash a function of the code alone


class AgentFailed(HostError):
    """The agent could not do what call_agent asked: `kind` says why, for code to branch on.

    The agent's own kind when it answered (see labctl/agent/commands.py: "not_cached", "busy",
    "cache_full", ...), else CANCELLED, NO_PYTHON or NO_JSON. A command that ran past its
    timeout raises CommandTimeout instead, as any command does.
    """

    def __init__(self, message: str, hint: str = "", kind: str = "failed") -> None:
        super().__init__(message, hint)
        self.kind = kind


@functools.cache
def agent_zip() -> tuple[bytes, str]:
    """The agent zipapp's bytes and their short sha256."""
    import labctl.agent

    pkg = Path(labctl.agent.__file__).parent
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in [("__main__.py", ROOT_MAIN), ("labctl/__init__.py", b"")]:
            z.writestr(zipfile.ZipInfo(name, _EPOCH), data)
        for f in sorted(pkg.rglob("*.py")):
            info = zipfile.ZipInfo("labctl/agent/" + f.relative_to(pkg).as_posix(), _EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, f.read_bytes())
    data = buf.getvalue()
    return data, hashlib.sha256(data).hexdigest()[:16]


def agent_dir(host: Host) -> str:
    """Where `host` keeps labctl's agent: root's in labctl's host folder, other users' in their home."""
    if host.connection == "local":
        return str(Path.home() / paths.agent_dir(root=False))
    return paths.agent_dir(root=host.user == "root")


def _ensure_dir(run: HostRun, directory: str) -> None:
    mk = run.conn.run(f"mkdir -p {shlex.quote(directory)} && chmod 700 {shlex.quote(directory)}", timeout=30)
    if mk.rc != 0:
        raise HostError(
            f"{run.host.name}: cannot create {directory} for labctl's agent: {mk.stderr.strip()}.",
            "Give the SSH user a writable home directory, or connect as root.",
        )


def call_agent(
    run: HostRun,
    command: str,
    args: dict[str, Any] | None = None,
    timeout: float = 120.0,
    read_only: bool = False,
    on_line: LineCallback | None = None,
) -> Any:
    """Run `command` in the host's agent and return its JSON answer (uploading it first if needed).

    `read_only`: write nothing on the host; an agent not cached there yet runs from memory.
    `on_line`: called with ("stdout" | "stderr", line) as output arrives, for long-running
    commands that report progress on stderr.
    """
    data, digest = agent_zip()
    directory = agent_dir(run.host)
    path = f"{directory}/agent-{digest}.pyz"
    py = shlex.quote(run.host.python)
    conn = run.conn
    arg_text = json.dumps(args or {})
    if len(arg_text) > MAX_ARGV:
        # The kernel caps one argument at 128 KiB: send big args as a file instead.
        arg_path = f"{directory}/args-{uuid.uuid4().hex}.json"
        _ensure_dir(run, directory)
        conn.put_bytes(arg_text.encode(), arg_path, mode=0o600)
        arg_text = "@" + arg_path
    line = (
        f"[ -f {shlex.quote(path)} ] || exit {MISSING_RC}; "
        f"exec {py} {shlex.quote(path)} {shlex.quote(command)} {shlex.quote(arg_text)}"
    )
    result = conn.run(line, timeout=timeout, cancel=run.cancel, on_line=on_line)
    if result.rc == MISSING_RC and read_only:
        blob = base64.b64encode(data).decode()
        line = f"exec {py} -c {shlex.quote(IN_MEMORY)} {blob} {shlex.quote(command)} {shlex.quote(arg_text)}"
        result = conn.run(line, timeout=timeout, cancel=run.cancel, on_line=on_line)
    elif result.rc == MISSING_RC:
        _ensure_dir(run, directory)
        conn.put_bytes(data, path, mode=0o600)
        result = conn.run(line, timeout=timeout, cancel=run.cancel, on_line=on_line)
    if result.cancelled:
        raise AgentFailed(f"{run.host.name}: cancelled.", kind=CANCELLED)
    if result.timed_out:
        from labctl.transport.base import CommandTimeout

        raise CommandTimeout(
            f"{run.host.name}: the agent's '{command}' ran past {timeout:g} s.",
            "Raise the timeout or check the host's load.",
        )
    if result.rc == 127:
        raise AgentFailed(
            f"{run.host.name}: no Python at {run.host.python} ({result.stderr.strip()}).",
            "Install python3 on the host or set `python:` for it in the inventory.",
            NO_PYTHON,
        )
    try:
        answer = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise AgentFailed(
            f"{run.host.name}: the agent's '{command}' did not answer in JSON (rc {result.rc}): "
            f"{(result.stderr or result.stdout).strip()[-400:]}",
            f"Check that {run.host.python} is Python 3.8 or newer.",
            NO_JSON,
        ) from None
    if result.rc != 0:
        error, kind = answer, "failed"
        if isinstance(answer, dict):
            error, kind = answer.get("error", answer), str(answer.get("kind") or kind)
        raise AgentFailed(f"{run.host.name}: agent '{command}' failed: {error}.", kind=kind)
    return answer


def ask_agent(
    ctx: Context,
    host: Host,
    command: str,
    args: dict[str, Any] | None = None,
    *,
    cancel: threading.Event | None = None,
    **kw: Any,
) -> Any:
    """call_agent on one host outside a fan_out step (through fanout.on_host); raises its error."""
    return on_host(ctx, host, lambda run: call_agent(run, command, args, **kw), cancel)
