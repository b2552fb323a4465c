"""Ship labctl's agent to a host as a zipapp, cached there by content hash, and call it.

The agent (labctl/agent/) is stdlib-only Python that runs with the host's own
interpreter and answers one JSON object per call: one round trip per step. The zipapp
is uploaded once per version; later calls find it by hash and run straight away, from a folder
extracted beside it where CPython keeps the compiled modules (see BOOT).
"""

from __future__ import annotations

import ast
import base64
import functools
import hashlib
import io
import json
import shlex
import threading
import uuid
import zipfile
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from labctl.agent.core import paths
from labctl.agent.core.boot import MISSING_RC, boot_line
from labctl.hosts.fanout import HostRun, on_host
from labctl.inventory.model import Host
from labctl.output.errors import HostError
from labctl.transport.base import CommandResult, KeptAgent, LineCallback, file_error

if TYPE_CHECKING:
    from labctl.hosts.context import Context

ROOT_MAIN = b"from labctl.agent.__main__ import main\nimport sys\nsys.exit(main())\n"
# Runs the agent from a zip held in memory (argv), for calls that must not write to the
# host, such as `provision --check` before the agent is cached there. The whole command line
# is one argument of the login shell, which the kernel caps at 128 KiB: only the modules the
# command imports travel, uncompressed inside one zlib stream (see agent_blob).
IN_MEMORY = r"""
import base64, importlib.abc, importlib.util, io, sys, zipfile, zlib
z = zipfile.ZipFile(io.BytesIO(zlib.decompress(base64.b64decode(sys.argv[1]))))
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
MAX_ARGV = 100_000
# AgentFailed kinds for what went wrong around the agent rather than inside it.
CANCELLED = "cancelled"  # the caller's cancel flag closed the command
NO_PYTHON = "no_python"  # the host has no interpreter at its `python`
NO_JSON = "no_json"  # the agent printed no answer: killed, crashed, or an interpreter too old
BAD_ANSWER = "bad_answer"  # JSON, but not the shape the command answers in (declared at its handler, labctl/agent/core/spec.py)
# The agent's kinds for an OSError it could name (labctl/agent/__main__.py), with the path.
FILE_KINDS = {"disk_full": "ENOSPC", "read_only": "EROFS", "permission_denied": "EACCES"}
_EPOCH = (2020, 1, 1, 0, 0, 0)  # fixed timestamps keep the hash a function of the code alone
P = ParamSpec("P")
R = TypeVar("R")


class AgentFailed(HostError):
    """The agent could not do what call_agent asked: `kind` says why, for code to branch on.

    The agent's own kind when it answered (see labctl/agent/commands.py: "not_cached", "busy",
    "cache_full", ...), else CANCELLED, NO_PYTHON or NO_JSON. A command that ran past its
    timeout raises CommandTimeout instead, as any command does.
    """

    def __init__(self, message: str, hint: str = "", kind: str = "failed") -> None:
        super().__init__(message, hint)
        self.kind = kind


def _once(fn: Callable[P, R]) -> Callable[P, R]:
    """functools.cache, computed once per argument however many threads ask at once.

    fan_out calls agent_zip and agent_blob from every host's thread together; a bare cache lets
    each of them build the zip (about 30 ms of CPU each, under the GIL) before the first result
    is stored. One lock for all arguments: a build is short and runs once per process.
    """
    cached = functools.cache(fn)
    build = cast("Callable[P, R]", cached)  # the cache's own signature forgets the arguments' types
    lock = threading.Lock()

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        with lock:
            return build(*args, **kwargs)

    call.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
    return call


@_once
def agent_zip() -> tuple[bytes, str]:
    """The agent zipapp's bytes and their short sha256.

    Building it (reading and deflating ~100 files) cost every command that calls the agent
    tens of milliseconds before its first host was asked, so the zip is kept in this user's
    cache folder under a key of every source file's name, size and mtime: a changed file is a
    new key, and a cached zip that is unreadable or cut short is built again."""
    import labctl.agent

    pkg = Path(labctl.agent.__file__).parent
    files = sorted(pkg.rglob("*.py"))
    key = hashlib.sha256(ROOT_MAIN)
    for f in files:
        st = f.stat()
        key.update(f"{f.relative_to(pkg).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    # Named by the key and by its own sha256, which a damaged copy no longer matches.
    prefix = f"agent-{key.hexdigest()[:24]}-"
    for cached in zip_cache_dir().glob(prefix + "*.pyz"):
        try:
            data = cached.read_bytes()
        except OSError:
            continue
        digest = hashlib.sha256(data).hexdigest()
        if cached.name == f"{prefix}{digest}.pyz":
            return data, digest[:16]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in [("__main__.py", ROOT_MAIN), ("labctl/__init__.py", b"")]:
            z.writestr(zipfile.ZipInfo(name, _EPOCH), data)
        for f in files:
            info = zipfile.ZipInfo("labctl/agent/" + f.relative_to(pkg).as_posix(), _EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, f.read_bytes())
    data = buf.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    _keep(zip_cache_dir() / f"{prefix}{digest}.pyz", data)
    return data, digest[:16]


ZIPS_KEPT = 8


def zip_cache_dir() -> Path:
    """Where this user keeps built agent zips ($LABCTL_ZIP_CACHE for tests)."""
    import os

    override = os.environ.get("LABCTL_ZIP_CACHE")
    return Path(override) if override else Path.home() / paths.USER_HOME / "agent-zips"


def _keep(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all (a temp name, then rename); a cache that cannot be
    written (read-only home, full disk) only means the next command builds the zip again."""
    import os

    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        # The newest few stay (checkouts side by side); older builds are never asked for again.
        kept = sorted(path.parent.glob("agent-*.pyz"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in kept[ZIPS_KEPT:]:
            old.unlink()
    except OSError:
        try:
            tmp.unlink()
        except (OSError, UnboundLocalError):
            pass


def _module_file(name: str, files: Mapping[str, bytes]) -> str | None:
    base = name.replace(".", "/")
    for cand in (base + ".py", base + "/__init__.py"):
        if cand in files:
            return cand
    return None


def _imported(path: str, source: bytes, files: Mapping[str, bytes]) -> set[str]:
    """The agent's own modules `path` imports, anywhere in it (imports inside functions too)."""
    package = path.rpartition("/")[0].replace("/", ".")  # an __init__'s is its own folder's too
    out: set[str] = set()
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parent, *([base] if base else [])])
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            out |= _with_packages(name, files)
    return out


