"""Values that reach a shell, a path or a system file (issue 25, points 1-4): a name is refused
before it can become shell text or leave its folder, a field takes ASCII only, and a server
template that the host could not fill is refused as the orchestra file is loaded.

New helpers are imported inside the tests that use them, so that each test fails on the old
code for what it checks, not for an import.
"""

from __future__ import annotations

import json
import os
import posixpath
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from labctl.agent.core.errors import AgentError
from labctl.documents.validation import DocumentError
from labctl.inventory.load import load_inventory
from labctl.orchestra.spec import Server, load_orchestra
from labctl.output.errors import InputError
from labctl.provision.resources.cron import CronParams
from labctl.train import launch
from labctl.train.phases import load_phases
from labctl.train.spec import LaunchSpec, NodeSpec

INV = """\
lab: t
defaults: {connection: local}
hosts:
  a:
    address: 10.0.0.1
    roles: [train]
  b:
    address: 10.0.0.2
    roles: [storage]
    storage: {models: MODELS}
"""


def run_cli(*args: str, cwd: Path | None = None) -> tuple[int, str]:
    """The real CLI in a subprocess: its error handler and exit code as a user gets them."""
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "250"},
        cwd=cwd,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out
    return proc.returncode, out


def inventory(tmp_path: Path, text: str = INV) -> Path:
    (tmp_path / "lib").mkdir(exist_ok=True)
    path = tmp_path / "inv.yaml"
    path.write_text(text.replace("MODELS", str(tmp_path / "lib")))
    return path


# -- 1: a name in a phases file's env never becomes shell text -------------------------------


def test_a_phases_env_name_that_is_not_a_shell_name_is_refused_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "phases.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            name: x
            defaults:
              env:
                NCCL_IB_DISABLE: "1"
                "A=1;touch /tmp/pwned;B": "1"
            phases:
              1: {steps: 10}
            """
        )
    )
    with pytest.raises(DocumentError) as e:
        load_phases(path)
    assert e.value.exit_code == 2
    assert (
        f"{path}:5: defaults.env.A=1;touch /tmp/pwned;B: not an environment variable name" in e.value.message
    )


def test_train_refuses_the_crafted_name_before_any_host(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    phases = tmp_path / "phases.yaml"
    phases.write_text('name: x\ndefaults: {steps: 2}\nphases:\n  1: {env: {"X Y": "1"}}\n')
    rc, out = run_cli("-i", str(inv), "train", "--phase", "1", "-f", str(phases), "--dry-run")
    assert rc == 2 and "phases.yaml:4: phases[1].env.X Y: not an environment variable name" in out


def fake_python(tmp_path: Path) -> Path:
    """Stands in for the training interpreter: records its argv and environment as JSON."""
    record = tmp_path / "record.json"
    py = tmp_path / "fake-python"
    py.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"open({str(record)!r}, 'w').write(json.dumps({{'argv': sys.argv[1:], 'env': dict(os.environ)}}))\n"
    )
    py.chmod(0o755)
    return py


def spec_with(tmp_path: Path, env: dict[str, str]) -> tuple[LaunchSpec, NodeSpec]:
    node = NodeSpec(
        host="h", address="127.0.0.1", nproc=1, device="cpu", python=str(fake_python(tmp_path)), env=env
    )
    spec = LaunchSpec(
        run_id="p1-x",
        phase=1,
        dist_backend="gloo",
        nodes=(node,),
        head_address="127.0.0.1",
        port=29500,
        max_restarts=0,
        settings={"name": "it's $(id) `id`"},
        log_dir=str(tmp_path / "run"),
    )
    return spec, node


def test_a_crafted_env_name_never_reaches_the_host_shell(tmp_path: Path) -> None:
    """The launch line runs in a real sh: a name that is not one must stop labctl, not run."""
    marker = tmp_path / "pwned"
    spec, node = spec_with(tmp_path, {f"A=1;touch {marker};B": "x"})
    with pytest.raises(InputError, match="not an environment variable name"):
        line = launch._command(spec, node)  # what SSH hands the host's shell
        subprocess.run(["sh", "-c", line], timeout=60)
    assert not marker.exists()


TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40)


@settings(max_examples=25)
@given(value=TEXT)
def test_any_env_value_reaches_the_trainer_exactly_through_a_real_shell(value: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spec, node = spec_with(Path(tmp), {"LABCTL_PROBE": value, "OMP_NUM_THREADS": "1"})
        done = subprocess.run(["sh", "-c", launch._command(spec, node)], capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        seen = json.loads((Path(tmp) / "record.json").read_text())
    assert seen["env"]["LABCTL_PROBE"] == value
    assert json.loads(seen["argv"][seen["argv"].index("--settings") + 1]) == spec.settings


def test_a_named_interface_with_a_newline_stays_in_the_sbatch_comment(tmp_path: Path) -> None:
    """The phase's NCCL_SOCKET_IFNAME is shown in a comment line; a newline there must not end it."""
    from labctl.train.backends.slurm import render_sbatch
    from tests.unit.test_train_backends import make_spec

    marker = tmp_path / "pwned"
    script = tmp_path / "train.sbatch"
    script.write_text(render_sbatch(make_spec(script="t.py"), None, named_iface=f"eth0\ntouch {marker} #"))
    # Everything before the first #SBATCH line is the header: run it alone in a real bash.
    header = script.read_text().split("\n#SBATCH --", 1)[0]
    subprocess.run(["bash", "-c", header], cwd=tmp_path, timeout=30)
    assert not marker.exists()


