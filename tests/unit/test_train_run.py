"""The training run layer under the CLI (train/run.py, results.py, backends/): the pure parts,
and a backend registered by a test taking a run from request to result without SSH."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from labctl.cli.app import app
from labctl.cli.train_cmd import Backend as BackendChoice
from labctl.hosts.context import Context
from labctl.hosts.fanout import HostResult
from labctl.output.errors import EXIT_HOST, EXIT_INPUT, EXIT_INTERRUPTED, EXIT_OK, InputError
from labctl.output.progress import Progress
from labctl.train import backends, launch, run
from labctl.train.backends import BaseBackend, PlannedRun, RunsOn
from labctl.train.backends.jobs import for_cluster
from labctl.train.backends.k8s import K8sBackend
from labctl.train.backends.slurm import SlurmBackend
from labctl.train.backends.ssh import SshBackend
from labctl.train.backends.trainjob import TrainJobBackend
from labctl.train.phases import Settings
from labctl.train.request import JobOptions, TrainRequest, parse_ranks
from labctl.train.results import Attached, JobFiles, Stopped, count_restarts
from labctl.train.spec import LaunchSpec, NodeSpec

INVENTORY = """\
lab: t
defaults: {user: root, ssh_key: keys/id}
hosts:
  m5: {address: 10.0.0.1, roles: [train]}
  irina: {address: 10.0.0.2, roles: [train]}
