"""`labctl train --time-limit` on the controller: the option, the request, the settings and
environment each backend carries, and a paused run's result, record and status."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from labctl.agent.train import host as train_host
from labctl.agent.train.settings import EXIT_PAUSED
from labctl.cli.app import app
from labctl.hosts.fanout import HostResult
from labctl.output.errors import EXIT_HOST, InputError
from labctl.train import backends, run
from labctl.train.backends import jobs
from labctl.train.backends.k8s import render_pytorchjob
from labctl.train.backends.slurm import render_sbatch, slurm_time
from labctl.train.launch import format_event
from labctl.train.request import JobOptions
from labctl.train.results import Attached, RunsStatus
from labctl.train.spec import TIME_LIMIT_ENV
from tests.unit import test_train_backends as tb
from tests.unit import test_train_plan as tp
from tests.unit.test_train_run import (
    FakeBackend,
    make_spec,
    outcome,
    planned_without_hosts,  # noqa: F401 (a fixture)
    start,
    step,
)


def paused(n: int, limit: float = 600) -> dict[str, Any]:
    return {
        "event": "paused", "reason": "time_limit", "step": n, "resume_step": n,
        "checkpoint": f"/ck/step-{n:08d}.pt", "time_limit": limit, "seconds": limit - 3, "loss": 1.5,
    }  # fmt: skip


# -- the option --------------------------------------------------------------------------------


def test_time_limit_reaches_the_backend_as_seconds(planned_without_hosts: Path) -> None:  # noqa: F811
    # Registered under a name the CLI offers, the fake stands in for the Slurm backend.
    fake = FakeBackend("slurm")
    backends.register(fake)
    try:
        args = ["--json", "-i", str(planned_without_hosts), "train", "--phase", "1", "--backend", "slurm"]
        out = CliRunner().invoke(app, [*args, "--time-limit", "3h50m"])
        assert out.exit_code == 0, out.output
        assert fake.runs[0].request.time_limit_s == fake.runs[0].spec.time_limit_s == 13800
        bad = CliRunner().invoke(app, [*args, "--time-limit", "90"])
    finally:
        backends.unregister("slurm")
    # labctl's main() turns the InputError into its paragraph and exit 2; CliRunner hands it over.
    assert isinstance(bad.exception, InputError) and bad.exception.exit_code == 2
    assert "--time-limit '90' has no unit" in bad.exception.message
    assert len(fake.runs) == 1  # nothing planned for the bad one


def test_help_teaches_the_option() -> None:
    out = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"})
    text = " ".join(out.output.split())
    assert "--time-limit" in text and "3h50m" in text and "75" in text and "resume" in text


# -- what the run carries ------------------------------------------------------------------------


def test_the_trainer_gets_the_setting_and_every_process_the_environment() -> None:
    irina = tp.m5().model_copy(update={"name": "irina", "address": "10.0.0.11"})
    probes = {"m5": tp.probe(), "irina": tp.probe()}
    spec, problems = tp.plan([tp.m5(), irina], probes, device="cpu", time_limit_s=5400)
    assert problems == [] and spec is not None
    assert spec.time_limit_s == spec.settings["time_limit"] == 5400  # the trainer's form of the one field
    assert all(n.env[TIME_LIMIT_ENV] == "5400" for n in spec.nodes)
    assert '"time_limit": 5400' in spec.shell_line(spec.nodes[0])  # what --dry-run prints
    plain, _ = tp.plan([tp.m5(), irina], probes, device="cpu")
    assert plain is not None and "time_limit" not in plain.settings
    assert all(TIME_LIMIT_ENV not in n.env for n in plain.nodes)


def test_slurm_time_comes_from_the_limit_unless_given() -> None:
    spec = tb.make_spec(time_limit_s=13800)
    script = render_sbatch(spec, "agent.pyz")
    assert tb.sbatch_options(script)["time"] == slurm_time(13800 + jobs.JOB_GRACE_S) == "03:55:00"
    assert "Time-boxed" in script
    given = render_sbatch(spec, "agent.pyz", time_limit="4:00:00")
    assert tb.sbatch_options(given)["time"] == "4:00:00"
    assert "time" not in tb.sbatch_options(render_sbatch(tb.make_spec(), "agent.pyz"))
    assert slurm_time(86400 + 61) == "1-00:02:00"


def test_pytorchjob_gets_a_deadline_behind_the_limit() -> None:
    spec = tb.make_spec(time_limit_s=600, script="/w/train.py")
    job_options = JobOptions(image="img:1", pvc=tb.PVC)
    job = list(yaml.safe_load_all(render_pytorchjob(spec, None, None, job_options)))[-1]
    assert job["spec"]["runPolicy"]["activeDeadlineSeconds"] == 600 + jobs.JOB_GRACE_S
    plain = list(
        yaml.safe_load_all(render_pytorchjob(tb.make_spec(script="/w/train.py"), None, None, job_options))
    )[-1]
    assert "activeDeadlineSeconds" not in plain["spec"]["runPolicy"]


def test_a_script_on_a_cluster_gets_the_limit_in_its_environment() -> None:
    spec = tb.make_spec(
        nodes=(tb.node("m5", **{TIME_LIMIT_ENV: "600"}), tb.node("irina", **{TIME_LIMIT_ENV: "600"}))
    )
    env, differing = jobs.portable_env(spec, "cuda")
    assert env[TIME_LIMIT_ENV] == "600" and TIME_LIMIT_ENV not in differing


# -- a paused run ------------------------------------------------------------------------------


def test_an_attached_run_that_paused_exits_75_with_the_step() -> None:
    events = [start(), step(5, 2.5), step(8, 2.0), paused(8)]
    result = Attached.from_outcome(make_spec(), outcome(events=events), Path("/runs/p1"))
    doc = result.to_json()
    assert result.state == "paused" and result.exit_code == EXIT_PAUSED == 75
    assert doc["state"] == "paused" and doc["resume_step"] == 8 and not doc["done"]


def test_a_paused_run_with_a_failed_host_or_a_leftover_is_no_pause() -> None:
    events = [start(), step(5, 2.5), paused(5)]
    failed = outcome(
        events=events, results=[HostResult("m5", "ok", rc=0), HostResult("irina", "failed", rc=1)]
    )
    assert Attached.from_outcome(make_spec(), failed, Path("r")).exit_code == EXIT_HOST
    left = outcome(events=events, remaining={"m5": [{"pid": 1, "cmd": "x"}]})
    assert Attached.from_outcome(make_spec(), left, Path("r")).exit_code == EXIT_HOST
    # A pause before a restart that then finished: the run finished.
    later = outcome(events=[*events, start(1, 5), step(10, 1.0), {"event": "done", "step": 10}])
    assert Attached.from_outcome(make_spec(), later, Path("r")).state == "finished"


def test_a_detached_run_settles_as_paused_when_rank_0_says_so() -> None:
    states = {"m5": {"state": "paused", "resume_step": 8}, "irina": {"state": "finished"}}
    assert run.settled_state("running", states) == "paused"
    assert run.settled_state("running", {"m5": {"state": "paused"}, "irina": {"state": "failed"}}) == "failed"


def test_host_status_reads_a_paused_trainer_that_exited_0(tmp_path: Path) -> None:
    (tmp_path / "rc").write_text("0\n")
    lines = [f"[rank0]:{json.dumps(e)}" for e in (start(), step(5, 2.5), paused(7))]
    (tmp_path / "console.log").write_text("\n".join([*lines, "[rank1]:bye"]) + "\n")
    out = train_host.status_command({"run_id": "no-such-run", "log_dir": str(tmp_path), "host": "m5"})
    assert out["state"] == "paused" and out["resume_step"] == 7
    (tmp_path / "console.log").write_text(f"[rank0]:{json.dumps({'event': 'done', 'step': 9})}\n")
    assert (
        train_host.status_command({"run_id": "x", "log_dir": str(tmp_path), "host": "m5"})["state"]
        == "finished"
    )


def test_status_shows_the_pause_as_the_last_event(tmp_path: Path) -> None:
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "metrics.jsonl").write_text(
        "\n".join(json.dumps(e) for e in (start(), step(5, 2.5), paused(5))) + "\n"
    )
    status = RunsStatus(tmp_path, [{"run_id": "r1", "host_state": {}}])
    event = status.last_event(status.rows[0])
    assert event is not None and event["event"] == "paused"
    assert "resumable at step 5" in format_event(event)
