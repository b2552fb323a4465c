"""Shared fixtures. The simulated lab comes up once per session for the integration tests."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# No per-example deadline: CI shares two cores, and a slow example is not a wrong one. The same
# examples every run, so CI's verdict does not depend on a draw; LABCTL_HYPOTHESIS=explore draws
# new ones, ten times as many, to look for what the fixed set misses.
settings.register_profile("labctl", deadline=None, derandomize=True)
settings.register_profile("explore", deadline=None, max_examples=1000)
settings.load_profile(os.environ.get("LABCTL_HYPOTHESIS", "labctl"))

REPO = Path(__file__).resolve().parents[1]

# The connection keeper (labctl.keeper): integration tests run as a user runs labctl, with
# keeping on (`suite_keeper` below), in a keeper folder of this test process's own (each xdist
# worker has one); unit tests run without one, so that no test of a few milliseconds leaves a
# keeper process behind. LABCTL_KEEPER=off runs the whole suite without keeping.
KEEPING = os.environ.get("LABCTL_KEEPER", "on").strip().lower() not in ("0", "off", "no", "false")
os.environ["LABCTL_KEEPER"] = "off"

# A shell that starts pytest in the background without job control (`cmd &` in a script, nohup)
# hands it SIGINT ignored, and every labctl the tests start would inherit that: the Ctrl-C tests
# would wait forever. With a handler here, a child starts with SIGINT at its default, as from a
# terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _drop_worker_terminal_size() -> None:
    """An xdist worker starts with COLUMNS=80 and LINES=24 that its parent set for itself, not
    that the user exported. labctl wraps its tables at COLUMNS (and not at all into a pipe), so the
    CLI under test would print otherwise on a worker than in a run without workers: a message
    broken across a table's lines. What the user really exported stays."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    try:
        exported = Path(f"/proc/{os.getppid()}/environ").read_bytes().split(b"\0")
    except OSError:
        return
    for name in ("COLUMNS", "LINES"):
        if not any(e.startswith(f"{name}=".encode()) for e in exported):
            os.environ.pop(name, None)


_drop_worker_terminal_size()
SIM_HOSTS = ["m5", "irina", "pharaoh", "workstation"]
# `labctl train` settings for a tiny model: a real run on the simulated lab in seconds.
TRAIN_TINY = [
    "--set", "batch_size_per_gpu=8", "--set", "seq_len=64", "--set", "model.d_model=64",
    "--set", "model.n_layers=2", "--set", "model.n_heads=4", "--set", "model.d_ff=256",
    "--set", "lr=3e-3", "--set", "warmup_steps=5", "--set", "log_every=5",
]  # fmt: skip


# The integration half runs on pytest-xdist workers (`--dist loadgroup`), each with a simulated lab
# of its own (`sim_slot`). What those labs do not separate is this machine: its dockerd (images,
# daemon.json) and what a `connection: local` host changes here (/var/lib/labctl, its provision
# lock). A test that uses either says so with this mark, and all of them run one after another on
# one worker. A test that asks for `docker_images` gets the mark by itself.
ON_THIS_MACHINE = pytest.mark.xdist_group("this-machine")
# This machine's one-node Slurm: its tests run one after another too, but beside the group above,
# since they touch neither Docker nor what a `connection: local` provision changes (their jobs
# train from a folder of their own).
ON_SLURM = pytest.mark.xdist_group("slurm")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the integration tests for `--dist loadgroup`: this machine's tests in one group, every
    other module in a group of its own, so that a module's fixtures are built once, on one worker,
    as in a run without workers."""
    if not getattr(config.option, "loadgroup", False):  # set on xdist's workers under --dist loadgroup
        return
    for item in items:
        if item.get_closest_marker("integration") is None:
            continue
        group = _group(item)
        if group is None:
            group = "this-machine" if "docker_images" in getattr(item, "fixturenames", ()) else item.path.stem
        _name_group(item, group)


def _group(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    return str(mark.args[0]) if mark and mark.args else None


def _name_group(item: pytest.Item, group: str) -> None:
    """Append "@group" to the test's id, which is how xdist's scheduler reads the group. xdist 3.8
    does this itself by setting `item._nodeid`, which pytest 9.2 no longer reads (the id is
    `item._id`), so every test would go out alone and two workers would share this machine's
    Docker at once; this does it the way pytest 9.2 keeps the id, and fails loudly if that changes."""
    from _pytest.nodeid import coerce_node_id

    if not item.nodeid.endswith(f"@{group}"):
        item._id = coerce_node_id(f"{item.nodeid}@{group}")  # type: ignore[attr-defined]
    if not item.nodeid.endswith(f"@{group}"):
        raise pytest.UsageError(
            f"cannot name xdist group {group!r} in test id {item.nodeid!r}: pytest changed"
        )


def can_run_sim() -> str | None:
    """Why the simulated lab cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if not Path("/usr/sbin/sshd").exists():
        return "needs openssh-server (/usr/sbin/sshd)"
    if shutil.which("ip") is None:
        return "needs iproute2"
    return None


