"""The `Backend` protocol every train backend implements (train/backends/__init__.py): what it
declares, the one check that refuses the options it does not read, and the run's time limit
read from `LaunchSpec.time_limit_s` alone."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from labctl.agent.train.settings import EXIT_PAUSED
from labctl.hosts.context import Context
from labctl.output.errors import InputError
from labctl.output.progress import QUIET
from labctl.train import backends, run
from labctl.train.backends import BUILTIN, Backend, BaseBackend, Option, PlannedRun, RunsOn, jobs
from labctl.train.backends.cloud import session
from labctl.train.backends.cloud.backend import offline_spec
from labctl.train.backends.cloud.platforms import KAGGLE, SAGEMAKER
from labctl.train.backends.sagemaker import build_request
from labctl.train.backends.slurm import slurm_time
from labctl.train.phases import load_phases
from labctl.train.request import CLUSTER_FIELDS, JobOptions, TrainRequest
from labctl.train.results import JobFiles
from labctl.train.spec import TIME_LIMIT_ENV
from tests.unit import test_train_backends as tb
from tests.unit.test_backend_kaggle import labctl_train
from tests.unit.test_k8s_manifest import (
    PACKAGED,
    nodes_for,
    tiny,  # noqa: F401 (a fixture)
    unreachable_lab,  # noqa: F401 (a fixture)
)

# JobOptions fields that are no flag: the phases file fills them in.
NOT_FLAGS = {"named_iface"}


@pytest.mark.parametrize("name", list(BUILTIN))
def test_every_builtin_backend_implements_the_whole_protocol(name: str) -> None:
    backend = backends.get(name)
    assert isinstance(backend, Backend)
    assert backend.name == name and isinstance(backend.runs_on, RunsOn)
    assert isinstance(backend.uses_lab_hosts, bool)
    # The lab's hosts plan every run except a cloud platform's session.
    assert backend.uses_lab_hosts == (backend.runs_on is not RunsOn.PLATFORM)
    fields = set(JobOptions.names()) - NOT_FLAGS
    assert isinstance(backend.options, tuple)
    for option in backend.options:
        assert isinstance(option, Option) and option.name in fields, option
        assert isinstance(option.type, type) and option.help.strip()
        assert option.default is None or isinstance(option.default, option.type), option
    assert len({o.name for o in backend.options}) == len(backend.options)
    assert set(backend.refusals) <= fields - {o.name for o in backend.options}


def test_every_flag_of_a_job_is_some_backends_option_and_the_cluster_ones_are_shared() -> None:
    declared = {o.name for n in BUILTIN for o in backends.get(n).options}
    assert declared == set(JobOptions.names()) - NOT_FLAGS
    assert tuple(o.name for o in jobs.CLUSTER_OPTIONS) == CLUSTER_FIELDS
    for name in ("slurm", "k8s", "trainjob"):
        assert set(CLUSTER_FIELDS) <= {o.name for o in backends.get(name).options}


def test_start_asks_a_backend_nothing_outside_the_protocol() -> None:
    source = inspect.getsource(run)
    assert "hasattr(" not in source and "getattr(" not in source


@pytest.mark.parametrize(
    ("backend", "job", "message"),
    [
        ("ssh", JobOptions(partition="gpu"), "--partition applies to --backend slurm, not ssh."),
        ("ssh", JobOptions(image="a:1"), "--image applies to --backend k8s or trainjob or sagemaker, not ssh."),
        ("ssh", JobOptions(time_limit="1:00"), "--time applies to --backend slurm, not ssh."),
        ("kaggle", JobOptions(kaggle_id="a/bcdef", s3="s3://b/p"), "--s3 applies to --backend sagemaker, not kaggle."),
        ("sagemaker", JobOptions(runtime="r"), "--runtime applies to --backend trainjob, not sagemaker."),
        ("slurm", JobOptions(pvc="c"), "--pvc applies to --backend k8s or trainjob, not slurm."),
        ("trainjob", JobOptions(min_nodes=1), "--min-nodes is an elastic policy"),
    ],
)  # fmt: skip
def test_an_option_of_another_backend_is_refused_before_any_host_is_asked(
    unreachable_lab: Path,  # noqa: F811
    backend: str,
    job: JobOptions,
    message: str,
) -> None:
    request = TrainRequest(phase=1, file=unreachable_lab.parent / "phases.yaml", backend=backend, job=job)
    with pytest.raises(InputError) as e:
        run.start(Context.create(inventory_path=unreachable_lab), request)
    assert e.value.exit_code == 2 and e.value.message.startswith(message)


def test_the_cli_refuses_an_option_the_ssh_backend_does_not_read(unreachable_lab: Path) -> None:  # noqa: F811
    rc, output = labctl_train(unreachable_lab, "--partition", "gpu")
    assert rc == 2, output
    assert "--partition applies to --backend slurm, not ssh." in output and "Traceback" not in output


def test_a_plugged_in_backend_is_named_for_the_options_it_declares(unreachable_lab: Path) -> None:  # noqa: F811
    class Queue(BaseBackend):
        name = "queue"
        options: tuple[Option, ...] = (Option("partition", str, "the queue's partition"),)

    backends.register(Queue())
    try:
        with pytest.raises(InputError) as e:
            backends.check_options(backends.get("ssh"), JobOptions(partition="gpu"))
        backends.check_options(backends.get("queue"), JobOptions(partition="gpu"))
    finally:
        backends.unregister("queue")
    assert e.value.message == "--partition applies to --backend slurm or queue, not ssh."


# --- the time limit: LaunchSpec.time_limit_s, and nowhere else ---------------------------------

LIMIT = 3600


def cluster_run(backend: str, out: Path, job: JobOptions) -> PlannedRun:
    """A planned cluster run whose spec has the limit, while its settings, environment and request do not."""
    settings = load_phases(PACKAGED).settings(2, [])
    run_id = "p2-20260101-000000-ab12"
    spec = tb.make_spec(
        nodes=nodes_for("cpu", 2, 1),
        dist_backend="gloo",
        settings=settings.trainer_settings(2, run_id, "/var/lib/labctl/runs/metrics.jsonl"),
        time_limit_s=LIMIT,
    )
    assert "time_limit" not in spec.settings and all(TIME_LIMIT_ENV not in n.env for n in spec.nodes)
    request = TrainRequest(phase=2, backend=backend, output=out, job=job)
    return PlannedRun(request, settings, spec, [], None, out / "runs")


def written(backend: str, planned: PlannedRun) -> list[Path]:
    result = backends.get(backend).submit(cast(Any, None), planned, QUIET)
    assert isinstance(result, JobFiles)
    return result.files


def test_slurm_takes_the_limit_from_the_spec(tmp_path: Path) -> None:
    [script, *_] = written("slurm", cluster_run("slurm", tmp_path, JobOptions()))
    options = tb.sbatch_options(script.read_text())
    assert options["time"] == slurm_time(LIMIT + jobs.JOB_GRACE_S)
    assert f"pauses with a checkpoint by {LIMIT} s" in script.read_text()


@pytest.mark.parametrize(("backend", "kind"), [("k8s", "PyTorchJob"), ("trainjob", "TrainJob")])
def test_kubernetes_jobs_take_the_deadline_from_the_spec(tmp_path: Path, backend: str, kind: str) -> None:
    [path] = written(backend, cluster_run(backend, tmp_path, JobOptions(pvc=tb.PVC)))
    [job] = [d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == kind]
    where = job["spec"]["runPolicy"] if kind == "PyTorchJob" else job["spec"]
    assert where["activeDeadlineSeconds"] == LIMIT + jobs.JOB_GRACE_S


def cloud_run(backend: str, out: Path, job: JobOptions) -> PlannedRun:
    settings = load_phases(PACKAGED).settings(1, [])
    spec = offline_spec(settings, 1, "p1-20260101-000000-ab12", None, (), LIMIT)
    assert "time_limit" not in spec.settings
    return PlannedRun(
        TrainRequest(phase=1, backend=backend, output=out, job=job), settings, spec, [], None, out
    )


def test_a_kaggle_session_takes_its_length_from_the_spec(tmp_path: Path) -> None:
    written("kaggle", cloud_run("kaggle", tmp_path, JobOptions(kaggle_id="alice/cet-p1-s1")))
    text = (tmp_path / "train-phase1.py").read_text()
    config = json.loads(ast.literal_eval(text.split("CONFIG = json.loads(", 1)[1].split(")\n", 1)[0]))
    assert config["time_limit_s"] == KAGGLE.limits(LIMIT)[1] == LIMIT - LIMIT // 10
    # The trainer's paused exit reaches the launcher from the one EXIT_PAUSED, not a copy of it.
    assert config["trainer_paused_exit"] == EXIT_PAUSED
    assert not hasattr(session, "EXIT_PAUSED")


def test_a_sagemaker_job_takes_its_runtime_from_the_spec() -> None:
    planned = cloud_run("sagemaker", Path("/nowhere"), JobOptions())
    job = JobOptions(role_arn="arn:aws:iam::123456789012:role/SageMakerTraining", s3="s3://my-lab/cet")
    request = build_request(planned.spec, job, "s3://my-lab/cet/src.tar.gz", "us-east-1")
    session_s, limit_s = SAGEMAKER.limits(LIMIT)
    assert request["StoppingCondition"]["MaxRuntimeInSeconds"] == session_s == LIMIT
    assert request["HyperParameters"]["labctl_time_limit_s"] == str(limit_s)
    assert json.loads(request["HyperParameters"]["labctl_settings"])["time_limit"] == limit_s
    assert request["Environment"][TIME_LIMIT_ENV] == str(limit_s)
