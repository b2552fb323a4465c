"""`--backend slurm`: the run as a Slurm batch script (and the agent zip beside it)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from labctl.output.errors import InputError
from labctl.output.files import write_output
from labctl.train.backends import Option, jobs
from labctl.train.request import ClusterShape, JobOptions
from labctl.train.spec import LaunchSpec
from labctl.transport.shell import command_line, export_lines, quote

if TYPE_CHECKING:
    from labctl.train.phases import Settings

# Slurm confines the job to --cpus-per-task CPUs; with nothing else to go on, give each worker
# process room for its own threads and a DataLoader worker or two.
_CPUS_PER_WORKER = 4
# fullmatch, not `$`: `$` also matches before a final newline, which would end the #SBATCH line.
_SLURM_TIME = re.compile(r"(\d+-)?\d+(:\d+){0,2}|(?i:unlimited|infinite)", re.ASCII)
_SLURM_PARTITION = re.compile(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*")
IFACE_ENV = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
# Run on each node inside the job step, before torchrun: NCCL and Gloo use the interface that
# reaches the head node. The head's NodeAddr is often a name (the node's own name when slurm.conf
# gives none), which `ip` does not take: each node resolves it itself, as its own resolver says
# (resolved once on the head, a Debian head's 127.0.1.1 would reach the others). On the head node
# itself the interface is the one holding its address (a route to one's own address says `lo`,
# which other nodes cannot reach); a head address on loopback is a one-node job, where `lo` is
# right. No `ip` or no answer: torch picks.
_IFACE_AT_START = (
    'a="$LABCTL_HEAD_ADDR"; '
    "to=$(getent ahostsv4 \"$a\" 2>/dev/null | awk '{print $1; exit}'); "
    'to="${to:-$a}"; '
    "dev=$(ip -o addr show to \"$to\" 2>/dev/null | awk '{print $2; exit}'); "
    '[ -n "$dev" ] || dev=$(ip -o route get "$to" 2>/dev/null | sed -n \'s/.* dev \\([^ ]*\\).*/\\1/p\'); '
    'if [ -n "$dev" ]; then export GLOO_SOCKET_IFNAME="$dev" NCCL_SOCKET_IFNAME="$dev"; '
    'else echo "labctl: $(hostname): no interface found towards $a; NCCL and Gloo pick one" >&2; fi; '
    'exec "$@"'
)


class SlurmBackend(jobs.JobFileBackend):
    name = "slurm"
    options = (
        Option(
            "partition",
            str,
            "the Slurm partition (#SBATCH --partition)",
            flag_help="Slurm partition for --backend slurm.",
        ),
        Option(
            "time_limit",
            str,
            "Slurm's own time limit (#SBATCH --time); default: the run's time limit and "
            f"{jobs.JOB_GRACE_S} s for start-up, else none",
            # --time-limit is the run's own limit, which every backend reads.
            flag="--time",
            flag_help="Slurm's own time limit, e.g. 2-00:00:00 (default: from --time-limit).",
        ),
        Option(
            "requeue",
            bool,
            "requeue a preempted job, which resumes from its checkpoint",
            True,
            flag_help="slurm: requeue a preempted or failed node's job; it resumes from its newest checkpoint.",
        ),
        *jobs.CLUSTER_OPTIONS,
    )

    def with_phase(self, job: JobOptions, settings: Settings) -> JobOptions:
        named = next((settings.env[k] for k in IFACE_ENV if settings.env.get(k)), None)
        return job.replace(named_iface=named)

    def write(self, spec: LaunchSpec, folder: Path, job: JobOptions) -> list[Path]:
        agent = jobs.agent_for(spec)
        script = render_sbatch(
            spec,
            agent[1] if agent else None,
            partition=job.partition,
            time_limit=job.time_limit,
            requeue=job.requeue is not False,
            named_iface=job.named_iface,
            cluster=job.cluster(),
        )
        written = [folder / f"train-phase{spec.phase}.sbatch"]
        write_output(written[0], script, mode=0o755)
        if agent:
            written.append(folder / agent[1])
            write_output(written[1], agent[0])
        return written

    def notes(self, spec: LaunchSpec, job: JobOptions) -> list[str]:
        """What the nodes must have: no lab host was asked about them, and Slurm does not check it."""
        if spec.script:
            return [
                *super().notes(spec, job),
                "your script's checkpoints belong on a filesystem every node sees, so a requeued job resumes there.",
            ]
        ckpt = str(spec.settings.get("checkpoint_dir") or "")
        where = ckpt if ckpt.startswith("/") else f"{ckpt} under the folder sbatch is submitted from"
        return [
            *super().notes(spec, job),
            jobs.TORCH_NEEDED.format(where="on the nodes, in $PYTHON or else python3"),
            f"checkpoints go to {where}: put it on a filesystem every node sees, so a requeued job resumes there.",
        ]

    def submit_command(self, paths: list[Path]) -> str:
        # sbatch runs the script from where it is submitted, and it finds the trainer beside it.
        return f"cd {quote(str(paths[0].parent))} && sbatch {quote(paths[0].name)}"


def render_sbatch(
    spec: LaunchSpec,
    agent_name: str | None,
    *,
    partition: str | None = None,
    time_limit: str | None = None,
    requeue: bool = True,
    named_iface: str | None = None,
    cluster: ClusterShape | None = None,
) -> str:
    """The Slurm batch script: one torchrun per allocated node, rendezvous at the first one.

    `agent_name` is the agent zip's file name next to the script (None for a user's script).
    `requeue`: Slurm may requeue the job (preemption, a node failing), and it resumes from the
    newest checkpoint. `named_iface`: the interface the phase names for NCCL/Gloo; None: each node
    takes the one that reaches the head node, at job start (the lab host's probed one means
    nothing on a cluster's nodes). `cluster`: the nodes as the flags describe them (GPUs, CPUs and
    memory each asks for); None: as many GPUs as processes, CPUs for each process's threads.
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
    for key in IFACE_ENV:
        env.pop(key, None)
        differing.pop(key, None)
        if named_iface:
            env[key] = named_iface

    lines = [
        "#!/bin/bash",
        f"# labctl training run {jobs.oneline(spec.run_id)}, phase {spec.phase}, as a Slurm batch job.",
        f"# Submit from this folder: sbatch train-phase{spec.phase}.sbatch",
    ]
    if agent_name:
        lines.append(f"# ({agent_name} must stay next to this script, on a filesystem every node sees.)")
    lines += ["# Options given to sbatch on its command line override the #SBATCH lines below."]
    if spec.time_limit_s:
        lines.append(
            f"# Time-boxed: the trainer pauses with a checkpoint by {spec.time_limit_s} s"
            + (f"; --time leaves {jobs.JOB_GRACE_S} s more for start-up." if derived else ".")
            + " Submit again to resume."
        )
    if named_iface:
        lines.append(
            f"# NCCL/Gloo interface: {jobs.oneline(named_iface)}, as the phase's env names it, on every node."
        )
    else:
        lines.append(
            "# NCCL/Gloo interface: on each node, the one that reaches the head node, decided at job start."
        )
    if requeue:
        lines.append(
            "# Requeued (preemption, a failed node): the job starts again and resumes from its newest checkpoint."
        )
    lines += jobs.heterogeneity_note(spec, nproc)
    gpus = cluster.gpus_per_node if cluster else None
    if device == "cuda":
        lines += [f"# {n[0].upper()}{n[1:]}" for n in jobs.idle_gpus_note(nproc, gpus)]
    lines += [f"# {note}" for note in jobs.differing_notes(differing)]
    lines += [
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={spec.nnodes}",
        "#SBATCH --ntasks-per-node=1",  # one torchrun per node; it forks the workers itself
    ]
    if device == "cuda":
        lines.append(f"#SBATCH --gres=gpu:{gpus or nproc}")
    # One task per node: its CPUs are the node's share of the job.
    cpus = cluster.cpus_per_node if cluster and cluster.cpus_per_node else nproc * _cpus_per_worker(env)
    lines.append(f"#SBATCH --cpus-per-task={cpus}")
    memory = cluster.slurm_memory() if cluster else None
    if memory:
        lines.append(f"#SBATCH --mem={memory}")  # per node
    lines.append(f"#SBATCH --output={name}-%j.out")
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if time_limit:
        lines.append(f"#SBATCH --time={time_limit}")
    # A requeued job writes the same output file again: append, so the first attempt's lines stay.
    lines += ["#SBATCH --requeue", "#SBATCH --open-mode=append"] if requeue else ["#SBATCH --no-requeue"]
    lines += [
        "set -euo pipefail",
        ': "${SLURM_JOB_ID:?submit this script with sbatch}"',
        'PYTHON="${PYTHON:-python3}"  # the interpreter with torch on the nodes; override from the environment',
        "",
    ]
    lines += export_lines(dict(sorted(env.items())), f"phase {spec.phase}'s environment")
    if agent_name:
        lines += [
            f'agent="$SLURM_SUBMIT_DIR"/{quote(agent_name)}',
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
    ]
    lines += [
        # The head node as Slurm itself reaches it (NodeAddr), else its name: the rendezvous and
        # the interface choice both go by it, and each node resolves a name itself.
        'LABCTL_HEAD_ADDR=$(scontrol show node "$head_node" 2>/dev/null'
        " | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p') || true",
        'export LABCTL_HEAD_ADDR="${LABCTL_HEAD_ADDR:-$head_node}"',
        "",
    ]
    command = [
        # --kill-on-bad-exit: once one node's torchrun gives up, the others would otherwise sit
        # in rendezvous until join_timeout.
        "srun --kill-on-bad-exit=1"
        + ("" if named_iface else f" bash -c {quote(_IFACE_AT_START)} labctl-node")
        + f' "$PYTHON" -m {jobs.TORCHRUN}',
        '--nnodes="$SLURM_NNODES"',
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f'--rdzv-endpoint="$LABCTL_HEAD_ADDR":{spec.port}',
        # The job id and its restart count, not the run id: neither a resubmitted nor a requeued
        # job may join the last one's rendezvous.
        '--rdzv-id="$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}"',
        f"--rdzv-conf=join_timeout={spec.rdzv_timeout}",
        f"--max-restarts={spec.max_restarts}",
        "--tee=3",  # the rank prefix (LOG_PREFIX_ENV) is applied to tee'd output only
        command_line(spec.entry_argv()),
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
    return int(threads) if threads.isascii() and threads.isdigit() and int(threads) > 0 else _CPUS_PER_WORKER
