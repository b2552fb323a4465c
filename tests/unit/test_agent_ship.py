"""call_agent against this machine's own agent (a local connection): the agent's error kind
reaches the controller, and so do the outcomes around it (cancelled, no Python, no JSON)."""

from __future__ import annotations

import hashlib
import io
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from labctl.hosts import agent_ship
from labctl.hosts.agent_ship import CANCELLED, NO_JSON, NO_PYTHON, AgentFailed, agent_event, call_agent
from labctl.hosts.context import Context
from labctl.hosts.fanout import HostRun
from labctl.inventory.model import Host


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Context:
    # The agent goes to (or runs from memory instead of) a folder of this test, not ~/.cache.
    monkeypatch.setattr(agent_ship, "agent_dir", lambda host: str(tmp_path / "agent"))
    return Context.create(inventory_path=Path("unused.yaml"), console=Console(stderr=True))


def here(python: str = sys.executable) -> Host:
    return Host(name="here", address="127.0.0.1", connection="local", python=python)


def ask(ctx: Context, host: Host, command: str, args: dict[str, object], read_only: bool = False) -> object:
    return call_agent(HostRun(ctx, host, threading.Event()), command, args, read_only=read_only)


@pytest.mark.parametrize("read_only", [True, False])  # from memory, then as the uploaded zipapp
def test_the_agents_error_kind_survives_call_agent(ctx: Context, tmp_path: Path, read_only: bool) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    # The cache commands live in a sub-package of the agent: both ways of running it import it.
    state = ask(ctx, here(), "cache.state", {"cache": str(cache)}, read_only=read_only)
    assert isinstance(state, dict) and state["exists"] is True and state["models"] == {}
    with pytest.raises(AgentFailed) as e:
        ask(ctx, here(), "cache.pin", {"cache": str(cache), "model": "nope"}, read_only=read_only)
    assert e.value.kind == "not_cached"
    assert e.value.message == f"here: agent 'cache.pin' failed: nope is not in the cache {cache}."
    with pytest.raises(AgentFailed) as e:
        ask(ctx, here(), "no_such_command", {}, read_only=read_only)
    assert e.value.kind == "unknown_command"


def test_outcomes_around_the_agent_have_kinds_too(ctx: Context) -> None:
    with pytest.raises(AgentFailed) as e:
        ask(ctx, here("/nonexistent/python3"), "ping", {}, read_only=True)
    assert e.value.kind == NO_PYTHON and "no Python at /nonexistent/python3" in e.value.message
    with pytest.raises(AgentFailed) as e:
        ask(ctx, here("/bin/echo"), "ping", {}, read_only=True)  # prints, but not an answer
    assert e.value.kind == NO_JSON and "did not answer in JSON" in e.value.message
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(AgentFailed) as e:
        call_agent(HostRun(ctx, here(), cancel), "ping", read_only=True)
    assert e.value.kind == CANCELLED and e.value.message == "here: cancelled."


def test_agent_event_reads_only_the_events_agents_report_on_stderr() -> None:
    line = '{"event": "progress", "done": 1}'
    assert agent_event("stderr", line, "progress") == {"event": "progress", "done": 1}
    assert agent_event("stderr", line) == {"event": "progress", "done": 1}  # any event
    assert agent_event("stderr", line, "listening", "locked") is None  # not one asked for
    assert agent_event("stdout", line) is None  # stdout is the answer, not progress
    assert agent_event("stderr", '{"done": 1}') is None  # JSON, but no event
    assert agent_event("stderr", "{not json") is None
    assert agent_event("stderr", "[1, 2]") is None


def test_each_command_runs_from_memory_with_only_the_modules_it_imports(tmp_path: Path) -> None:
    """The in-memory agent (read-only calls) carries only what its command imports, so its
    command line stays under the kernel's 128 KiB cap however large the agent grows; and what
    it carries is enough: every handler imports from it alone (a Python with no labctl)."""
    import base64
    import subprocess
    import zlib

    from labctl.agent.commands import COMMANDS
    from labctl.hosts.agent_ship import IN_MEMORY, agent_blob, agent_zip

    whole = len(base64.b64encode(agent_zip()[0]))
    for command, handler in sorted(COMMANDS.items()):
        blob = agent_blob(command)
        assert len(IN_MEMORY) + len(blob) + 4096 < 128 * 1024, command
        assert len(blob) < whole, command
        if not isinstance(handler, str):
            continue
        folder = tmp_path / command
        folder.mkdir()
        (folder / "agent.zip").write_bytes(zlib.decompress(base64.b64decode(blob)))
        module, _, attr = handler.partition(":")
        code = (
            "import importlib, sys; sys.path.insert(0, sys.argv[1]); "
            f"m = importlib.import_module('labctl.agent{module}'); getattr(m, '{attr}')"
        )
        proc = subprocess.run(
            ["/usr/bin/python3", "-I", "-c", code, str(folder / "agent.zip")], capture_output=True, text=True
        )
        assert proc.returncode == 0, (command, proc.stderr)