@pytest.fixture(scope="session")
def lab() -> Iterator[object]:
    """A 4-host simulated lab (the seed lab's hosts) on its own bridge and subnet."""
    reason = can_run_sim()
    if reason:
        pytest.skip(f"simulated lab unavailable: {reason}")
    from labctl.sim import down, up

    slot = sim_slot()
    sim_dir = _claim_sim_slot(slot)
    sim = up(
        sim_dir, hosts=SIM_HOSTS, bridge=f"lctest{slot}", prefix="lct-" if slot == 0 else f"lct{slot}-",
        subnet=f"10.251.{slot}.0/24",
    )  # fmt: skip
    _LONG_LIVED.add(str(sim.inventory_path.absolute()))
    try:
        yield sim
    finally:
        down(sim_dir)
        (sim_dir.parent / f"{sim_dir.name}.owner").unlink(missing_ok=True)


def sim_slot() -> int:
    """This process's simulated-lab slot: its own bridge, namespaces and subnet.

    LABCTL_TEST_SIM_SLOT sets the first slot, so that two sessions on one machine (a CI run beside a
    developer's) do not tear down each other's lab; each pytest-xdist worker (gw0, gw1, ...) takes
    the next one up, so the integration half's workers each have a lab of their own.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(os.environ.get("LABCTL_TEST_SIM_SLOT", "0")) + int(worker.removeprefix("gw") or 0)


def _started(pid: int) -> str:
    """The process's start time in clock ticks since boot ("" when it is gone): with the pid it
    names one process, so a reused pid is never taken for a live session."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _claim_sim_slot(slot: int) -> Path:
    """The slot's sim folder, at a fixed path so that a session killed before its teardown (its
    bridge, namespaces and iptables rule outlive it) is found and taken down by the next session
    instead of making every integration test error with "the bridge already exists"."""
    import tempfile

    from labctl.sim import down

    sim_dir = Path(tempfile.gettempdir()) / f"labctl-test-sim{slot}"
    owner = sim_dir.parent / f"{sim_dir.name}.owner"
    if owner.exists():
        # An xdist worker's command line does not say pytest: the pid and its start time say who.
        pid, _, started = owner.read_text().strip().partition(" ")
        if int(pid) != os.getpid() and started and _started(int(pid)) == started:
            pytest.fail(
                f"test session {pid} is using the simulated lab in slot {slot}: wait for it, or give this "
                "session other slots (LABCTL_TEST_SIM_SLOT=3..8; each xdist worker takes the next one)"
            )
    if (sim_dir / "state.json").exists():
        down(sim_dir)
    owner.write_text(f"{os.getpid()} {_started(os.getpid())}\n")
    return sim_dir


def keeper_folder(prefix: str = "lk") -> Path:
    """A new 0700 folder for a keeper's socket on a short path (a Unix socket's name is capped
    at 107 bytes); remove it with shutil.rmtree(folder.parent)."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp")) / "k"
    os.mkdir(folder, 0o700)
    return folder


def pid_gone(pid: int, within: float = 10.0) -> bool:
    """Whether process `pid` ends within `within` seconds (a zombie counts as ended)."""
    import time

    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
            if Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z"):
                return True
        except (ProcessLookupError, OSError, IndexError):
            return True
        time.sleep(0.05)
    return False


_SUITE_KEEPERS: list[Path] = []  # this process's keeper folder, once made
_LONG_LIVED: set[str] = set()  # inventories whose keepers last the session: the `lab` fixture's


def _suite_keeper_folder() -> Path:
    if not _SUITE_KEEPERS:
        _SUITE_KEEPERS.append(keeper_folder("lks"))
    return _SUITE_KEEPERS[0]


def stop_keepers(folder: Path, keep: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    """Stop every keeper listening in `folder` but those of the inventories in `keep`."""
    from labctl.keeper import sock as ks

    for path in folder.glob("*.sock"):
        try:
            s = ks.connect(path, 5)
            try:
                ks.send_frame(s, {"v": ks.PROTOCOL, "op": "list"})
                answer = ks.recv_frame(s) or {}
            finally:
                ks.close_quietly(s)
            if answer.get("inventory") in keep:
                continue
            s = ks.connect(path, 5)
            try:
                ks.send_frame(s, {"v": ks.PROTOCOL, "op": "stop"})
                ks.recv_frame(s)
            finally:
                ks.close_quietly(s)
        except (ks.KeeperUnavailable, OSError, ConnectionError, ValueError):
            pass


@pytest.fixture(autouse=True)
def suite_keeper(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Keeping on for an integration test: its commands share the connections the keeper holds
    (the session lab's keeper lasts the session); the keepers of the test's own inventories are
    stopped when it ends. A test that sets LABCTL_KEEPER itself (`through`) wins."""
    if not KEEPING or request.node.get_closest_marker("integration") is None:
        yield
        return
    folder = _suite_keeper_folder()
    monkeypatch.setenv("LABCTL_KEEPER", "on")
    monkeypatch.setenv("LABCTL_KEEPER_DIR", str(folder))
    yield
    stop_keepers(folder, _LONG_LIVED)


