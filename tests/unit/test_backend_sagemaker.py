"""`labctl train --backend sagemaker` (train/backends/sagemaker.py, cloud/): the CreateTrainingJob request
passes botocore's own validator against its SageMaker service model (offline), broken ones are refused
naming the flag and field, and the job's entry point from the source tarball runs for real on this
machine (LABCTL_SAGEMAKER_ROOT standing in for /opt/ml), resuming from the checkpoints folder."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("botocore", reason="the cloud extra (make install) brings botocore")
import botocore.session
import botocore.validate

from tests.unit.test_backend_kaggle import INVENTORY, PHASES, labctl_train

ROLE = "arn:aws:iam::123456789012:role/SageMakerTraining"


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id").write_text("not really a key")
    (tmp_path / "phases.yaml").write_text(PHASES)
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY)
    return inv


def write_job(inv: Path, out: Path, *args: str) -> tuple[dict[str, Any], str]:
    rc, output = labctl_train(inv, "--backend", "sagemaker", "-o", str(out), "--s3", "s3://my-lab/cet", *args)
    assert rc == 0, output
    return json.loads((out / "create-training-job.json").read_text()), output


def botocore_report(request: dict[str, Any]) -> str:
    model = botocore.session.get_session().get_service_model("sagemaker")
    shape = model.operation_model("CreateTrainingJob").input_shape
    report: str = botocore.validate.ParamValidator().validate(request, shape).generate_report()
    return report


def test_the_request_passes_botocores_validator_and_says_what_the_job_does(lab: Path, tmp_path: Path) -> None:
    request, output = write_job(lab, tmp_path / "job", "--role-arn", ROLE)
    assert botocore_report(request) == ""
    assert request["RoleArn"] == ROLE
    image = request["AlgorithmSpecification"]["TrainingImage"]
    assert image.startswith("763104351884.dkr.ecr.") and "/pytorch-training:" in image
    assert request["AlgorithmSpecification"]["TrainingInputMode"] == "File"
    # The phase's instance type (tiny phases file: ml.g4dn.xlarge), one instance.
    assert request["ResourceConfig"]["InstanceType"] == "ml.g4dn.xlarge"
    assert request["ResourceConfig"]["InstanceCount"] == 1
    assert request["StoppingCondition"]["MaxRuntimeInSeconds"] == 4 * 3600  # seed 001's 4 h a day
    assert request["CheckpointConfig"] == {
        "S3Uri": "s3://my-lab/cet/checkpoints/phase1",
        "LocalPath": "/opt/ml/checkpoints",
    }
    assert request["OutputDataConfig"]["S3OutputPath"].startswith("s3://my-lab/cet/")
    hyper = request["HyperParameters"]
    settings = json.loads(hyper["labctl_settings"])
    assert settings["checkpoint_dir"] == "/opt/ml/checkpoints" and settings["steps"] == 6
    assert settings["time_limit"] == int(hyper["labctl_time_limit_s"]) == 4 * 3600 - 600
    source = json.loads(hyper["sagemaker_submit_directory"])
    assert source.startswith("s3://my-lab/cet/") and source.endswith("/sourcedir.tar.gz")
    # The commands that submit it: the tarball to that key, then the request.
    assert f"aws s3 cp {tmp_path / 'job' / 'sourcedir.tar.gz'} {source}" in output
    assert (
        f"aws sagemaker create-training-job --region us-east-1 --cli-input-json file://{tmp_path / 'job'}"
        in output
    )
    with tarfile.open(tmp_path / "job" / "sourcedir.tar.gz") as tar:
        names = tar.getnames()
    assert json.loads(hyper["sagemaker_program"]) in names and any(n.endswith(".pyz") for n in names)

    other, _ = write_job(
        lab,
        tmp_path / "big",
        "--role-arn",
        ROLE,
        "--instance-type",
        "ml.p3.8xlarge",
        "--nodes",
        "2",
        "--time-limit",
        "90m",
    )
    assert botocore_report(other) == ""
    assert (
        other["ResourceConfig"]["InstanceType"] == "ml.p3.8xlarge"
        and other["ResourceConfig"]["InstanceCount"] == 2
    )
    assert other["StoppingCondition"]["MaxRuntimeInSeconds"] == 5400


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ((), "--backend sagemaker needs --role-arn"),
        (("--role-arn", "arn:aws:iam::12:role/x"), "--role-arn (RoleArn)"),
        (
            ("--role-arn", ROLE, "--time-limit", "4h1s"),
            "--time-limit 4h1s is over SageMaker's 4h per session",
        ),
        (("--role-arn", ROLE, "--time-limit", "30d"), "--time-limit 30d is over SageMaker's 4h"),
        (
            ("--role-arn", ROLE, "--instance-type", "ml.p9.huge"),
            "--instance-type (ResourceConfig.InstanceType)",
        ),
        (("--role-arn", ROLE, "--s3", "my-lab/cet"), "--s3 'my-lab/cet' is not an S3 location"),
        (
            ("--role-arn", ROLE, "--kaggle-id", "alice/cet-p1-s1"),
            "--kaggle-id applies to --backend kaggle, not sagemaker",
        ),
    ],
)
def test_a_broken_request_is_refused_naming_the_flag_and_field(
    lab: Path, tmp_path: Path, args: tuple[str, ...], named: str
) -> None:
    rc, output = labctl_train(
        lab, "--backend", "sagemaker", "-o", str(tmp_path / "out"), "--s3", "s3://lab-bucket/p", *args
    )
    assert rc == 2, output
    assert named in output and "Traceback" not in output
    assert not (tmp_path / "out").exists()


def run_job(job: Path, root: Path, checkpoints: Path) -> tuple[int, list[dict[str, Any]], str]:
    """One SageMaker job on this machine: the tarball in /opt/ml/code, the request's HyperParameters in
    /opt/ml/input/config, and /opt/ml/checkpoints as SageMaker fills it from CheckpointConfig.S3Uri."""
    request = json.loads((job / "create-training-job.json").read_text())
    code = root / "code"
    code.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO((job / "sourcedir.tar.gz").read_bytes())) as tar:
        tar.extractall(code, filter="data")
    (root / "input" / "config").mkdir(parents=True)
    (root / "input" / "config" / "hyperparameters.json").write_text(json.dumps(request["HyperParameters"]))
    (root / "checkpoints").symlink_to(checkpoints)
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LABCTL_RUN_ID")}
    proc = subprocess.run(
        [sys.executable, json.loads(request["HyperParameters"]["sagemaker_program"])],
        cwd=code,
        env={
            **clean,
            **request["Environment"],
            "LABCTL_SAGEMAKER_ROOT": str(root),
            "LABCTL_TRAIN_DEVICE": "cpu",
        },
        capture_output=True,
        text=True,
        timeout=240,
    )
    events = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return proc.returncode, events, proc.stdout + proc.stderr


def test_the_jobs_entry_point_trains_and_the_next_job_resumes(lab: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    s3_checkpoints = tmp_path / "s3-checkpoints"  # what CheckpointConfig.S3Uri holds between jobs
    s3_checkpoints.mkdir()
    write_job(lab, tmp_path / "job1", "--role-arn", ROLE, "--time-limit", "5m")
    rc, events, out = run_job(tmp_path / "job1", tmp_path / "ml1", s3_checkpoints)
    assert rc == 0, out
    assert next(e for e in events if e["event"] == "start")["resumed_from"] is None
    assert events[-1]["event"] == "done" and (s3_checkpoints / "step-00000006.pt").is_file()

    write_job(lab, tmp_path / "job2", "--role-arn", ROLE, "--time-limit", "5m", "--set", "steps=9")
    rc, events, out = run_job(tmp_path / "job2", tmp_path / "ml2", s3_checkpoints)
    assert rc == 0, out
    assert next(e for e in events if e["event"] == "start")["resumed_from"] == 6
    assert [e["step"] for e in events if e["event"] == "step"] == [7, 8, 9]
    assert (tmp_path / "ml2" / "model" / "metrics.jsonl").is_file()  # uploaded as the job's model output


def test_several_gpus_or_instances_run_the_trainer_under_torchrun_at_the_first_host() -> None:
    from labctl.train.backends.cloud.session import launcher

    assert launcher({}) == [] and launcher({"SM_HOSTS": '["algo-1"]', "SM_NUM_GPUS": "1"}) == []
    argv = launcher({"SM_HOSTS": '["algo-1", "algo-2"]', "SM_CURRENT_HOST": "algo-2", "SM_NUM_GPUS": "4"})
    assert argv[:2] == ["-m", "torch.distributed.run"]
    assert {"--nnodes=2", "--node-rank=1", "--nproc-per-node=4", "--master-addr=algo-1"} <= set(argv)


def test_without_botocore_the_request_is_refused_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from labctl.output.errors import InputError
    from labctl.train.backends.sagemaker import validate

    # botocore is installed here; a None entry in sys.modules makes its import fail as if it were not.
    monkeypatch.setitem(sys.modules, "botocore.session", None)
    with pytest.raises(InputError, match="botocore is not installed") as err:
        validate({})
    # The command that installs the extra into this labctl's own environment, its pin included.
    assert f"{sys.executable} -m pip install botocore==" in err.value.hint


def test_a_users_script_travels_in_the_tarball_and_runs_with_the_jobs_limit(
    lab: Path, tmp_path: Path
) -> None:
    script = tmp_path / "mine.py"
    script.write_text(
        "import json, os, sys\n"
        'print(json.dumps({"argv": sys.argv[1:], "limit": os.environ["LABCTL_TIME_LIMIT_S"],'
        ' "ckpt": os.environ["LABCTL_CHECKPOINT_DIR"]}))\n'
    )
    request, _ = write_job(
        lab,
        tmp_path / "job",
        "--role-arn",
        ROLE,
        "--script",
        str(script),
        "--script-args",
        "--data /opt/ml/input",
        "--time-limit",
        "1h",
    )
    assert botocore_report(request) == ""
    with tarfile.open(tmp_path / "job" / "sourcedir.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["labctl_entry.py", "mine.py"]
    (tmp_path / "s3").mkdir()
    rc, events, out = run_job(tmp_path / "job", tmp_path / "ml", tmp_path / "s3")
    assert rc == 0, out
    (seen,) = events
    assert seen["argv"] == ["--data", "/opt/ml/input"] and 0 < int(seen["limit"]) <= 3600 - 360
    assert seen["ckpt"] == str(tmp_path / "ml" / "checkpoints")
