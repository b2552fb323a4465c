"""Backends declare their own options (labctl/train/opts.py): JobOptions, `labctl train`'s flags
and `labctl train backends` are all built from those declarations."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest
import typer.main
from typer.testing import CliRunner

from labctl.cli import train_cmd
from labctl.cli.app import app
from labctl.output.errors import InputError
from labctl.train import backends, opts
from labctl.train.backends.slurm import SlurmBackend
from labctl.train.opts import Option
from labctl.train.request import JobOptions, flag

EXTRA = Option("qos", str, "the Slurm QOS (#SBATCH --qos)", flag_help="Slurm QOS for --backend slurm.")


@pytest.fixture
def slurm_with_qos(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the backend's own declaration changes: the rest must follow from it.
    monkeypatch.setattr(SlurmBackend, "options", (*SlurmBackend.options, EXTRA))


def test_a_new_option_in_one_backend_reaches_the_request_the_refusals_and_the_listing(
    slurm_with_qos: None,
) -> None:
    job = JobOptions(qos="high")
    assert job.qos == "high" and job.given() == ["qos"] and flag("qos") == "--qos"
    backends.check_options(backends.get("slurm"), job)
    with pytest.raises(InputError) as e:
        backends.check_options(backends.get("k8s"), job)
    assert e.value.message == "--qos applies to --backend slurm, not k8s."
    r = CliRunner().invoke(app, ["--json", "train", "backends", "slurm"])
    assert r.exit_code == 0, r.output
    [slurm] = json.loads(r.output)
    assert {"name": "qos", "flag": "--qos", "type": "str", "default": None, "help": EXTRA.help} in slurm[
        "options"
    ]


def test_a_new_option_grows_the_commands_flags(slurm_with_qos: None) -> None:
    def command(detach: bool = False, **job: object) -> None: ...

    params = inspect.signature(train_cmd._with_job_flags(command)).parameters
    names = list(params)
    assert "job_qos" in names and names[-1] == "detach"
    assert params["job_qos"].default is None


def test_without_the_declaration_the_option_is_unknown() -> None:
    with pytest.raises(TypeError, match="qos"):
        JobOptions(qos="high")


def test_the_flags_are_the_declared_options_and_carry_their_help() -> None:
    train = typer.main.get_command(app).commands["train"]  # type: ignore[attr-defined]
    by_name = {p.name: p for p in train.params}
    for name, option in opts.declared().items():
        param = by_name["job_" + name]
        assert param.opts == [option.cli_flag] and param.help == option.flag_help
    assert by_name["job_time_limit"].opts == ["--time"]  # not the run's --time-limit
    assert by_name["job_requeue"].secondary_opts == ["--no-requeue"]
    assert by_name["job_min_nodes"].min == 1


def test_the_cli_turns_its_flags_into_job_options(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}
    monkeypatch.setattr(
        "labctl.cli.train_cmd.run_command", lambda ctx, work, *a: seen.setdefault("work", work)
    )
    import labctl.train.request as request

    made: list[JobOptions] = []
    real = request.TrainRequest

    def spy(**kw: object) -> object:
        made.append(kw["job"])  # type: ignore[arg-type]
        return real(**kw)  # type: ignore[arg-type]

    monkeypatch.setattr(request, "TrainRequest", spy)
    r = CliRunner().invoke(
        app,
        ["train", "--phase", "1", "--backend", "slurm", "--time", "1:00:00", "--no-requeue", "--nodes", "2"],
    )
    assert r.exit_code == 0, r.output
    assert made == [JobOptions(time_limit="1:00:00", requeue=False, nodes=2)]


@pytest.mark.parametrize(
    ("job", "message"),
    [
        ({"nodes": 0}, "--nodes 0 is out of range: a job runs on one node at least."),
        ({"gpus_per_node": -1}, "--gpus-per-node -1 is out of range: a node cannot have fewer than 0 GPUs."),
        ({"cpus_per_node": 0}, "--cpus-per-node 0 is out of range: a node gives the job one CPU at least."),
        ({"memory_per_node": "lots"}, "--memory-per-node 'lots' is not an amount of memory."),
    ],
)
def test_the_declared_bounds_and_checks_refuse_bad_values(job: dict[str, object], message: str) -> None:
    with pytest.raises(InputError) as e:
        JobOptions(**job)
    assert e.value.message == message


def test_a_shared_option_keeps_each_backends_meaning_and_one_flag() -> None:
    nodes = {n: o for n in backends.names() for o in backends.get(n).options if o.name == "nodes"}
    assert nodes["sagemaker"].default == 1 and nodes["slurm"].default is None
    assert opts.declared()["nodes"].bound is not None  # the cluster declaration's bound holds for all


def test_two_declarations_that_disagree_on_the_flag_are_refused() -> None:
    with pytest.raises(ValueError, match="flag"):
        opts.merge([Option("x", str, "a", flag="--x"), Option("x", str, "b", flag="--y")])


def test_backends_lists_every_backend_and_an_unknown_one_exits_2() -> None:
    r = CliRunner().invoke(app, ["--json", "train", "backends"])
    assert r.exit_code == 0, r.output
    listed = json.loads(r.output)
    assert [b["backend"] for b in listed] == list(backends.names())
    kaggle = next(b for b in listed if b["backend"] == "kaggle")
    assert [o["flag"] for o in kaggle["options"]] == ["--kaggle-id", "--resume-from"]
    # The real CLI, for its error rendering and exit code.
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", "train", "backends", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    said = proc.stdout + proc.stderr
    assert "unknown backend 'nope'" in said and "ssh, slurm, k8s, trainjob, kaggle, sagemaker" in said
    assert "Traceback" not in said


def test_job_options_are_immutable_values() -> None:
    a = JobOptions(pvc="c", cpu="1")
    assert a == JobOptions(cpu="1", pvc="c") and hash(a) == hash(JobOptions(pvc="c", cpu="1"))
    assert a.replace(cpu=None) == JobOptions(pvc="c") and a.cpu == "1"
    with pytest.raises(AttributeError):
        a.cpu = "2"