def pytest_sessionfinish(session: pytest.Session) -> None:
    for folder in _SUITE_KEEPERS:
        stop_keepers(folder)
        shutil.rmtree(folder.parent, ignore_errors=True)


@pytest.fixture(params=["direct", "kept"])
def through(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Runs a transport test twice: with every command connecting itself, and with every command
    going through a connection keeper (labctl.keeper; LABCTL_KEEPER=always: even the first
    command starts one and waits for it) in a keeper folder of the test's own. The kept run
    checks that a keeper answered there, and stops every keeper it started."""
    if request.param == "direct":
        monkeypatch.setenv("LABCTL_KEEPER", "off")
        yield "direct"
        return
    folder = keeper_folder()
    monkeypatch.setenv("LABCTL_KEEPER", "always")
    monkeypatch.setenv("LABCTL_KEEPER_DIR", str(folder))
    try:
        yield "kept"
        assert list(folder.glob("*.sock")), "no keeper answered: the commands connected themselves"
    finally:
        stop_keepers(folder)
        shutil.rmtree(folder.parent, ignore_errors=True)


def docker_unavailable() -> str | None:
    """Why Docker sandbox images cannot be built or run here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root to run dockerd and debootstrap"
    for tool in ("docker", "dockerd", "debootstrap"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"needs {tool} (apt-get install docker.io debootstrap)"
    return None


@pytest.fixture(scope="session")
def docker_images() -> dict[str, dict[str, Any]]:
    """The python and c sandbox images, built once through labctl's own builder (a no-op when
    their labels match the recipes). dockerd is started in the background when `docker info`
    fails, and left running: other test sessions share it. Skips with the reason when Docker
    cannot run here. Returns {lang: build_image's answer (image, recipe, built, seconds, size)}.
    """
    reason = docker_unavailable()
    if reason:
        pytest.skip(f"Docker sandboxes unavailable: {reason}")
    from labctl.agent.core.errors import AgentError
    from labctl.agent.sandbox.daemon import daemon_answers, dockerd_op
    from labctl.agent.sandbox.image import build_image
    from labctl.agent.sandbox.languages import RECIPES, SUITE, recipe_hash

    if not daemon_answers()["answering"]:
        try:
            dockerd_op({"action": "start", "systemd": Path("/run/systemd/system").is_dir()})
        except AgentError as e:
            pytest.skip(f"Docker cannot run here: {e.message}")
    return {
        lang: build_image(lang, list(RECIPES[lang].packages), recipe_hash(RECIPES[lang]), suite=SUITE)
        for lang in ("python", "c")
    }


@contextmanager
def agent_server(
    command: str, args: dict[str, Any]
) -> Iterator[tuple[dict[str, Any], subprocess.Popen[str]]]:
    """A real agent command that serves (netbench.sink, cache.serve) in its own process on this machine:
    its "listening" event, and the process (killed at the end if still running)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "labctl.agent", command, json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stderr is not None
        info = json.loads(proc.stderr.readline())
        assert info["event"] == "listening", info
        yield info, proc
    finally:
        proc.kill() if proc.poll() is None else None
        proc.wait()


def labctl(*args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the real CLI through its entry point (`labctl.cli.app.main`) in this process: its
    exit code, stdout and stderr as `labctl_process` would give them, without paying Python's
    and labctl's start-up on every call (about 0.7 s of each, hundreds of times a run).

    `timeout` applies to `labctl_process` only; here the test's own timeout (pytest-timeout)
    ends a call that hangs.
    """
    import contextlib
    import io
    import traceback

    from labctl.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    argv, cwd, stdin = sys.argv, os.getcwd(), sys.stdin
    code: int
    try:
        sys.argv = ["labctl", *args]
        sys.stdin = io.TextIOWrapper(io.BytesIO(b""))  # as a subprocess with nothing on stdin
        os.chdir(REPO)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as e:
                if e.code is None or isinstance(e.code, int):
                    code = e.code or 0
                else:  # sys.exit("message"): the interpreter would print it and exit 1
                    err.write(f"{e.code}\n")
                    code = 1
            except Exception:  # what the `labctl` script would show: a traceback, exit 1
                err.write(traceback.format_exc())
                code = 1
    finally:
        sys.argv, sys.stdin = argv, stdin
        os.chdir(cwd)
    proc = subprocess.CompletedProcess(["labctl", *args], code, out.getvalue(), err.getvalue())
    if check and proc.returncode != 0:
        raise AssertionError(f"labctl {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def labctl_process(*args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess, as a user would: for what only a process shows (exit
    codes through the interpreter, a clean stdout at the file-descriptor level, signals)."""
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"labctl {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def run_json(inv: Any, *args: str, timeout: float = 120) -> tuple[int, dict[str, Any]]:
    """The real CLI with --json against inventory `inv`: its exit code and its one JSON document."""
    proc = labctl("--json", "-i", str(inv), *args, timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def sh(inv: Any, host: str, line: str) -> str:
    """A shell line on one simulated host through `labctl exec`; its stdout (it must succeed)."""
    rc, doc = run_json(inv, "exec", "-l", host, "--", line)
    r = doc["results"][0]
    assert rc == 0, r
    return str(r["stdout"])


def orchestra_lab(inv: Path, folder: Path, orchestra: dict[str, Any], edit: Any = None) -> Path:
    """A copy of the simulated lab's inventory in `folder` (key paths made absolute; `edit(doc)`
    changes it first) with playbooks/train.yaml and `orchestra` as playbooks/orchestra.yaml
    beside it, where the commands find them by default. Returns the copy's path."""
    import yaml

    copy = folder / "lab.yaml"
    doc = yaml.safe_load(inv.read_text())
    for key in ("ssh_key", "known_hosts"):
        doc["defaults"][key] = str((inv.parent / doc["defaults"][key]).resolve())
    if edit is not None:
        edit(doc)
    copy.write_text(yaml.safe_dump(doc))
    (folder / "playbooks").mkdir()
    (folder / "playbooks" / "train.yaml").write_text((REPO / "playbooks" / "train.yaml").read_text())
    (folder / "playbooks" / "orchestra.yaml").write_text(yaml.safe_dump(orchestra))
    return copy


@contextmanager
def m5_cache(lab: object) -> Iterator[None]:
    """m5's RAM cache mounted by `labctl provision` for the block, and m5 put back as it was.

    Tests of provision expect a host that was never provisioned; whoever mounts the cache
    for its own tests undoes it: cache emptied, unmounted, fstab restored from labctl's backup.
    """
    inv = str(lab.inventory_path)  # type: ignore[attr-defined]

    def on_m5(cmd: str) -> str:
        proc = labctl("-i", inv, "--json", "exec", "-l", "m5", "--", cmd)
        return str(json.loads(proc.stdout)["results"][0]["stdout"])

    mounted = on_m5("stat -f -c %T /mnt/model-cache 2>/dev/null || true").strip() == "tmpfs"
    if not mounted:
        labctl(
            "-i",
            inv,
            "provision",
            "-p",
            str(REPO / "playbooks/provision.yaml"),
            "--tags",
            "model_cache",
            "-l",
            "m5",
            check=True,
        )
    try:
        yield
    finally:
        on_m5("rm -rf /mnt/model-cache/* /mnt/model-cache/.labctl; true")
        if not mounted:
            on_m5("umount /mnt/model-cache && cat /var/lib/labctl/backup/fstab > /etc/fstab")


@pytest.fixture(scope="session")
def tiny_hf_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama-architecture model with a byte-level BPE tokenizer and a chat template, made
    here from seed 0 (labctl/agent/modelload/hfgen.py; about 5 s), shared by the session's tests.
    Needs the `hf` extra (transformers, tokenizers); read-only for the tests."""
    pytest.importorskip("transformers")
    from labctl.agent.modelload.hfgen import make_hf_model

    out = tmp_path_factory.mktemp("hf") / "tiny-llama"
    make_hf_model(str(out), seed=0)
    return out