"""


def make_spec(**kw: Any) -> LaunchSpec:
    nodes = tuple(
        NodeSpec(host=h, address=f"10.0.0.{i}", nproc=1, device="cpu", python="/usr/bin/python3")
        for i, h in enumerate(("m5", "irina"), 1)
    )
    fields: dict[str, Any] = {
        "run_id": "p1-20250611-142000-ab12",
        "phase": 1,
        "dist_backend": "gloo",
        "nodes": nodes,
        "head_address": "10.0.0.1",
        "port": 29500,
        "max_restarts": 3,
        "settings": {"checkpoint_dir": "/var/lib/labctl/train/phase1", "metrics_path": "/var/log/x.jsonl"},
        "log_dir": "/var/lib/labctl/runs/p1",
    }
    fields.update(kw)
    return LaunchSpec(**fields)


# --- the request and the choice of backend -----------------------------------------------------


def test_ranks_are_a_comma_list_or_all() -> None:
    assert parse_ranks("0") == {0} and parse_ranks("0, 2,") == {0, 2} and parse_ranks(" all ") is None
    with pytest.raises(InputError) as e:
        parse_ranks("zero")
    assert "--ranks" in e.value.message and e.value.hint


def test_job_options_given_in_field_order() -> None:
    assert JobOptions().given() == []
    assert JobOptions(min_nodes=1, image="x").given() == ["image", "min_nodes"]


def test_builtin_backends_by_name_and_the_cli_offers_exactly_those() -> None:
    assert backends.names() == ("ssh", "slurm", "k8s", "trainjob", "kaggle", "sagemaker")
    assert isinstance(backends.get("ssh"), SshBackend)
    assert isinstance(backends.get("slurm"), SlurmBackend)
    assert isinstance(backends.get("k8s"), K8sBackend)
    assert isinstance(backends.get("trainjob"), TrainJobBackend)
    assert all(backends.get(n).name == n for n in backends.names())
    assert [b.value for b in BackendChoice] == list(backends.names())


def test_an_unknown_backend_is_an_input_error_before_anything_is_asked(tmp_path: Path) -> None:
    with pytest.raises(InputError) as e:
        backends.get("pbs")
    assert "pbs" in e.value.message and "ssh, slurm, k8s" in e.value.hint
    # The inventory is not even read: the name is checked first.
    ctx = Context.create(inventory_path=tmp_path / "missing.yaml")
    with pytest.raises(InputError, match="unknown backend"):
        run.start(ctx, TrainRequest(phase=1, backend="pbs"))


@pytest.mark.parametrize(
    ("backend", "job", "message"),
    [
        (
            "slurm",
            JobOptions(image="a:1", min_nodes=1),
            "--image, --min-nodes applies to --backend k8s, not slurm.",
        ),
        # Slurm's own --time, not the run's --time-limit (which every backend takes).
        ("k8s", JobOptions(time_limit="1:00"), "--time applies to --backend slurm, not k8s."),
    ],
)
def test_a_job_option_of_another_backend_is_refused(
    tmp_path: Path, backend: str, job: JobOptions, message: str
) -> None:
    chosen = backends.get(backend)
    assert isinstance(chosen, SlurmBackend | K8sBackend)
    with pytest.raises(InputError) as e:
        chosen.write_checked(make_spec(), tmp_path, job)
    assert e.value.message == message and not list(tmp_path.iterdir())


# --- the cluster rewrite of the spec ------------------------------------------------------------


def test_for_cluster_makes_paths_relative_and_keeps_a_chosen_checkpoint_folder() -> None:
    spec = make_spec()
    default = for_cluster(spec, default_checkpoint=True)
    assert default.settings["metrics_path"] == f"labctl-runs/{spec.run_id}/metrics.jsonl"
    assert default.settings["checkpoint_dir"] == "checkpoints/phase1"
    assert default.log_dir == "" and default.nodes == spec.nodes
    chosen = for_cluster(spec, default_checkpoint=False)
    assert chosen.settings["checkpoint_dir"] == "/var/lib/labctl/train/phase1"
    assert chosen.settings["metrics_path"] == default.settings["metrics_path"]
    assert spec.settings["metrics_path"] == "/var/log/x.jsonl"  # the original is left alone


def test_a_planned_run_knows_whether_the_checkpoint_folder_is_labctls_default() -> None:
    def planned(settings: Settings) -> PlannedRun:
        return PlannedRun(TrainRequest(phase=1), settings, make_spec(), [], None, Path("runs"))

    assert planned(Settings()).default_checkpoint
    assert not planned(Settings(checkpoint_dir="/data/mine/phase{phase}")).default_checkpoint


# --- the attached run's summary -----------------------------------------------------------------


def start(restart: int = 0, resumed: int | None = None) -> dict[str, Any]:
    return {"event": "start", "restart": restart, "resumed_from": resumed}


def step(n: int, loss: float, restart: int = 0) -> dict[str, Any]:
    return {"event": "step", "step": n, "loss": loss, "restart": restart}


@pytest.mark.parametrize(
    ("events", "restarts"),
    [
        ([], 0),
        ([start(), step(5, 2.0)], 0),
        # Another host failed: this one re-joined with its own restart count still 0.
        ([start(), step(5, 2.0), start(0, 5), step(10, 1.5)], 1),
        # Its own restarts, with the first start's line lost.
        ([step(5, 2.0, restart=2), start(2, 5)], 2),
        ([start(), start(1, 0), start(2, 0)], 2),
    ],
)
def test_restarts_count_rank0_starts_or_its_restart_field(
    events: list[dict[str, Any]], restarts: int
) -> None:
    assert count_restarts(events) == restarts


def outcome(**kw: Any) -> launch.Outcome:
    fields: dict[str, Any] = {
        "results": [HostResult("m5", "ok", rc=0), HostResult("irina", "ok", rc=0)],
        "events": [start(), step(5, 2.5), start(0, 5), step(10, 1.25), {"event": "done", "step": 10}],
        "remaining": {"m5": [], "irina": []},
        "first_step_seconds": 1.5,
    }
    fields.update(kw)
    return launch.Outcome(**fields)


def test_attached_summary_of_a_finished_run() -> None:
    result = Attached.from_outcome(make_spec(), outcome(), Path("/runs/p1"))
    doc = result.to_json()
    assert list(doc) == [
        "run_id", "phase", "state", "world_size", "hosts", "failed_host", "steps_logged", "first_step",
        "last_step", "first_loss", "last_loss", "restarts", "resumed_from", "done", "resume_step",
        "first_step_seconds", "remaining_processes", "log_dir", "reason", "last_checkpoint",
    ]  # fmt: skip
    assert doc["state"] == "finished" and result.exit_code == EXIT_OK and doc["resume_step"] is None
    assert doc["reason"] is None  # no fatal error
    assert (doc["first_step"], doc["first_loss"], doc["last_step"], doc["last_loss"]) == (5, 2.5, 10, 1.25)
    assert doc["steps_logged"] == 2 and doc["restarts"] == 1 and doc["resumed_from"] == [None, 5]
    assert doc["done"] and doc["remaining_processes"] == {} and doc["log_dir"] == "/runs/p1"
    assert doc["hosts"][0] == HostResult("m5", "ok", rc=0).to_json()
    json.dumps(doc)


def test_attached_summary_of_failed_interrupted_and_leftover_runs() -> None:
    failed = Attached.from_outcome(
        make_spec(),
        outcome(
            results=[HostResult("m5", "cancelled"), HostResult("irina", "failed", rc=1)], failed_host="irina"
        ),
        Path("r"),
    )
    assert failed.state == "failed" and failed.exit_code == EXIT_HOST
    assert failed.to_json()["failed_host"] == "irina"
    fatal = Attached.from_outcome(
        make_spec(), outcome(results=[HostResult("irina", "failed", rc=2)], fatal="no CUDA device"), Path("r")
    )
    assert fatal.state == "failed" and fatal.to_json()["reason"] == "no CUDA device"
    # The trainer refused its input: exit 2, as labctl's own refusals, not a host's failure.
    assert fatal.exit_code == EXIT_INPUT
    interrupted = Attached.from_outcome(make_spec(), outcome(results=[], interrupted=True), Path("r"))
    assert interrupted.state == "interrupted" and interrupted.exit_code == EXIT_INTERRUPTED
    nothing_ran = Attached.from_outcome(make_spec(), outcome(results=[], events=[]), Path("r"))
    doc = nothing_ran.to_json()
    assert doc["state"] == "failed" and doc["first_loss"] is None and doc["restarts"] == 0
    left = {"m5": [{"pid": 7, "cmd": "python -m torch.distributed.run"}], "irina": []}
    leftover = Attached.from_outcome(make_spec(), outcome(remaining=left), Path("r"))
    assert leftover.state == "finished" and leftover.exit_code == EXIT_HOST
    assert leftover.remaining == {"m5": left["m5"]} and list(leftover.checked) == ["m5", "irina"]


def test_stop_result() -> None:
    clean = Stopped("p1-x", {"m5": [], "irina": []})
    assert clean.to_json() == {"run_id": "p1-x", "remaining": {}, "hosts": ["m5", "irina"]}
    assert clean.exit_code == EXIT_OK
    assert Stopped("p1-x", {"m5": [{"pid": 1}]}).exit_code == EXIT_HOST


# --- the status refresh rule --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("recorded", "hosts", "settled"),
    [
        ("running", {"m5": "running", "irina": "finished"}, None),
        ("running", {"m5": "finished", "irina": "finished"}, "finished"),
        ("running", {"m5": "stopped", "irina": "finished"}, "stopped"),
        ("running", {"m5": "failed", "irina": "finished"}, "failed"),
        ("running", {"m5": "unreachable", "irina": "stopped"}, "stopped"),
        ("running", {"m5": "unreachable"}, "failed"),
        ("running", {}, "failed"),  # none of its hosts is in the inventory any more
        ("finished", {"m5": "stopped"}, None),
        ("stopped", {"m5": "running"}, None),
    ],
)
def test_a_running_record_settles_from_its_hosts_states(
    recorded: str, hosts: dict[str, str], settled: str | None
) -> None:
    assert run.settled_state(recorded, {h: {"state": s} for h, s in hosts.items()}) == settled


# --- a backend plugged in by a test -------------------------------------------------------------


class FakeBackend(BaseBackend):
    """Writes one file with the run's spec; what a cloud job-file backend would do."""

    runs_on = RunsOn.LAB  # planned like an SSH run: the lab's hosts answer preflight

    def __init__(self, name: str) -> None:
        self.name = name
        self.runs: list[PlannedRun] = []

    def submit(self, ctx: Context, run: PlannedRun, progress: Progress) -> JobFiles:
        self.runs.append(run)
        path = (run.request.output or run.runs_root) / "job.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(run.spec.settings))
        return JobFiles(run.spec.run_id, self.name, [path], f"cloud submit {path}")