def _with_packages(name: str, files: Mapping[str, bytes]) -> set[str]:
    """The files of module `name` and of the packages above it (an import runs each __init__)."""
    parts = name.split(".")
    found = (_module_file(".".join(parts[:i]), files) for i in range(1, len(parts) + 1))
    return {f for f in found if f is not None}


def _table_modules(module: str, files: Mapping[str, bytes]) -> set[str]:
    """The modules named by the lazy entries of the op and probe tables `module` holds."""
    import importlib

    from labctl.agent.core.ops import Table

    path = _module_file(module, files)
    # Only a module that imports core.ops can hold a table: no other handler is imported here.
    if path is None or "labctl/agent/core/ops.py" not in _imported(path, files[path], files):
        return set()
    found = vars(importlib.import_module(module)).values()
    return {name for table in found if isinstance(table, Table) for name in table.modules()}


@_once
def agent_blob(command: str) -> str:
    """The agent's files `command` needs, for IN_MEMORY: an uncompressed zip, zlib-compressed
    whole, in base64 (a third smaller than the zipapp, whose files are compressed one by one).

    Only the modules the command's handler imports travel (found in their source, imports
    inside functions too): the command line that carries them is capped at 128 KiB by the
    kernel, and the whole agent would not fit it for long. A handler that dispatches over
    probe or op tables (labctl/agent/core/ops.py) also carries every module their lazy entries
    name, which no import in the source shows.
    """
    from labctl.agent.commands import COMMANDS

    data, _ = agent_zip()
    src = zipfile.ZipFile(io.BytesIO(data))
    files = {i.filename: src.read(i) for i in src.infolist()}
    todo = ["__main__.py", "labctl/agent/__main__.py", "labctl/agent/commands.py"]
    handler = COMMANDS.get(command)
    if isinstance(handler, str):
        module = "labctl.agent" + handler.partition(":")[0]
        todo += sorted(_with_packages(module, files))
        for name in sorted(_table_modules(module, files)):
            todo += sorted(_with_packages(name, files))
    needed: set[str] = set()
    while todo:
        path = todo.pop()
        if path in needed:
            continue
        needed.add(path)
        if path.endswith(".py"):
            todo += sorted(_imported(path, files[path], files) - needed)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as out:
        for name in sorted(needed):
            out.writestr(zipfile.ZipInfo(name, _EPOCH), files[name])
    return base64.b64encode(zlib.compress(buf.getvalue(), 9)).decode()


