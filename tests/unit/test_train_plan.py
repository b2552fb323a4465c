"""Phases file validation and the pure preflight/placement planning of `labctl train`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from labctl.inventory.model import Host
from labctl.output.errors import InputError
from labctl.train.phases import load_phases, parse_override
from labctl.train.plan import orchestra_problems, plan_run

REPO = Path(__file__).resolve().parents[2]
CU126_ARCHS = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
CU128_ARCHS = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


def torch_probe(
    version: str = "2.13.0+cu126", arch: list[str] | None = None, nccl: str | None = "2.21.5"
) -> dict[str, Any]:
    cuda = None if version.endswith("+cpu") else "12.6"
    return {
        "installed": True,
        "version": version,
        "cuda": cuda,
        "cuda_available": cuda is not None,
        "arch_list": arch if arch is not None else (CU126_ARCHS if cuda else []),
        "nccl": nccl if cuda else None,
    }


def probe(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "python": "/opt/venv/bin/python",
        "torch": torch_probe(),
        "cpu_count": 8,
        "iface": {"name": "bond0", "is_bond": True},
        "disk": {"path": "/ckpt", "checked": "/", "free_bytes": 10**12, "writable": True},
        "gpu_source": "nvidia-smi",
        "gpus": [],
        "rendezvous": {"port": 29500, "free": True},
    }
    base.update(kw)
    return base


def m5() -> Host:
    return Host.model_validate(
        {
            "name": "m5",
            "address": "10.0.0.10",
            "roles": ["train", "inference"],
            "gpus": [
                {"model": "Tesla V100", "memory_gb": 32, "count": 1, "compute_capability": "7.0"},
                {"model": "Tesla P40", "memory_gb": 24, "count": 4, "compute_capability": "6.1"},
            ],
        }
    )


def m5_smi() -> list[dict[str, Any]]:
    # nvidia-smi order (PCI bus): the V100 is not first on purpose.
    return [
        {"index": 0, "name": "Tesla P40", "compute_cap": "6.1"},
        {"index": 1, "name": "Tesla V100-SXM2-32GB", "compute_cap": "7.0"},
        {"index": 2, "name": "Tesla P40", "compute_cap": "6.1"},
    ]


def settings(phase: int = 1, *sets: str) -> Any:
    return load_phases(REPO / "playbooks/train.yaml").settings(phase, list(sets))


def plan(
    hosts: list[Host],
    probes: dict[str, Any],
    phase: int = 1,
    *sets: str,
    device: str | None = None,
    **kw: Any,
) -> Any:
    return plan_run(
        settings=settings(phase, *sets),
        phase=phase,
        run_id="p1-test",
        hosts=hosts,
        probes=probes,
        device_override=device,
        log_dir="/var/lib/labctl/runs/p1-test",
        pythonpath={h.name: "/var/lib/labctl/agent/agent-x.pyz" for h in hosts},
        **kw,
    )


def test_seed_phases_follow_seed_004() -> None:
    f = load_phases(REPO / "playbooks/train.yaml")
    assert sorted(f.phases) == [1, 2, 3, 4]
    p1, p2, p3, p4 = (f.settings(p) for p in (1, 2, 3, 4))
    assert (p1.strategy, p1.batch_size_per_gpu, p1.accumulation_steps, p1.mixed_precision) == (
        "single_gpu_debug",
        2048,
        1,
        False,
    )
    assert (p2.strategy, p2.batch_size_per_gpu, p2.accumulation_steps, p2.mixed_precision) == (
        "multi_gpu_full",
        2048,
        4,
        True,
    )
    assert p2.gradient_scaling.initial_scale == 65536.0 and p2.gradient_scaling.growth_interval == 2000
    assert (
        p3.dynamic_batch_sizing
        and p3.requires_orchestra
        and p3.batch_size_per_gpu * p3.accumulation_steps == 4096
    )
    assert p4.strategy == "multi_gpu_conservative" and p4.ema and p4.accumulation_steps == 2
    assert p1.gpus == ["Tesla V100"] and p1.hosts == "role:train"


def test_overrides_reach_nested_settings_and_typos_are_named() -> None:
    s = settings(2, "steps=40", "model.d_model=64", "gradient_scaling.enabled=false", "env.NCCL_IB_DISABLE=1")
    assert s.steps == 40 and s.model.d_model == 64 and s.gradient_scaling.enabled is False
    assert s.model.n_layers == 8  # the rest of the nested mapping is kept
    assert s.env == {"NCCL_IB_DISABLE": "1"}
    with pytest.raises(InputError, match="Did you mean 'steps'"):
        parse_override("stpes=3")
    with pytest.raises(InputError, match=r"Did you mean 'model\.d_model'"):
        parse_override("model.dmodel=3")
    with pytest.raises(InputError, match="n_heads"):
        settings(1, "model.d_model=65")
    with pytest.raises(InputError, match="No phase 7"):
        load_phases(REPO / "playbooks/train.yaml").settings(7)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("phases:\n  1: {stpes: 3}\n", ":2: phases[1].stpes: unknown key 'stpes'. Did you mean 'steps'?"),
        ("phases:\n  1: {strategy: multi_gpu_half}\n", ":2: phases[1].strategy:"),
        ("defaults: {port: 70000}\nphases: {1: {}}\n", ":1: defaults.port:"),
        ("phases:\n  zero: {}\n", ":2: phases.zero: phases are numbered"),
        ("name: x\nphase: {1: {}}\n", "unknown key 'phase'. Did you mean 'phases'?"),
        ("phases:\n  1: {steps: 1}\n  1: {steps: 2}\n", "keep one"),
    ],
)
def test_bad_phases_files_name_file_line_field(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as e:
        load_phases(path)
    assert e.value.exit_code == 2
    assert f"{path}{where}" in e.value.message or where in e.value.message


def test_phase1_on_m5_picks_the_v100_by_pci_order_and_leaves_the_p40s() -> None:
    spec, problems = plan([m5()], {"m5": probe(gpus=m5_smi())})
    assert problems == []
    (node,) = spec.nodes
    assert node.device == "cuda" and node.nproc == 1 and spec.dist_backend == "nccl"
    assert node.env["CUDA_VISIBLE_DEVICES"] == "1" and node.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert node.env["NCCL_SOCKET_IFNAME"] == "bond0" == node.env["GLOO_SOCKET_IFNAME"]
    argv = spec.torchrun_argv(node)
    assert "--nnodes=1" in argv and "--nproc-per-node=1" in argv and "--rdzv-backend=c10d" in argv
    assert "--rdzv-endpoint=10.0.0.10:29500" in argv and f"--rdzv-id={spec.run_id}" in argv
    assert argv[argv.index("-m", 3) + 1] == "labctl.agent.train.trainer"


def test_full_strategy_uses_every_chosen_gpu() -> None:
    spec, problems = plan([m5()], {"m5": probe(gpus=m5_smi())}, 2, "gpus=[]")
    assert problems == []
    assert spec.nodes[0].nproc == 3 and spec.nodes[0].env["CUDA_VISIBLE_DEVICES"] == "0,1,2"


def test_torch_build_without_the_gpus_arch_is_refused_with_the_build_to_use() -> None:
    bad = probe(gpus=m5_smi(), torch=torch_probe("2.13.0+cu128", CU128_ARCHS))
    spec, problems = plan([m5()], {"m5": bad}, 2, "gpus=[]")
    assert spec is None
    (p,) = problems
    assert p.host == "m5" and "Tesla P40 (sm_61)" in p.message and "V100" in p.message
    assert "cuda: cu126" in p.fix


def test_declared_gpu_with_cpu_torch_is_refused_and_cpu_device_is_offered() -> None:
    # The simulated lab: m5 declares its GPUs, none answers, torch is a CPU build.
    spec, problems = plan([m5()], {"m5": probe(gpus=[], gpu_source="none", torch=torch_probe("2.13.0+cpu"))})
    assert spec is None
    text = " ".join(p.line() for p in problems)
    assert "CPU build" in text and "Tesla V100 (sm_70)" in text and "--device cpu" in text
    assert "no GPU answers" in text


def test_cpu_device_runs_gloo_on_hosts_without_gpus() -> None:
    irina = Host(name="irina", address="10.0.0.20")
    probes = {
        "m5": probe(torch=torch_probe("2.13.0+cpu")),
        "irina": probe(torch=torch_probe("2.13.0+cpu"), cpu_count=4),
    }
    spec, problems = plan([m5(), irina], probes, 1, "cpu_procs=2", device="cpu")
    assert problems == []
    assert spec.dist_backend == "gloo" and [n.nproc for n in spec.nodes] == [
        1,
        1,
    ]  # single_gpu_debug: one each
    spec2, _ = plan([m5(), irina], probes, 2, "cpu_procs=2", device="cpu")
    assert [n.nproc for n in spec2.nodes] == [2, 2] and spec2.world_size == 4
    assert spec2.nodes[1].env["OMP_NUM_THREADS"] == "2"  # 4 cores / 2 processes
    assert "CUDA_VISIBLE_DEVICES" not in spec2.nodes[0].env
    assert "is_host=1" in " ".join(spec2.torchrun_argv(spec2.nodes[0]))
    assert "is_host=0" in " ".join(spec2.torchrun_argv(spec2.nodes[1]))


def test_version_mismatch_port_iface_and_disk_each_name_host_and_fix() -> None:
    irina = Host(name="irina", address="10.0.0.20")
    probes = {
        "m5": probe(
            torch=torch_probe("2.13.0+cpu"),
            rendezvous={"port": 29500, "free": False, "error": "Address in use"},
        ),
        "irina": probe(
            torch=torch_probe("2.12.0+cpu"),
            iface={"name": None},
            disk={"path": "/c", "checked": "/", "free_bytes": 1000, "writable": True},
        ),
    }
    spec, problems = plan([m5(), irina], probes, device="cpu")
    assert spec is None
    by = {
        (p.host, k) for p in problems for k in ("versions", "port", "interface", "GB free") if k in p.message
    }
    assert (
        ("all", "versions") in by
        and ("m5", "port") in by
        and ("irina", "interface") in by
        and ("irina", "GB free") in by
    )
    assert all(p.fix for p in problems)


def test_phase3_needs_the_orchestra_warm_set() -> None:
    missing = {"m5": {"orchestra": {"present": False, "path": "/var/lib/labctl/orchestra/warm.json"}}}
    (p,) = orchestra_problems(missing)
    assert "warm set" in p.message and "requires_orchestra=false" in p.fix
    cold = {
        "m5": {
            "orchestra": {"present": True, "state": {"models": [{"name": "llama-8b", "state": "loading"}]}}
        }
    }
    assert "llama-8b" in orchestra_problems(cold)[0].message
    warm = {
        "m5": {"orchestra": {"present": True, "state": {"models": [{"name": "llama-8b", "state": "loaded"}]}}}
    }
    assert orchestra_problems(warm) == []
    spec, problems = plan([m5()], {"m5": probe(gpus=m5_smi())}, 3, orchestra_probes=missing)
    assert spec is None and "warm set" in problems[0].message
    spec, problems = plan([m5()], {"m5": probe(gpus=m5_smi())}, 3, orchestra_probes=warm)
    assert problems == [] and spec is not None


def test_phase3_needs_the_endpoints_file_on_each_training_host() -> None:
    warm = {
        "m5": {"orchestra": {"present": True, "state": {"models": [{"name": "llama-8b", "state": "loaded"}]}}}
    }
    path = "/var/lib/labctl/orchestra/endpoints.json"
    for endpoints, says in (
        ({"present": False, "path": path}, "and there is none"),
        ({"present": True, "path": path, "models": 0}, "it lists no model"),
        ({"present": False, "path": path, "error": "Permission denied"}, "unreadable (Permission denied)"),
    ):
        spec, problems = plan(
            [m5()], {"m5": probe(gpus=m5_smi(), endpoints=endpoints)}, 3, orchestra_probes=warm
        )
        assert spec is None and len(problems) == 1, problems
        assert path in problems[0].message and says in problems[0].message
        assert "labctl orchestra start" in problems[0].fix and "`train` role" in problems[0].fix
    ready = {"present": True, "path": path, "models": 3}
    spec, problems = plan([m5()], {"m5": probe(gpus=m5_smi(), endpoints=ready)}, 3, orchestra_probes=warm)
    assert problems == [] and spec is not None
    # A --script finds the file as the reference trainer does.
    assert all(n.env["LABCTL_ORCHESTRA_ENDPOINTS"] == path for n in spec.nodes)
    # ...and the sandbox service as its client does (client.json, which `sandbox serve` writes).
    service = "/var/lib/labctl/sandbox/client.json"
    assert all(n.env["LABCTL_SANDBOX_SERVICE"] == service for n in spec.nodes)
    spec, _ = plan([m5()], {"m5": probe(gpus=m5_smi())}, 1)
    assert spec is not None
    assert all(
        "LABCTL_ORCHESTRA_ENDPOINTS" not in n.env and "LABCTL_SANDBOX_SERVICE" not in n.env
        for n in spec.nodes
    )


def test_phase3_needs_the_sandbox_service_and_its_private_token_on_each_training_host() -> None:
    warm = {
        "m5": {"orchestra": {"present": True, "state": {"models": [{"name": "llama-8b", "state": "loaded"}]}}}
    }
    endpoints = {"present": True, "path": "/var/lib/labctl/orchestra/endpoints.json", "models": 3}
    path = "/var/lib/labctl/sandbox/client.json"
    for sandbox, says in (
        ({"present": False, "path": path}, f"named in {path}, and there is none"),
        ({"present": False, "path": path, "error": "Permission denied"}, "unreadable (Permission denied)"),
        (
            {"present": True, "path": path, "url": "http://irina:8790", "token": "missing (No such file)"},
            "token",
        ),
        (
            {
                "present": True,
                "path": path,
                "url": "http://irina:8790",
                "token": "readable by others (mode 644)",
            },
            "mode 644",
        ),
    ):
        spec, problems = plan(
            [m5()],
            {"m5": probe(gpus=m5_smi(), endpoints=endpoints, sandbox=sandbox)},
            3,
            orchestra_probes=warm,
        )
        assert spec is None and len(problems) == 1, problems
        assert says in problems[0].message and "labctl sandbox serve" in problems[0].fix
    ok = {"present": True, "path": path, "url": "http://irina:8790", "token": "ok"}
    spec, problems = plan(
        [m5()], {"m5": probe(gpus=m5_smi(), endpoints=endpoints, sandbox=ok)}, 3, orchestra_probes=warm
    )
    assert problems == [] and spec is not None
    # The shipped phase 3 runs the loop: the trainer's settings carry rl; phase 1's do not.
    assert settings(3).trainer_settings(3, "r", "m.jsonl")["rl"]["tasks_per_step"] == 2
    assert "rl" not in settings(1).trainer_settings(1, "r", "m.jsonl")


def test_run_records_live_beside_the_inventory_link_and_list_newest_first(tmp_path: Path) -> None:
    from labctl.train import runs

    real = tmp_path / "pkg" / "lab.yaml"
    real.parent.mkdir()
    real.write_text("lab: x\n")
    link = tmp_path / "inventory" / "lab.yaml"
    link.parent.mkdir()
    link.symlink_to(real)
    root = runs.runs_dir(link)
    assert root == tmp_path / "inventory" / ".labctl" / "runs"
    a, b = runs.new_run_id(1), runs.new_run_id(2)
    assert a != b and a.startswith("p1-") and a == a.lower()
    runs.save(root, {"run_id": a, "started": 1.0, "state": "running"})
    runs.save(root, {"run_id": b, "started": 2.0, "state": "running"})
    assert [r["run_id"] for r in runs.list_runs(root)] == [b, a]
    assert runs.update(root, a, state="stopped")["state"] == "stopped" == runs.load(root, a)["state"]
    with pytest.raises(InputError) as e:
        runs.load(root, "p9-nope")
    assert a in e.value.hint and b in e.value.hint


def test_phase3_counts_the_warm_set_over_every_inference_host() -> None:
    def warm(names: list[str], size: int = 2) -> dict[str, Any]:
        models = [{"name": n, "state": "loaded"} for n in names]
        return {"orchestra": {"present": True, "state": {"models": models, "warm_size": size}}}

    # The placement put the whole set on one host: the other's empty file is no problem.
    assert orchestra_problems({"m5": warm(["a", "b"]), "irina": warm([])}) == []
    (short,) = orchestra_problems({"m5": warm(["a"]), "irina": warm([])})
    assert short.host == "all" and "1 of 2" in short.message
    (empty,) = orchestra_problems({"m5": warm([]), "irina": warm([])})
    assert "empty" in empty.message and "orchestra start" in empty.fix