@pytest.fixture
def planned_without_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An inventory of two training hosts, and preflight that plans without asking them."""
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id").write_text("not really a key")
    inv = tmp_path / "inv.yaml"
    inv.write_text(textwrap.dedent(INVENTORY))
    calls: list[dict[str, Any]] = []

    def prepare(ctx: Context, **kw: Any) -> LaunchSpec:
        calls.append(kw)
        return make_spec(run_id=kw["run_id"], time_limit_s=kw.get("time_limit_s"))

    monkeypatch.setattr(launch, "prepare", prepare)
    yield inv
    assert calls and [h.name for h in calls[0]["hosts"]] == ["m5", "irina"]


def test_a_registered_backend_gets_the_planned_run(planned_without_hosts: Path, tmp_path: Path) -> None:
    fake = FakeBackend("cloud")
    backends.register(fake)
    try:
        assert "cloud" in backends.names()
        ctx = Context.create(inventory_path=planned_without_hosts)
        request = TrainRequest(phase=1, backend="cloud", sets=("steps=7",), output=tmp_path / "out")
        result = run.start(ctx, request)
    finally:
        backends.unregister("cloud")
    assert "cloud" not in backends.names()
    assert isinstance(result, JobFiles) and result.backend == "cloud" and result.exit_code == EXIT_OK
    assert result.files == [tmp_path / "out" / "job.json"] and result.files[0].exists()
    (planned,) = fake.runs
    assert planned.request is request and planned.settings.steps == 7
    assert planned.spec.run_id == result.run_id and result.run_id.startswith("p1-")
    assert planned.runs_root == tmp_path / ".labctl" / "runs"


def test_the_cli_renders_a_registered_backend_without_knowing_it(planned_without_hosts: Path) -> None:
    # Registered under a name the CLI offers, the fake replaces the built-in Slurm backend.
    fake = FakeBackend("slurm")
    backends.register(fake)
    try:
        out = CliRunner().invoke(
            app, ["--json", "-i", str(planned_without_hosts), "train", "--phase", "1", "--backend", "slurm"]
        )
    finally:
        backends.unregister("slurm")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc == {"run_id": fake.runs[0].spec.run_id, "backend": "slurm", "files": [doc["files"][0]]}
    assert isinstance(backends.get("slurm"), SlurmBackend)


def test_dry_run_never_reaches_the_backend(planned_without_hosts: Path) -> None:
    fake = FakeBackend("cloud")
    backends.register(fake)
    try:
        ctx = Context.create(inventory_path=planned_without_hosts)
        result = run.start(ctx, TrainRequest(phase=1, backend="cloud", dry_run=True))
    finally:
        backends.unregister("cloud")
    assert fake.runs == [] and result.exit_code == EXIT_OK
    doc = result.to_json()
    assert doc["rendezvous"] == "10.0.0.1:29500" and [h["host"] for h in doc["hosts"]] == ["m5", "irina"]
