"""`--backend kaggle`: the run as a Kaggle kernel folder, ready for `kaggle kernels push`.

The folder holds `kernel-metadata.json` (GPU on, internet off, private, and the previous
session's kernel as a kernel source when `--resume-from` names one), the script Kaggle runs,
and the trainer bundle beside it. Kaggle pushes the code file alone, so the script carries
the trainer (the agent zip, in base64) inside itself; the bundle beside it is the same bytes,
for reading. The script checkpoints into /kaggle/working, which Kaggle keeps as the session's
output; the next session attaches that output and resumes from it.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from labctl.agent.train.settings import EXIT_PAUSED
from labctl.output.errors import InputError
from labctl.output.files import write_output
from labctl.train.backends import Option
from labctl.train.backends.cloud import bundle as cloud_bundle
from labctl.train.backends.cloud.backend import CloudBackend, checkpoint_subdir, required
from labctl.train.backends.cloud.platforms import KAGGLE
from labctl.train.duration import format_duration
from labctl.train.request import JobOptions
from labctl.train.spec import LaunchSpec

METADATA = "kernel-metadata.json"
# Kaggle user names are letters, digits and dashes/underscores; a kernel slug is its title in lower
# case with dashes, and the kaggle CLI wants a title of at least five characters.
_KERNEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*/[a-z0-9](?:[a-z0-9-]{3,48})[a-z0-9]")


def kernel_id(value: str, flag: str) -> str:
    if not _KERNEL_ID.fullmatch(value):
        raise InputError(
            f"{flag} {value!r} is not a Kaggle kernel id.",
            f"Write USER/SLUG, e.g. {flag} alice/cet-phase1-s1: a slug of 5 to 50 lowercase letters, digits and dashes.",
        )
    return value


class KaggleBackend(CloudBackend):
    name = "kaggle"
    options = (
        Option(
            "kaggle_id",
            str,
            "the USER/SLUG this session is pushed as (required)",
            flag_help="USER/SLUG the --backend kaggle session is pushed as.",
        ),
        Option(
            "resume_from",
            str,
            "USER/SLUG of the session whose checkpoints this one resumes",
            flag_help="USER/SLUG of the Kaggle session whose checkpoints this one resumes.",
        ),
    )

    def write_session(self, spec: LaunchSpec, folder: Path, job: JobOptions) -> list[Path]:
        kid = kernel_id(
            required(
                job.kaggle_id,
                "--kaggle-id",
                "kaggle",
                f"alice/cet-phase{spec.phase}-s1",
                "the USER/SLUG this session is pushed as",
            ),
            "--kaggle-id",
        )
        resume = kernel_id(job.resume_from, "--resume-from") if job.resume_from else None
        if resume == kid:
            raise InputError(
                f"--resume-from {resume} is this session's own id.",
                "Give each session its own slug (…-s1, …-s2) and resume from the one before.",
            )
        session_s, limit_s = KAGGLE.limits(spec.time_limit_s)
        trainer = cloud_bundle.trainer_bundle(Path(spec.script) if spec.script else None, spec.script_args)
        config = cloud_bundle.session_config(
            platform="kaggle",
            run_id=spec.run_id,
            phase=spec.phase,
            settings=spec.settings,
            time_limit_s=limit_s,
            bundle=trainer,
            paused_exit=EXIT_PAUSED,
            checkpoint_subdir=checkpoint_subdir(spec.phase),
            resume_from=resume,
            embed=True,
        )
        slug = kid.split("/")[1]
        code_file = f"train-phase{spec.phase}.py"
        header = [
            f"labctl training run {spec.run_id}, phase {spec.phase}, as a Kaggle session ({KAGGLE.gpu}).",
            f"Push with: kaggle kernels push -p . (from this folder; {METADATA} says GPU on, internet off).",
            f"The session gets {format_duration(session_s)}; the trainer stops at {format_duration(limit_s)} with a",
            f"checkpoint in /kaggle/working/{checkpoint_subdir(spec.phase)} (exit {EXIT_PAUSED}), or finishes (exit 0).",
            "This file is self-contained: the trainer travels inside it, in base64, below.",
            "Run it anywhere with torch: LABCTL_KAGGLE_ROOT=DIR replaces /kaggle.",
        ]
        if resume:
            header.append(
                f"It resumes from {resume}'s /kaggle/input/{resume.split('/')[1]}/{checkpoint_subdir(spec.phase)}."
            )
        metadata = {
            "id": kid,
            "title": slug,  # the slug Kaggle derives from the title must be the id's
            "code_file": code_file,
            "language": "python",
            "kernel_type": "script",
            "is_private": True,
            "enable_gpu": True,
            "enable_tpu": False,
            "enable_internet": False,
            "dataset_sources": [],
            "competition_sources": [],
            "kernel_sources": [resume] if resume else [],
            "model_sources": [],
        }
        written = [folder / METADATA, folder / code_file, folder / trainer.name]
        write_output(written[0], json.dumps(metadata, indent=2) + "\n")
        write_output(written[1], cloud_bundle.session_source(config, header, embed=trainer), mode=0o755)
        write_output(written[2], trainer.data)
        return written

    def submit_command(self, paths: list[Path]) -> str:
        folder = paths[0].parent
        meta = json.loads(paths[0].read_text())
        kid = meta["id"]
        return (
            f"kaggle kernels push -p {shlex.quote(str(folder))}\n"
            f"  then: kaggle kernels status {kid}; when it ends, kaggle kernels output {kid} -p OUT fetches its checkpoints,\n"
            f"  and the next session resumes with: labctl train ... --backend kaggle --kaggle-id {kid}-next --resume-from {kid}"
        )
