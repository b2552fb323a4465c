"""`--backend sagemaker`: the run as a SageMaker CreateTrainingJob request, and its source tarball.

`create-training-job.json` is the request as `aws sagemaker create-training-job --cli-input-json`
reads it, checked offline against botocore's own SageMaker service model (the shapes the AWS
CLI validates against), so a request that would be refused is refused here, naming the field.
`sourcedir.tar.gz` holds the launcher (backends/cloud/session.py, as `labctl_entry.py`) and the trainer
bundle; the training image's toolkit fetches it from `sagemaker_submit_directory` and runs
the launcher, as the SageMaker Python SDK's PyTorch estimator does. The trainer's settings and
time limit travel in HyperParameters, so the request says everything the job will do.

Checkpoints: SageMaker copies CheckpointConfig.S3Uri into /opt/ml/checkpoints when a job starts
and syncs it back while it runs. The S3 folder is the phase's, not the run's, so the next
session (another job) resumes where this one stopped.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Any

from labctl.output.errors import InputError, install_extra
from labctl.output.files import write_output
from labctl.train.backends import Option
from labctl.train.backends.cloud import bundle as cloud_bundle
from labctl.train.backends.cloud.backend import CloudBackend, checkpoint_subdir, required
from labctl.train.backends.cloud.platforms import SAGEMAKER, SAGEMAKER_INSTANCE
from labctl.train.duration import format_duration
from labctl.train.request import JobOptions
from labctl.train.spec import RUN_ENV, TIME_LIMIT_ENV, LaunchSpec
from labctl.transport.shell import quote

REQUEST = "create-training-job.json"
SOURCE = "sourcedir.tar.gz"
ENTRY = "labctl_entry.py"
CHECKPOINTS = "/opt/ml/checkpoints"
DEFAULT_REGION = "us-east-1"
# The AWS Deep Learning Containers' PyTorch training image (sagemaker flavour); its account is
# 763104351884 in most regions (a few, e.g. af-south-1 and ap-east-1, have their own: use --image).
DLC_ACCOUNT = "763104351884"
DLC_TAG = "2.5.1-gpu-py311-cu124-ubuntu22.04-sagemaker"
_S3 = re.compile(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/.*)?")
# The request's fields and the flags that set them, so a refusal names what to change.
FLAGS = {
    "RoleArn": "--role-arn",
    "ResourceConfig.InstanceType": "--instance-type",
    "ResourceConfig.InstanceCount": "--nodes",
    "AlgorithmSpecification.TrainingImage": "--image",
    "CheckpointConfig.S3Uri": "--s3",
    "OutputDataConfig.S3OutputPath": "--s3",
    "StoppingCondition.MaxRuntimeInSeconds": "--time-limit",
}


def region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION


def default_image(where: str) -> str:
    """The AWS PyTorch training Deep Learning Container for `where`."""
    return f"{DLC_ACCOUNT}.dkr.ecr.{where}.amazonaws.com/pytorch-training:{DLC_TAG}"


def job_name(run_id: str) -> str:
    """TrainingJobName: letters, digits and dashes, at most 63."""
    base = re.sub(r"-+", "-", re.sub(r"[^A-Za-z0-9-]", "-", f"labctl-{run_id}")).strip("-")
    return base[:63].rstrip("-")


def s3_prefix(value: str) -> tuple[str, str]:
    """(bucket, key prefix without slashes at its ends) of --s3."""
    m = _S3.fullmatch(value)
    if not m:
        raise InputError(
            f"--s3 {value!r} is not an S3 location.", "Write s3://BUCKET/PREFIX, e.g. --s3 s3://my-lab/cet."
        )
    return m.group(1), (m.group(2) or "").strip("/")


def build_request(spec: LaunchSpec, job: JobOptions, source_uri: str, where: str) -> dict[str, Any]:
    """The CreateTrainingJob request for `spec` (not yet validated).

    `spec.time_limit_s` is the session asked for: MaxRuntimeInSeconds, and the trainer's
    `time_limit` a margin before it (HyperParameters and the environment).
    """
    role = required(
        job.role_arn,
        "--role-arn",
        "sagemaker",
        "arn:aws:iam::123456789012:role/SageMakerTraining",
        "the IAM role the job runs as (RoleArn)",
    )
    bucket, prefix = s3_prefix(
        required(
            job.s3, "--s3", "sagemaker", "s3://my-lab/cet", "where the source, checkpoints and output go"
        )
    )
    base = f"s3://{bucket}/{prefix}".rstrip("/")
    session_s, limit_s = SAGEMAKER.limits(spec.time_limit_s)
    settings = {**spec.settings, "checkpoint_dir": CHECKPOINTS, "metrics_path": "/opt/ml/model/metrics.jsonl"}
    settings["time_limit"] = limit_s
    hyper = {
        # JSON-encoded as the SageMaker Python SDK writes them; the training toolkit decodes them.
        "sagemaker_program": json.dumps(ENTRY),
        "sagemaker_submit_directory": json.dumps(source_uri),
        "sagemaker_region": json.dumps(where),
        "sagemaker_container_log_level": "20",
        "labctl_run_id": spec.run_id,
        "labctl_time_limit_s": str(limit_s),
        "labctl_settings": json.dumps(settings, sort_keys=True, separators=(",", ":")),
    }
    return {
        "TrainingJobName": job_name(spec.run_id),
        "AlgorithmSpecification": {
            "TrainingImage": job.image or default_image(where),
            "TrainingInputMode": "File",
        },
        "RoleArn": role,
        "HyperParameters": hyper,
        "Environment": {RUN_ENV: spec.run_id, TIME_LIMIT_ENV: str(limit_s)},
        "OutputDataConfig": {"S3OutputPath": f"{base}/output"},
        "ResourceConfig": {
            "InstanceType": job.instance_type or SAGEMAKER_INSTANCE,
            "InstanceCount": job.nodes or 1,
            "VolumeSizeInGB": 30,
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": session_s},
        "CheckpointConfig": {"S3Uri": f"{base}/{checkpoint_subdir(spec.phase)}", "LocalPath": CHECKPOINTS},
        "Tags": [
            {"Key": "labctl-run", "Value": spec.run_id},
            {"Key": "labctl-phase", "Value": str(spec.phase)},
        ],
    }


def validate(request: dict[str, Any]) -> None:
    """Refuse what SageMaker would refuse, judged by botocore's service model, offline.

    botocore's ParamValidator checks types, required members and minimums; the model's
    patterns, enums and maximums (which it leaves to the service) are checked here from the
    same shapes.
    """
    try:
        import botocore.session
        import botocore.validate
    except ImportError:
        raise InputError(
            "--backend sagemaker checks its request against botocore's SageMaker model, and botocore is not installed.",
            f"Install labctl's cloud extra: {install_extra('cloud')}",
        ) from None
    model = botocore.session.get_session().get_service_model("sagemaker")
    shape = model.operation_model("CreateTrainingJob").input_shape
    report = botocore.validate.ParamValidator().validate(request, shape)
    problems = [line.strip() for line in report.generate_report().splitlines() if line.strip()][1:]
    problems += _beyond_validator(request, shape, "")
    if problems:
        named = [p for p in (_flag_for(p) for p in problems) if p]
        raise InputError(
            "The SageMaker request is not one CreateTrainingJob accepts:\n  " + "\n  ".join(problems),
            f"Change {', '.join(dict.fromkeys(named))}." if named else "Fix the phase's settings.",
        )


def _beyond_validator(value: Any, shape: Any, path: str) -> list[str]:
    kind = shape.type_name
    if kind == "structure" and isinstance(value, dict):
        out: list[str] = []
        for key, member in shape.members.items():
            if key in value:
                out += _beyond_validator(value[key], member, f"{path}.{key}" if path else key)
        return out
    if kind == "list" and isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _beyond_validator(v, shape.member, f"{path}[{i}]")]
    if kind == "map" and isinstance(value, dict):
        out = [p for k in value for p in _beyond_validator(k, shape.key, f"{path} key {k!r}")]
        out += [p for k, v in value.items() for p in _beyond_validator(v, shape.value, f"{path}.{k}")]
        if "max" in shape.metadata and len(value) > shape.metadata["max"]:
            out.append(f"{path}: {len(value)} entries, at most {shape.metadata['max']}")
        return out
    meta = shape.metadata
    if kind == "string" and isinstance(value, str):
        if shape.enum and value not in shape.enum:
            return [
                f"{path}: {value!r} is not one of SageMaker's values (e.g. {', '.join(shape.enum[:3])}, ...)"
            ]
        if "max" in meta and len(value) > meta["max"]:
            return [f"{path}: {len(value)} characters, at most {meta['max']}"]
        pattern = _compiled(meta.get("pattern"))
        if pattern is not None and not pattern.fullmatch(value):
            return [f"{path}: {value!r} does not match {meta['pattern']}"]
    if kind in ("integer", "long") and isinstance(value, int) and "max" in meta and value > meta["max"]:
        return [f"{path}: {value} is over {meta['max']}"]
    return []


@functools.cache
def _compiled(pattern: str | None) -> re.Pattern[str] | None:
    """The model's pattern as a Python regex; None where it is Java-only (\\p{L} classes): not judged here."""
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error:
        return None


