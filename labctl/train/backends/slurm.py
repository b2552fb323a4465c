"""`--backend slurm`: the run as a Slurm batch script (and the agent zip beside it)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from labctl.errors import InputError
from labctl.fsutil import write_atomic
from labctl.train.backends import jobs
from labctl.train.request import JobOptions
from labctl.train.spec import LaunchSpec

# Slurm confines the job to --cpus-per-task CPUs; with nothing else to go on, give each worker
# process room for its own threads and a DataLoader worker or two.
_CPUS_PER_WORKER = 4
# fullmatch, not `$`: `$` also matches before a final newline, which would end the #SBATCH line.
_SLURM_TIME = re.compile(r"(\d+-)?\d+(:\d+){0,2}|(?i:unlimited|infinite)")
_SLURM_PARTITION = re.compile(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*")


class SlurmBackend(jobs.JobFileBackend):
    name = "slurm"
    options = ("partition", "time_limit")

    def write(self, spec: LaunchSpec, folder: Path, job: JobOptions) -> list[Path]:
        agent = jobs.agent_for(spec)
        script = render_sbatch(
            spec, agent[1] if agent else None, partition=job.partition, time_limit=job.time_limit
        )
        written = [folder / f"train-phase{spec.phase}.sbatch"]
        write_atomic(written[0], script, mode=0o755)
        if agent:
            written.append(folder / agent[1])
            write_atomic(written[1], agent[0])
        return written

    def submit_command(self, paths: list[Path]) -> str:
        # sbatch runs the script from where it is submitted, and it finds the trainer beside it.
        return f"cd {shlex.quote(str(paths[0].parent))} && sbatch {paths[0].name}"


def render_sbatch(
    spec: LaunchSpec, agent_name: str | None, *, partition: str | None = None, time_limit: str | None = None
) -> str:
    """The Slurm batch script: one torchrun per allocated node, rendezvous at the first one.

    `agent_name` is the agent zip's file name next to the script (None for a user's script).
    """
    nproc, device = jobs.uniform(spec)
    if partition is not None and not _SLURM_PARTITION.fullmatch(partition):
        raise InputError(
            f"partition {partition!r} is not a Slurm partition name.", "Use e.g. --partition gpu."
        )
    if time_limit is not None and not _SLURM_TIME.fullmatch(time_limit):
        raise InputError(
            f"time limit {time_limit!r} is not in a form Slurm reads.",
            "Use minutes, HH:MM:SS or D-HH:MM:SS, e.g. --time 2-00:00:00.",
        )
    derived = time_limit is None and jobs.job_limit_s(spec) is not None
    if derived:
        time_limit = slurm_time(jobs.job_limit_s(spec) or 0)
    name = "labctl-" + re.sub(r"[^A-Za-z0-9._-]", "-", spec.run_id)
    env, differing = jobs.portable_env(spec, device)

    lines = [
        "#!/bin/bash",
        f"# labctl training run {jobs.oneline(spec.run_id)}, phase {spec.phase}, as a Slurm batch job.",
        f"# Submit from this folder: sbatch train-phase{spec.phase}.sbatch",
    ]
    if agent_name:
        lines.append(f"# ({agent_name} must stay next to this script, on a filesystem every node sees.)")
    lines += ["# Options given to sbatch on its command line override the #SBATCH lines below."]
    if spec.settings.get("time_limit"):
        lines.append(
            f"# Time-boxed: the trainer pauses with a checkpoint by {spec.settings['time_limit']} s"
            + (f"; --time leaves {jobs.JOB_GRACE_S} s more for start-up." if derived else ".")
            + " Submit again to resume."
        )
    lines += jobs.heterogeneity_note(spec, nproc)
    lines += [f"# {note}" for note in jobs.differing_notes(differing)]
    lines += [
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={spec.nnodes}",
        "#SBATCH --ntasks-per-node=1",  # one torchrun per node; it forks the workers itself
    ]
    if device == "cuda":
        lines.append(f"#SBATCH --gpus-per-node={nproc}")
    lines += [
        f"#SBATCH --cpus-per-task={nproc * _cpus_per_worker(env)}",
        f"#SBATCH --output={name}-%j.out",
    ]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if time_limit:
        lines.append(f"#SBATCH --time={time_limit}")
    lines += [
        "set -euo pipefail",
        ': "${SLURM_JOB_ID:?submit this script with sbatch}"',
        'PYTHON="${PYTHON:-python3}"  # the interpreter with torch on the nodes; override from the environment',
        "",
    ]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in sorted(env.items())]
    if agent_name:
        lines += [
            f'agent="$SLURM_SUBMIT_DIR"/{shlex.quote(agent_name)}',
            'if [ ! -f "$agent" ]; then',
            '    echo "labctl: $agent not found: submit from the folder that holds it and this script" >&2',
            "    exit 2",
            "fi",
            'export PYTHONPATH="$agent${PYTHONPATH:+:$PYTHONPATH}"',
        ]
    lines += [
        "",
        # Read the whole list rather than `| head -n1`: head exiting early can SIGPIPE scontrol on
        # a long node list, and pipefail would then end the job.
        'nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        "head_node=${nodes%%$'\\n'*}",
        "",
    ]
    command = [
        # --kill-on-bad-exit: once one node's torchrun gives up, the others would otherwise sit
        # in rendezvous until join_timeout.
        f'srun --kill-on-bad-exit=1 "$PYTHON" -m {jobs.TORCHRUN}',
        '--nnodes="$SLURM_NNODES"',
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f'--rdzv-endpoint="$head_node":{spec.port}',
        # The job id, not the run id: a resubmitted job must not join the last one's rendezvous.
        '--rdzv-id="$SLURM_JOB_ID"',
        f"--rdzv-conf=join_timeout={spec.rdzv_timeout}",
        f"--max-restarts={spec.max_restarts}",
        "--tee=3",  # the rank prefix (LOG_PREFIX_ENV) is applied to tee'd output only
        shlex.join(spec.entry_argv()),
    ]
    lines.append(" \\\n    ".join(command))
    return "\n".join(lines) + "\n"


def slurm_time(seconds: int) -> str:
    """Seconds as Slurm's D-HH:MM:SS, rounded up to the minute."""
    minutes = -(-seconds // 60)
    days, minutes = divmod(minutes, 1440)
    text = f"{minutes // 60:02d}:{minutes % 60:02d}:00"
    return f"{days}-{text}" if days else text


def _cpus_per_worker(env: dict[str, str]) -> int:
    threads = env.get("OMP_NUM_THREADS", "")
    return int(threads) if threads.isdigit() and int(threads) > 0 else _CPUS_PER_WORKER
