"""The sbatch script's cluster rules (train/backends/slurm.py): the NCCL/Gloo interface is decided on
each node at job start unless the phase names one, GPUs as `--gres`, requeue with resume.

The script runs under bash with stand-ins for srun and scontrol (tests/unit/test_train_backends.py);
the real Slurm runs it in tests/integration/test_slurm_cluster.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from labctl.output.errors import InputError
from labctl.train import backends
from labctl.train.backends.k8s import K8sBackend
from labctl.train.backends.slurm import SlurmBackend, render_sbatch
from labctl.train.phases import Settings
from labctl.train.request import JobOptions
from tests.unit.test_train_backends import (
    make_spec,
    node,
    options,
    recorded,
    run_sbatch,
    sbatch_options,
    slurm,  # noqa: F401 (a fixture)
)


def interfaces() -> dict[str, str]:
    """IPv4 address -> the interface that holds it, on this machine."""
    out = json.loads(subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True).stdout)
    return {a["local"]: link["ifname"] for link in out for a in link.get("addr_info", [])}


def script_for(tmp_path: Path, **kw: Any) -> Path:
    script = tmp_path / "train.sbatch"
    script.write_text(render_sbatch(make_spec(script="train.py"), None, **kw))
    return script


def with_head(slurm: dict[str, Any], head: str, node_addr: str | None = None) -> None:  # noqa: F811
    """scontrol names `head` as the job's first node; `show node` gives `node_addr` as its NodeAddr,
    as a real one does (without it, no NodeAddr line: the script falls back to the name)."""
    node = (
        f'echo "NodeName=$3 Arch=x86_64"; echo "   NodeAddr={node_addr} NodeHostName=$3"'
        if node_addr
        else "echo"
    )
    (slurm["bin"] / "scontrol").write_text(
        f'#!/bin/sh\ncase "$1 $2" in\n  "show hostnames") echo {head} ;;\n  "show node") {node} ;;\nesac\n'
    )


def test_the_interface_is_the_one_holding_the_head_nodes_address_not_the_lab_hosts(
    tmp_path: Path,
    slurm: dict[str, Any],  # noqa: F811
) -> None:
    held = {addr: dev for addr, dev in interfaces().items() if dev != "lo"}
    if not held:
        pytest.skip("this machine has no IPv4 address off loopback")
    addr, dev = next(iter(held.items()))
    with_head(slurm, addr)  # the head node is this machine, by its address
    script = script_for(tmp_path)
    assert "bond0" not in script.read_text()  # the lab host's probed interface stays behind
    done = run_sbatch(script, slurm)
    assert done.returncode == 0, done.stderr
    env = recorded(slurm)["env"]
    # A route to one's own address says `lo`, which the other nodes could not reach.
    assert env["NCCL_SOCKET_IFNAME"] == dev != "lo"


def test_a_one_node_job_on_loopback_takes_lo(tmp_path: Path, slurm: dict[str, Any]) -> None:  # noqa: F811
    with_head(slurm, "localhost")
    done = run_sbatch(script_for(tmp_path), slurm, SLURM_NNODES="1")
    assert done.returncode == 0, done.stderr
    assert recorded(slurm)["env"]["NCCL_SOCKET_IFNAME"] == "lo"


def test_a_head_whose_node_addr_is_a_name_is_resolved_on_the_node(
    tmp_path: Path,
    slurm: dict[str, Any],  # noqa: F811
) -> None:
    # What a real slurm.conf without NodeAddr reports: the node's own name, which `ip` refuses.
    # CI's one-node Slurm said "no interface found towards <hostname>" before the name was resolved.
    with_head(slurm, "head-1", node_addr="localhost")
    done = run_sbatch(script_for(tmp_path), slurm, SLURM_NNODES="1")
    assert done.returncode == 0, done.stderr
    assert "no interface found" not in done.stderr
    got = recorded(slurm)
    assert got["env"]["NCCL_SOCKET_IFNAME"] == "lo"
    # The rendezvous keeps the name: every node resolves it with its own resolver.
    assert options(got["argv"][2:])["rdzv-endpoint"].startswith("localhost:")


def test_an_interface_the_phase_names_is_used_on_every_node(tmp_path: Path, slurm: dict[str, Any]) -> None:  # noqa: F811
    settings = Settings.model_validate({"env": {"NCCL_SOCKET_IFNAME": "ib0"}})
    job = SlurmBackend().with_phase(JobOptions(), settings)
    assert job.named_iface == "ib0"
    assert SlurmBackend().with_phase(JobOptions(), Settings()).named_iface is None
    script = script_for(tmp_path, named_iface=job.named_iface)
    text = script.read_text()
    assert "bash -c" not in text and "as the phase's env names it" in text
    done = run_sbatch(script, slurm)
    assert done.returncode == 0, done.stderr
    assert recorded(slurm)["env"]["NCCL_SOCKET_IFNAME"] == "ib0"


def test_requeue_by_default_and_a_requeued_job_meets_in_a_new_rendezvous(
    tmp_path: Path,
    slurm: dict[str, Any],  # noqa: F811
) -> None:
    script = script_for(tmp_path)
    opts = sbatch_options(script.read_text())
    assert "requeue" not in opts  # a bare flag, not key=value
    assert "#SBATCH --requeue\n" in script.read_text()
    assert opts["open-mode"] == "append"  # the second attempt's lines follow the first's
    done = run_sbatch(script, slurm, SLURM_RESTART_COUNT="2")
    assert done.returncode == 0, done.stderr
    assert options(recorded(slurm)["argv"])["rdzv-id"] == "4242-2"
    no = render_sbatch(make_spec(script="train.py"), None, requeue=False)
    assert "#SBATCH --no-requeue\n" in no and "--requeue\n" not in no.replace("--no-requeue", "")


def test_gpus_are_asked_for_as_gres() -> None:
    gpu = sbatch_options(render_sbatch(make_spec(nodes=(node("a", 4), node("b", 4))), None))
    assert gpu["gres"] == "gpu:4" and "gpus-per-node" not in gpu
    cpu = make_spec(nodes=(node("a", 2, "cpu"),), dist_backend="gloo")
    assert "gres" not in sbatch_options(render_sbatch(cpu, None))


def test_requeue_is_a_slurm_option_only(tmp_path: Path) -> None:
    with pytest.raises(InputError) as e:
        backends.check_options(K8sBackend(), JobOptions(requeue=True))
    assert "--requeue" in e.value.message and "--backend slurm" in e.value.hint


def test_cluster_jobs_share_one_checkpoint_folder_with_one_writer() -> None:
    from labctl.agent.train.settings import TrainerError, resolve_settings
    from labctl.train.backends.jobs import for_cluster

    # On the lab's hosts each host keeps its own copy; on a cluster's shared folder rank 0 alone writes.
    assert resolve_settings({})["shared_checkpoints"] is False
    assert for_cluster(make_spec(), True).settings["shared_checkpoints"] is True
    with pytest.raises(TrainerError, match="shared_checkpoints"):
        resolve_settings({"shared_checkpoints": "yes"})
