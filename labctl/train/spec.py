"""A training run as data: what runs where, computed before anything is launched.

`LaunchSpec` is the one description every backend renders: the SSH launcher turns each
node into a `torch.distributed.run` command line, `--check` prints those, and the Slurm
and Kubeflow backends write the same run as a job file.

`time_limit_s` (--time-limit) is the one place the run's time limit lives for the backends:
the planner gives the trainer its `time_limit` setting and a --script the TIME_LIMIT_ENV
variable from the same value, and each backend renders it into its own form (sbatch --time,
activeDeadlineSeconds, a cloud session's length).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The reference trainer ships inside the agent zipapp (labctl/agent/train/trainer.py); torchrun
# runs it as a module with the zipapp on PYTHONPATH.
TRAINER_MODULE = "labctl.agent.train.trainer"
# torchrun prefixes every worker line with this (TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE), so
# the controller can tell ranks apart: "[rank3]:text".
LOG_PREFIX_TEMPLATE = "[rank${rank}]:"
RUN_ENV = "LABCTL_RUN_ID"
# --time-limit in seconds, for a user's --script (the reference trainer reads its `time_limit` setting).
TIME_LIMIT_ENV = "LABCTL_TIME_LIMIT_S"
# torchrun shares its rendezvous store with the workers by default, across restarts: a
# restarted worker can then read a dead peer's gloo/NCCL address left by the previous round
# and fail with "connection refused", spending a restart each time. Unshared, rank 0 hosts a
# fresh store on a fresh port every round.
FRESH_STORE_ENV = {
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"
}  # set on every process of a run; `stop` and the cleanup check find them by it


@dataclass(frozen=True)
class NodeSpec:
    """One host's part of a run."""

    host: str
    address: str  # how the other nodes reach this one (the inventory address)
    nproc: int  # worker processes on this host (GPUs, or CPU processes)
    device: str  # "cuda" or "cpu"
    python: str  # interpreter with torch on this host
    gpu_indices: tuple[int, ...] = ()  # nvidia-smi / PCI bus order; becomes CUDA_VISIBLE_DEVICES
    gpu_names: tuple[str, ...] = ()
    iface: str | None = None  # NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME (the bond where there is one)
    env: dict[str, str] = field(default_factory=dict)  # the full per-host environment for torchrun


@dataclass(frozen=True)
class LaunchSpec:
    run_id: str
    phase: int
    dist_backend: str  # "nccl" or "gloo"
    nodes: tuple[NodeSpec, ...]
    head_address: str  # c10d rendezvous endpoint host (the first node)
    port: int
    max_restarts: int
    settings: dict[str, Any]  # the phase's resolved settings, handed to the trainer as JSON
    script: str | None = None  # a user's script instead of the reference trainer
    script_args: tuple[str, ...] = ()
    rdzv_timeout: int = 900  # seconds nodes wait for each other at (re-)rendezvous
    log_dir: str = ""  # per-run folder on each host (torchrun's --log-dir lives under it)
    time_limit_s: int | None = None  # --time-limit: the trainer pauses before it; None: no limit

    @property
    def nnodes(self) -> int:
        return len(self.nodes)

    @property
    def world_size(self) -> int:
        return sum(n.nproc for n in self.nodes)

    def entry_argv(self) -> list[str]:
        """What torchrun runs: the reference trainer as a module, or the user's script."""
        if self.script:
            return [self.script, *self.script_args]
        import json

        return ["-m", TRAINER_MODULE, "--settings", json.dumps(self.settings, sort_keys=True)]

    def torchrun_argv(self, node: NodeSpec) -> list[str]:
        argv = [
            node.python,
            "-m",
            "torch.distributed.run",
            f"--nnodes={self.nnodes}",
            f"--nproc-per-node={node.nproc}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.head_address}:{self.port}",
            f"--rdzv-id={self.run_id}",
            # join_timeout is the c10d key that bounds the wait (plain `timeout` is ignored). The head
            # hosts the store; saying so beats torchrun's hostname guess.
            f"--rdzv-conf=join_timeout={self.rdzv_timeout},is_host={'1' if node.address == self.head_address else '0'}",
            f"--max-restarts={self.max_restarts}",
            "--tee=3",
        ]
        if self.log_dir:
            argv.append(f"--log-dir={self.log_dir}/torchrun")
        # Rank 0's node becomes MASTER_ADDR for the workers; by default that is its hostname,
        # which other hosts may not resolve. Its inventory address always works.
        argv.append(f"--local-addr={node.address}")
        return argv + self.entry_argv()

    def shell_line(self, node: NodeSpec) -> str:
        """The exact command line for one host, environment included (what --check prints)."""
        from labctl.transport.shell import command_line, env_assignments

        env = env_assignments(dict(sorted(node.env.items())), f"{node.host}'s environment")
        return f"env {env} {command_line(self.torchrun_argv(node))}"