@pytest.mark.parametrize("which", ["zip", "blob"])
def test_the_agent_is_built_once_however_many_threads_ask_at_once(
    monkeypatch: pytest.MonkeyPatch, which: str, tmp_path: Path
) -> None:
    """fan_out asks from every host's thread together: one build, the same bytes for all."""
    import time
    import types

    monkeypatch.setenv("LABCTL_ZIP_CACHE", str(tmp_path / "cache"))  # empty: the zip is built

    builds = []

    def counting_zipfile(file: object, mode: str = "r", *args: object, **kw: object) -> zipfile.ZipFile:
        if mode == "w":  # each build writes one zip; reading the zipapp back is no build
            builds.append(threading.get_ident())
            time.sleep(0.05)  # a slow build: without the lock every thread would be inside it
        return zipfile.ZipFile(file, mode, *args, **kw)  # type: ignore[call-overload]

    fake = types.SimpleNamespace(**{**vars(zipfile), "ZipFile": counting_zipfile})
    ask = {"zip": agent_ship.agent_zip, "blob": lambda: agent_ship.agent_blob("facts.collect")}[which]
    agent_ship.agent_zip()  # the zipapp built before (blob: its own build is what is counted)
    agent_ship.agent_blob.cache_clear()  # type: ignore[attr-defined]
    if which == "zip":
        agent_ship.agent_zip.cache_clear()  # type: ignore[attr-defined]
        # The build just above may have filled the cache (when this process had not built the
        # zip before): empty it, so that the threads below must build.
        for cached in (tmp_path / "cache").glob("*"):
            cached.unlink()
    monkeypatch.setattr(agent_ship, "zipfile", fake)
    start = threading.Barrier(16)
    results: list[object] = []

    def one() -> None:
        start.wait()
        results.append(ask())

    threads = [threading.Thread(target=one) for _ in range(16)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        again = ask()  # later calls come from the cache
    finally:
        monkeypatch.undo()
    assert len(builds) == 1 and len(results) == 16
    assert all(r == results[0] for r in results) and again == results[0]


def test_a_read_only_call_runs_the_cached_agent_and_extracts_nothing(ctx: Context, tmp_path: Path) -> None:
    import shutil

    assert isinstance(ask(ctx, here(), "ping", {}), dict)  # uploads the zipapp and extracts it beside it
    folder = tmp_path / "agent" / f"agent-{agent_ship.agent_zip()[1]}"
    assert (folder / ".complete").is_file()
    shutil.rmtree(folder)
    assert isinstance(ask(ctx, here(), "ping", {}, read_only=True), dict)
    assert sorted(p.name for p in (tmp_path / "agent").iterdir()) == [folder.name + ".pyz"]


@pytest.fixture
def zip_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A cache folder of the test's own and an agent package copy it may change."""
    import shutil

    import labctl.agent

    pkg = tmp_path / "pkg" / "agent"
    shutil.copytree(Path(labctl.agent.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(labctl.agent, "__file__", str(pkg / "__init__.py"))
    monkeypatch.setenv("LABCTL_ZIP_CACHE", str(tmp_path / "cache"))
    agent_ship.agent_zip.cache_clear()  # type: ignore[attr-defined]
    yield tmp_path / "cache"
    agent_ship.agent_zip.cache_clear()  # type: ignore[attr-defined]


def test_the_built_agent_zip_is_kept_and_read_back_identical(zip_cache: Path) -> None:
    data, digest = agent_ship.agent_zip()
    [kept] = list(zip_cache.glob("agent-*.pyz"))
    assert kept.read_bytes() == data and kept.name.endswith(f"-{hashlib.sha256(data).hexdigest()}.pyz")
    agent_ship.agent_zip.cache_clear()  # type: ignore[attr-defined]
    # Read back, not rebuilt: no zip is written at all.
    real = zipfile.ZipFile
    calls: list[object] = []

    def counting(*a: object, **k: object) -> zipfile.ZipFile:
        calls.append(a)
        return real(*a, **k)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(agent_ship.zipfile, "ZipFile", counting)
        assert agent_ship.agent_zip() == (data, digest)
    assert calls == []


def test_a_changed_source_file_is_a_new_zip_and_a_damaged_copy_is_built_again(zip_cache: Path) -> None:
    import labctl.agent

    _, first_digest = agent_ship.agent_zip()
    handler = Path(labctl.agent.__file__).parent / "commands.py"
    handler.write_text(handler.read_text() + "\n# changed\n")
    agent_ship.agent_zip.cache_clear()  # type: ignore[attr-defined]
    second, second_digest = agent_ship.agent_zip()
    assert second_digest != first_digest and len(list(zip_cache.glob("agent-*.pyz"))) == 2
    [kept] = [p for p in zip_cache.glob("agent-*.pyz") if p.read_bytes() == second]
    damaged = bytearray(second)
    damaged[len(damaged) // 2] ^= 0xFF
    kept.write_bytes(bytes(damaged))
    agent_ship.agent_zip.cache_clear()  # type: ignore[attr-defined]
    assert agent_ship.agent_zip() == (second, second_digest)  # the damaged copy is not shipped


def test_a_cache_folder_that_cannot_be_written_still_gives_the_zip(
    zip_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    zip_cache.parent.joinpath("file").write_text("not a folder")
    monkeypatch.setenv("LABCTL_ZIP_CACHE", str(zip_cache.parent / "file" / "cache"))
    data, digest = agent_ship.agent_zip()
    assert hashlib.sha256(data).hexdigest()[:16] == digest
    assert zipfile.ZipFile(io.BytesIO(data)).testzip() is None