def test_script_args_a_shell_would_not_read_are_an_input_error(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    args = [
        "train",
        "--phase",
        "1",
        "--script",
        str(script),
        "--script-args",
        '--data "/srv/my data',
        "--dry-run",
    ]
    rc, out = run_cli("-i", str(inventory(tmp_path)), *args)
    assert rc == 2 and "--script-args" in out and "does not split into words" in out


def test_the_shell_helper_refuses_names_and_quotes_values() -> None:
    from labctl.transport.shell import env_assignments, export_lines

    assert env_assignments({"A": "it's", "B_2": "$(id)"}) == "A='it'\"'\"'s' B_2='$(id)'"
    assert export_lines({"X": "a b"}) == ["export X='a b'"]
    for bad in ("", "1A", "A-B", "A B", "Ä", "A\n", "A=B", "Ａ"):
        with pytest.raises(InputError, match="not an environment variable name"):
            env_assignments({bad: "1"})
    with pytest.raises(InputError, match="NUL"):
        env_assignments({"A": "a\0b"})


# -- 2: a name that becomes a path component is one ------------------------------------------


@given(st.text(max_size=300))
def test_any_name_is_one_safe_path_component_or_refused(name: str) -> None:
    from labctl.documents.validation import path_component

    try:
        path_component(name, "The name", "tinylm-1g")
    except InputError as e:
        assert e.exit_code == 2 and e.hint
        return
    base = "/srv/models"
    joined = posixpath.join(base, name)
    assert posixpath.dirname(posixpath.normpath(joined)) == base
    # No separator of either kind ("0:" is a drive only to ntpath, and hosts are Linux).
    assert posixpath.basename(joined) == name and "\\" not in name
    assert "\0" not in name and "\n" not in name and len(name.encode("utf-8", "surrogatepass")) <= 255


@pytest.mark.parametrize("bad", ["x/../../escaped", "..", ".", "", "a\\b", "a\nb", ".labctl"])
def test_make_model_refuses_a_name_that_leaves_the_library(tmp_path: Path, bad: str) -> None:
    inv = inventory(tmp_path)
    rc, out = run_cli(
        "-i", str(inv), "bench", "make-model", "--host", "b", "--size-gb", "0.001", "--name", bad
    )
    assert rc == 2 and "not a model name" in out
    assert not (tmp_path / "escaped").exists() and os.listdir(tmp_path / "lib") == []


@pytest.mark.parametrize("bad", ["../escaped", "x/../../escaped", "..", "a\0b", "a\nb", ".labctl", ""])
def test_the_agent_refuses_it_too_whoever_sent_it(tmp_path: Path, bad: str) -> None:
    from labctl.agent.modelload.modelgen import make_model_command

    lib = tmp_path / "lib"
    lib.mkdir()
    with pytest.raises(AgentError, match="not a model name"):
        make_model_command({"models": str(lib), "name": bad, "size_gb": 0.001})
    assert sorted(os.listdir(tmp_path)) == ["lib"] and os.listdir(lib) == []
    made = make_model_command({"models": str(lib), "name": "ok", "size_gb": 0.001})
    assert made["path"] == f"{lib}/ok" and (lib / "ok" / "config.json").is_file()


def test_train_status_does_not_read_a_record_outside_the_runs_folder(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    outside = tmp_path / ".labctl" / "evil"
    outside.mkdir(parents=True)
    (outside / "run.json").write_text(json.dumps({"run_id": "evil", "hosts": [], "state": "done"}))
    rc, out = run_cli("-i", str(inv), "train", "status", "../evil")
    assert rc == 2 and "cannot be a file or folder name" in out


def test_a_job_name_from_a_cron_file_never_reads_outside_the_lock_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from labctl.agent.core import paths
    from labctl.agent.cron import cronjobs

    monkeypatch.setattr(paths, "LOCK_DIR", str(tmp_path / "locks"))
    (tmp_path / "locks").mkdir()
    (tmp_path / "secret.last").write_text("0 1700000000\n")
    (tmp_path / "locks" / "ok.last").write_text("3 1700000000\n")
    assert cronjobs.last_run("ok") == {"rc": 3, "end": 1700000000}
    seen = cronjobs.last_run("../secret")
    assert seen is not None and seen["rc"] is None and "separator" in seen["error"]


def test_a_run_folder_that_climbs_out_is_refused_on_the_host(tmp_path: Path) -> None:
    from labctl.agent.train import host as train_host

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "rc").write_text("0\n")
    sneaky = str(tmp_path / "runs" / ".." / "victim")
    with pytest.raises(AgentError, match="not a run's folder"):
        train_host.status_command({"run_id": "p1", "host": "h", "log_dir": sneaky})
    with pytest.raises(AgentError, match="not a run's folder"):
        train_host.spawn_command({"line": "true", "log_dir": sneaky})
    assert sorted(os.listdir(victim)) == ["rc"]


def test_a_network_transaction_id_is_one_name_on_the_host(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from labctl.agent.network import txn

    monkeypatch.setenv("LABCTL_NET_DIR", str(tmp_path))
    assert txn._txn_dir("t-1") == str(tmp_path / "t-1")
    for bad in ("..", "a\0b", "a\nb", ".hidden", "a/b"):
        with pytest.raises(AgentError, match="bad transaction id"):
            txn._txn_dir(bad)


def test_orchestra_logs_take_one_plain_model_name_on_the_host() -> None:
    from labctl.agent.orchestra import host

    for bad in ("tiny\n", "../tiny"):
        with pytest.raises(AgentError, match="model name"):
            host._model_name(bad)
    with pytest.raises(ValueError, match="not a single name"):
        host.log_path("../../etc/cron.d/x")


def test_a_sandbox_language_or_program_file_is_one_name_on_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from labctl.agent.core import paths
    from labctl.agent.sandbox import image, runner

    monkeypatch.setattr(paths, "SANDBOX_DIR", str(tmp_path / "sandbox"))
    with pytest.raises(AgentError, match=r"sandbox language '\.\./x'"):
        image.build_image("../x", [], "recipe")
    spec = {"file": "../../etc/profile.d/x.sh", "run": ["sh"]}
    with pytest.raises(AgentError, match="file name in /work"):
        runner._args({"programs": [], "langs": {"python": spec}, "limits": {}})


# -- 3: fields that reach command lines are strict, and ASCII --------------------------------


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ('python: "/usr/bin/python3\\n* * * * * root evil"', "not an interpreter"),
        ("python: /opt/my venv/bin/python", "not an interpreter"),
        ("python: '~/venv/bin/python'", "not an interpreter"),
        ("python: /usr/bin/pythön3", "not an interpreter"),
        ('user: "root\\nevil"', "not a user name"),
        ("user: two words", "not a user name"),
        ("user: rööt", "not a user name"),
        ("user: -oProxyCommand=x", "not a user name"),
        ("address: 'fe80::1%eth0 ; id'", "scope after '%'"),
        ("gpus: [{model: X, memory_gb: 8, compute_capability: '٧.٠'}]", "compute_capability"),
    ],
)
def test_inventory_fields_that_reach_command_lines_are_refused_at_their_line(
    tmp_path: Path, line: str, words: str
) -> None:
    # Host a's address is line 5: the line replaces it, or follows it.
    is_address = line.startswith("address")
    text = INV.replace(
        "    address: 10.0.0.1\n", f"    {line}\n" if is_address else f"    address: 10.0.0.1\n    {line}\n"
    )
    with pytest.raises(DocumentError) as e:
        load_inventory(inventory(tmp_path, text))
    where = ".yaml:5: hosts.a." if is_address else ".yaml:6: hosts.a."
    assert e.value.exit_code == 2 and where in e.value.message and words in e.value.message