def agent_dir(host: Host) -> str:
    """Where `host` keeps labctl's agent: root's in labctl's host folder, other users' in their home."""
    if host.connection == "local":
        return str(Path.home() / paths.agent_dir(root=False))
    return paths.agent_dir(root=host.user == "root")


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
        conn.put_bytes(arg_text.encode(), arg_path, mode=0o600, dir_mode=0o700)
        arg_text = "@" + arg_path
    line = boot_line(run.host.python, path, digest, [command, arg_text], read_only)

    def run_boot() -> CommandResult:
        # A kept connection may run it in the agent the keeper keeps there (keeper/agents.py);
        # None: it has none to offer, and the call goes the direct way.
        if isinstance(conn, KeptAgent):
            served = conn.run_agent(
                python=run.host.python,
                path=path,
                digest=digest,
                argv=[command, arg_text],
                read_only=read_only,
                timeout=timeout,
                cancel=run.cancel,
                on_line=on_line,
            )
            if served is not None:
                return served
        return conn.run(line, timeout=timeout, cancel=run.cancel, on_line=on_line)

    result = run_boot()
    if result.rc == MISSING_RC and read_only:
        line = f"exec {py} -c {shlex.quote(IN_MEMORY)} {agent_blob(command)} {shlex.quote(command)} {shlex.quote(arg_text)}"
        result = conn.run(line, timeout=timeout, cancel=run.cancel, on_line=on_line)
    elif result.rc == MISSING_RC:
        conn.put_bytes(data, path, mode=0o600, dir_mode=0o700)
        result = run_boot()
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
        raise _no_answer(run.host, command, result.rc, result.stderr or result.stdout) from None
    if result.rc != 0:
        error, kind = answer, "failed"
        if isinstance(answer, dict):
            error, kind = answer.get("error", answer), str(answer.get("kind") or kind)
            if kind in FILE_KINDS:
                named = file_error(run.host.name, str(answer.get("path") or ""), FILE_KINDS[kind], str(error))
                raise AgentFailed(named.message, named.hint, kind)
        raise AgentFailed(f"{run.host.name}: agent '{command}' failed: {error}.", kind=kind)
    from labctl.agent.commands import answer_problem

    # The one place answers arrive: past it, code reads them as their command declares them.
    found = answer_problem(command, answer, args)
    if found is not None:
        raise _bad_answer(run.host, command, found)
    return answer


def _bad_answer(host: Host, command: str, problem: str) -> AgentFailed:
    """The host answered in JSON, but not as labctl's agent answers `command`: name the host."""
    py = shlex.quote(host.python)
    return AgentFailed(
        f"{host.name} answered `{command}` with a reply labctl cannot read: {problem}.",
        f"labctl's agent answers otherwise, so check what {py} runs there: "
        f"`labctl exec --limit {host.name} -- {py} -c 'import sys; print(sys.version)'` should print "
        "a plain Python 3.8 or newer; if it does, rerun with -v and report this message.",
        BAD_ANSWER,
    )


def agent_event(stream: str, line: str, *names: str) -> dict[str, Any] | None:
    """The JSON event in `line` when it is one an agent reported on stderr while it ran
    (`{"event": NAME, ...}`), and of one of `names` when they are given; else None."""
    if stream != "stderr" or not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict) or not isinstance(event.get("event"), str):
        return None
    if names and event["event"] not in names:
        return None
    from labctl.agent.core.spec import event_problem

    # Events are part of the answer: one of a known name that labctl cannot read is no event.
    return event if event_problem(event) is None else None


def _no_answer(host: Host, command: str, rc: int | None, output: str) -> AgentFailed:
    """The agent printed no JSON: say whether it was killed or its python could not run it."""
    tail = output.strip()[-400:]
    if rc is not None and (rc < 0 or rc >= 128):
        signal = f" by signal {rc - 128}" if rc > 128 else ""
        return AgentFailed(
            f"{host.name}: the agent's '{command}' was killed{signal} before it answered (rc {rc}): {tail}",
            "Check the host's memory (an out-of-memory kill shows in `dmesg`) and run the command again.",
            NO_JSON,
        )
    hint = "Run the command again with -v; if it repeats, check the host's python and disk."
    if "SyntaxError" in output or "ImportError" in output:
        hint = f"Check that {host.python} is Python 3.8 or newer."
    return AgentFailed(
        f"{host.name}: the agent's '{command}' did not answer in JSON (rc {rc}): {tail}", hint, NO_JSON
    )


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