def _flag_for(problem: str) -> str | None:
    for field, flag in FLAGS.items():
        if re.search(rf'(^|[\s"]){re.escape(field)}($|[\s",:])', problem):
            return f"{flag} ({field})"
    return None


class SageMakerBackend(CloudBackend):
    name = "sagemaker"
    options = (
        Option(
            "role_arn",
            str,
            "the IAM role the job runs as (RoleArn; required)",
            flag_help="IAM role SageMaker runs the job as (--backend sagemaker).",
        ),
        Option(
            "s3",
            str,
            "s3://bucket/prefix for the source, checkpoints and output (required)",
            flag_help="s3://bucket/prefix for --backend sagemaker's source, checkpoints and output.",
        ),
        Option(
            "instance_type",
            str,
            "the instance type (default: the phase's)",
            SAGEMAKER_INSTANCE,
            flag_help=f"SageMaker instance type (default: the phase's, else {SAGEMAKER_INSTANCE}).",
        ),
        Option("nodes", int, "the instance count (InstanceCount)", 1),
        Option("image", str, "the training image (default: the region's PyTorch Deep Learning Container)"),
    )

    def write_session(self, spec: LaunchSpec, folder: Path, job: JobOptions) -> list[Path]:
        where = region()
        bucket, prefix = s3_prefix(
            required(
                job.s3, "--s3", "sagemaker", "s3://my-lab/cet", "where the source, checkpoints and output go"
            )
        )
        key = "/".join(p for p in (prefix, spec.run_id, "source", SOURCE) if p)
        request = build_request(spec, job, f"s3://{bucket}/{key}", where)
        validate(request)
        session_s, limit_s = SAGEMAKER.limits(spec.time_limit_s)
        trainer = cloud_bundle.trainer_bundle(Path(spec.script) if spec.script else None, spec.script_args)
        config = cloud_bundle.session_config(
            platform="sagemaker",
            run_id=spec.run_id,
            phase=spec.phase,
            settings={},  # read from the request's HyperParameters when the job starts
            time_limit_s=limit_s,
            bundle=trainer,
            paused_exit=0,  # a paused session is a job that did its part: Completed, checkpoints synced
            checkpoint_subdir=checkpoint_subdir(spec.phase),
        )
        header = [
            f"labctl training run {spec.run_id}, phase {spec.phase}: the SageMaker job's entry point.",
            f"The job runs {format_duration(session_s)} at most; the trainer stops at {format_duration(limit_s)},",
            f"resumable from {CHECKPOINTS} (synced with {request['CheckpointConfig']['S3Uri']}).",
            "LABCTL_SAGEMAKER_ROOT=DIR replaces /opt/ml to run it elsewhere.",
        ]
        tar = cloud_bundle.tarball(
            {ENTRY: cloud_bundle.session_source(config, header).encode(), trainer.name: trainer.data}
        )
        written = [folder / REQUEST, folder / SOURCE]
        write_output(written[0], json.dumps(request, indent=2) + "\n")
        write_output(written[1], tar)
        return written

    def submit_command(self, paths: list[Path]) -> str:
        request = json.loads(paths[0].read_text())
        source = json.loads(request["HyperParameters"]["sagemaker_submit_directory"])
        where = json.loads(request["HyperParameters"]["sagemaker_region"])
        return (
            f"aws s3 cp {quote(str(paths[1]))} {quote(source)} --region {quote(where)} && "
            f"aws sagemaker create-training-job --region {quote(where)} --cli-input-json {quote('file://' + str(paths[0]))}"
        )