@pytest.mark.parametrize(
    "line",
    ["python: python3", "python: /usr/bin/python3.11", "python: 'C:\\Python311\\python.exe'", "user: admin"],
)
def test_ordinary_interpreters_and_users_load(tmp_path: Path, line: str) -> None:
    text = INV.replace("    roles: [train]\n", f"    roles: [train]\n    {line}\n")
    load_inventory(inventory(tmp_path, text))


@pytest.mark.parametrize("schedule", ["٥ * * * *", "*/٥ * * * *", "0 ١-٣ * * *", "0 0 ٣ * *"])
def test_cron_fields_take_ascii_digits_only(schedule: str) -> None:
    from labctl.agent.cron.cronjobs import next_run
    from labctl.cron.every import resolve_schedule

    with pytest.raises(ValidationError, match="not cron syntax"):
        CronParams(name="j", schedule=schedule, command="true")
    with pytest.raises(InputError, match="--schedule"):
        resolve_schedule(None, schedule)
    assert next_run(schedule, time.time()) is None  # cron skips the line: no next run to show


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["bench", "network", "--from", "a", "--to", "b", "--streams", "²"], "not a stream count"),
        (["bench", "network", "--from", "a", "--to", "b", "--streams", "٤"], "not a stream count"),
        (["cron", "install", "facts", "--every", "٣0m", "--check"], "not a period"),
        (["train", "--phase", "1", "--time-limit", "٣h", "--dry-run"], "not a duration"),
    ],
)
def test_options_take_ascii_digits_only(tmp_path: Path, args: list[str], words: str) -> None:
    rc, out = run_cli("-i", str(inventory(tmp_path)), *args)
    assert rc == 2 and words in out


def test_numbers_in_other_fields_are_ascii_too() -> None:
    from labctl.provision.resources.torch_env import TorchEnvParams
    from labctl.train.backends.slurm import _cpus_per_worker
    from labctl.train.request import parse_memory

    with pytest.raises(ValidationError):
        TorchEnvParams(version="٢.١٣.٠")
    with pytest.raises(InputError):
        parse_memory("٦٤G", "--memory-per-node")
    assert _cpus_per_worker({"OMP_NUM_THREADS": "²"}) == _cpus_per_worker({})


# -- 4: a server template the host could not fill is refused at load -------------------------

ORCHESTRA = """\
warm: 2
rotate: 1
models:
  - {name: a, size_gb: 4}
  - {name: b, size_gb: 4}
  - {name: c, size_gb: 4}
"""


@pytest.mark.parametrize("command", ["srv --port {port:d}", "srv --port {port!x}", "srv {port} {name:x}"])
def test_a_template_the_host_cannot_fill_is_an_input_error_naming_the_field(
    tmp_path: Path, command: str
) -> None:
    path = tmp_path / "orchestra.yaml"
    path.write_text(ORCHESTRA + f"server: {{command: {json.dumps(command)}}}\n")
    with pytest.raises(DocumentError) as e:
        load_orchestra(path)
    assert e.value.exit_code == 2 and ":7: server.command: the template cannot be filled" in e.value.message


PIECES = st.sampled_from(
    ["{port}", "{path}", "{gpu}", "{name}", "{port:d}", "{port!r}", "{port:>8}", "{", "}", "x", " ", ":", "!"]
)


@given(st.lists(PIECES, max_size=6))
def test_a_template_the_file_accepts_is_one_the_host_fills(pieces: list[str]) -> None:
    from labctl.agent.orchestra.host import _format

    command = "srv --port {port} " + "".join(pieces)
    try:
        Server(command=command)
    except ValidationError:
        return
    filled = _format(command, "/mnt/model cache/a", 8123, None, "a")
    assert "8123" in filled
