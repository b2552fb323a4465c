"""Preflight and placement as pure functions: host probes + settings → a LaunchSpec or problems.

Nothing here touches a host; `labctl/agent/train/host.py:preflight_command` gathers what is
read here, one round trip per host. Every problem names the host and the fix, and any
problem means nothing is launched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from labctl.agent.core import paths
from labctl.agent.core.gpus import runs_on
from labctl.facts.compare import GIB, model_matches
from labctl.facts.gpus import Cap, builds_for, declared_gpus, fmt_cap, known_cap, parse_cap
from labctl.inventory.model import Host
from labctl.output.errors import InputError
from labctl.train.phases import Settings
from labctl.train.request import ClusterShape
from labctl.train.spec import (
    FRESH_STORE_ENV,
    LOG_PREFIX_TEMPLATE,
    RUN_ENV,
    TIME_LIMIT_ENV,
    LaunchSpec,
    NodeSpec,
)

ORCHESTRA_HINT = (
    f"Load the warm set first with `labctl orchestra start` (its state lives in {paths.WARM_STATE}), "
    "or train without it: --set requires_orchestra=false."
)


@dataclass
class Problem:
    host: str
    message: str
    fix: str

    def line(self) -> str:
        return f"{self.host}: {self.message} Fix: {self.fix}"


@dataclass
class TrainGpu:
    name: str
    cap: Cap | None
    index: int | None  # None: declared in the inventory, not seen on the host
    memory_gb: float | None = None  # None: the host did not say


@dataclass
class Placement:
    host: Host
    device: str
    gpus: list[TrainGpu] = field(default_factory=list)
    nproc: int = 1


def gpu_wanted(name: str, wanted: list[str]) -> bool:
    """Whether a GPU called `name` is one of `wanted` (empty: every GPU). Whole words, so that
    "Tesla P4" does not take the P40s (both are in the seed lab)."""
    return not wanted or any(model_matches(w, name) for w in wanted)


def train_gpus(host: Host, probe: dict[str, Any], wanted: list[str]) -> list[TrainGpu]:
    """The GPUs that train on `host`: found on the host (which wins), else declared in the inventory."""
    real = probe.get("gpus") or []
    if real:
        out: list[TrainGpu] = []
        for g in real:
            name = str(g.get("name") or "GPU")
            if not gpu_wanted(name, wanted):
                continue
            cap_text = g.get("compute_capability") or g.get("compute_cap")
            cap = parse_cap(str(cap_text)) if cap_text else known_cap(name)
            total = g.get("memory_total_bytes")
            memory = total / GIB if isinstance(total, (int, float)) and total > 0 else None
            out.append(TrainGpu(name, cap, int(g.get("index", len(out))), memory))
        return out
    return [TrainGpu(n, c, None, m) for n, c, m in declared_gpus(host) if gpu_wanted(n, wanted)]


def check_host(
    host: Host, probe: dict[str, Any], settings: Settings, device: str
) -> tuple[Placement | None, list[Problem]]:
    """One host's placement and what is wrong with it."""
    problems: list[Problem] = []
    torch = probe.get("torch") or {}
    py = probe.get("python", host.python)
    if not torch.get("installed"):
        why = f" ({torch['error']})" if torch.get("error") else ""
        problems.append(
            Problem(
                host.name,
                f"no torch importable by {py}{why}.",
                f"provision it (labctl provision --tags torch_env --limit {host.name}) or pass --python PATH_WITH_TORCH.",
            )
        )
    gpus = train_gpus(host, probe, settings.gpus)
    strategy_one = settings.strategy == "single_gpu_debug"
    if device == "cpu":
        nproc = 1 if strategy_one else settings.cpu_procs
        return (Placement(host, "cpu", [], nproc) if not problems else None), problems
    if not gpus:
        which = f" matching {settings.gpus}" if settings.gpus else ""
        problems.append(
            Problem(
                host.name,
                f"no GPU{which} to train on.",
                "choose hosts with such GPUs (--limit), change `gpus:` in the phases file, or train on CPUs with --device cpu.",
            )
        )
        return None, problems
    if gpus[0].index is None:
        source = probe.get("gpu_error") or "neither NVML nor nvidia-smi found one"
        problems.append(
            Problem(
                host.name,
                f"the inventory declares {', '.join(sorted({g.name for g in gpus}))} but no GPU answers on the host ({source}).",
                "install or repair the NVIDIA driver (labctl facts shows what the host sees), or train on CPUs with --device cpu.",
            )
        )
    if torch.get("installed"):
        version = torch.get("version", "?")
        if not torch.get("cuda"):
            names = ", ".join(f"{g.name} ({fmt_cap(g.cap)})" for g in _unique(gpus))
            problems.append(
                Problem(
                    host.name,
                    f"torch {version} at {py} is a CPU build: it has no kernels for {names}.",
                    f"install a CUDA build that supports them (labctl provision --tags torch_env --limit {host.name}, "
                    "cuda: auto picks one), or train on CPUs with --device cpu.",
                )
            )
        else:
            arch_list = list(torch.get("arch_list") or [])
            bad = [
                g for g in _unique(gpus) if g.cap is not None and arch_list and not runs_on(arch_list, g.cap)
            ]
            if bad:
                base = str(version).split("+")[0]
                fits = builds_for(base, [g.cap for g in gpus if g.cap])
                problems.append(
                    Problem(
                        host.name,
                        f"torch {version} has no kernels for "
                        + ", ".join(f"{g.name} ({fmt_cap(g.cap)})" for g in bad)
                        + f" (its architectures: {' '.join(arch_list)}).",
                        (f"use torch_env with cuda: {fits[0]}" if fits else "use an older torch build")
                        + f" (labctl provision --tags torch_env --limit {host.name}), or leave those GPUs out with `gpus:`.",
                    )
                )
            if gpus[0].index is not None and not torch.get("cuda_available"):
                problems.append(
                    Problem(
                        host.name,
                        f"torch {version} cannot use the GPUs: {torch.get('cuda_error') or 'torch.cuda.is_available() is False'}.",
                        "check the driver against the torch CUDA build (labctl facts).",
                    )
                )
    nproc = 1 if strategy_one else len(gpus)
    chosen = gpus[:nproc]
    return (Placement(host, "cuda", chosen, nproc) if not problems else None), problems


def _unique(gpus: list[TrainGpu]) -> list[TrainGpu]:
    seen: dict[tuple[str, Cap | None], TrainGpu] = {}
    for g in gpus:
        seen.setdefault((g.name, g.cap), g)
    return list(seen.values())


def choose_device(settings: Settings, override: str | None, hosts: list[Host], probes: dict[str, Any]) -> str:
    wanted = override or settings.device
    if wanted != "auto":
        return wanted
    with_gpus = [h.name for h in hosts if train_gpus(h, probes.get(h.name, {}), settings.gpus)]
    return "cuda" if with_gpus else "cpu"


def checkpoint_bytes(settings: Settings) -> int:
    """A checkpoint's size: fp32 weights + AdamW's two moments (+ EMA), with 10% to spare."""
    from labctl.agent.models.tinylm import make_config, param_count

    m = settings.model
    cfg = make_config(
        vocab=m.vocab,
        d_model=m.d_model,
        n_layers=m.n_layers,
        n_heads=m.n_heads,
        d_ff=m.d_ff,
        max_seq=settings.seq_len,
    )
    per_param = 4 * (3 + (1 if settings.ema else 0))
    return int(param_count(cfg) * per_param * 1.1)


def plan_run(
    *,
    settings: Settings,
    phase: int,
    run_id: str,
    hosts: list[Host],
    probes: dict[str, dict[str, Any]],
    device_override: str | None,
    log_dir: str,
    pythonpath: dict[str, str],
    script: str | None = None,
    script_args: tuple[str, ...] = (),
    orchestra_probes: dict[str, dict[str, Any]] | None = None,
    time_limit_s: int | None = None,
) -> tuple[LaunchSpec | None, list[Problem]]:
    problems: list[Problem] = []
    device = choose_device(settings, device_override, hosts, probes)
    placements: list[Placement] = []
    for h in hosts:
        placement, found = check_host(h, probes[h.name], settings, device)
        problems += found
        if placement:
            placements.append(placement)
    problems += _cross_host_checks(hosts, probes, device)
    head = hosts[0]
    rdzv = probes[head.name].get("rendezvous") or {}
    port = int(rdzv.get("port") or settings.port)
    if rdzv and not rdzv.get("free"):
        problems.append(
            Problem(
                head.name,
                f"the rendezvous port {settings.port} is taken ({rdzv.get('error', 'in use')}); another run may hold it.",
                "stop that run (labctl train status / stop), or pick another port: --set port=0 takes a free one.",
            )
        )
    need = (settings.keep_checkpoints + 1) * checkpoint_bytes(settings)
    ckpt = settings.checkpoint_path(phase)
    for h in hosts:
        p = probes[h.name]
        iface = (p.get("iface") or {}).get("name")
        if not iface:
            problems.append(
                Problem(
                    h.name,
                    f"no network interface carries its inventory address {h.address}, so NCCL/gloo would guess one.",
                    "set the host's `address:` to its address on the training network (the bond where there is one).",
                )
            )
        disk = p.get("disk") or {}
        if disk.get("error") or not disk.get("writable", True):
            problems.append(
                Problem(
                    h.name,
                    f"cannot write checkpoints under {ckpt} ({disk.get('error') or 'not writable'}).",
                    "set checkpoint_dir to a writable path: --set checkpoint_dir=/data/ckpt/phase{phase}.",
                )
            )
        elif disk.get("free_bytes") is not None and disk["free_bytes"] < need:
            problems.append(
                Problem(
                    h.name,
                    f"{disk['free_bytes'] / 1e9:.1f} GB free at {disk.get('checked', ckpt)}; {settings.keep_checkpoints} checkpoints "
                    f"of this model need {need / 1e9:.1f} GB.",
                    "free space, lower keep_checkpoints, or move checkpoint_dir.",
                )
            )
    if settings.requires_orchestra:
        problems += orchestra_problems(orchestra_probes or {}) or endpoints_problems(
            {h.name: probes[h.name] for h in hosts}
        )
    if settings.requires_sandbox:
        problems += sandbox_problems({h.name: probes[h.name] for h in hosts})
    if problems:
        return None, problems
    nodes = tuple(
        NodeSpec(
            host=pl.host.name,
            address=pl.host.address,
            nproc=pl.nproc,
            device=pl.device,
            python=str(probes[pl.host.name].get("python") or pl.host.python),
            gpu_indices=tuple(g.index for g in pl.gpus if g.index is not None),
            gpu_names=tuple(g.name for g in pl.gpus),
            iface=(probes[pl.host.name].get("iface") or {}).get("name"),
            env=node_env(
                pl, probes[pl.host.name], settings, run_id, pythonpath.get(pl.host.name, ""), time_limit_s
            ),
        )
        for pl in placements
    )
    metrics = f"{log_dir}/metrics.jsonl"
    spec = LaunchSpec(
        run_id=run_id,
        phase=phase,
        dist_backend="nccl" if device == "cuda" else "gloo",
        nodes=nodes,
        head_address=head.address,
        port=port,
        max_restarts=settings.max_restarts,
        settings=settings.trainer_settings(phase, run_id, metrics, time_limit_s),
        script=script,
        script_args=script_args,
        rdzv_timeout=settings.rdzv_timeout,
        log_dir=log_dir,
        time_limit_s=time_limit_s,
    )
    return spec, []


def _cross_host_checks(hosts: list[Host], probes: dict[str, dict[str, Any]], device: str) -> list[Problem]:
    out: list[Problem] = []
    versions = {h.name: (probes[h.name].get("torch") or {}).get("version") for h in hosts}
    distinct = {v for v in versions.values() if v}
    if len(distinct) > 1:
        listing = ", ".join(f"{n} {v}" for n, v in versions.items())
        out.append(
            Problem(
                "all",
                f"torch versions differ across hosts ({listing}); DDP needs the same version everywhere.",
                "pin one version in the torch_env resource and provision every training host.",
            )
        )
    if device == "cuda":
        nccl = {h.name: (probes[h.name].get("torch") or {}).get("nccl") for h in hosts}
        if len({v for v in nccl.values() if v}) > 1:
            listing = ", ".join(f"{n} {v}" for n, v in nccl.items())
            out.append(
                Problem(
                    "all",
                    f"NCCL versions differ across hosts ({listing}); collectives between them can hang or fail.",
                    "install the same torch CUDA build on every training host.",
                )
            )
    return out


def endpoints_problems(probes: dict[str, dict[str, Any]]) -> list[Problem]:
    """Each training host holds the endpoints file its trainers read (a probe that did not look,
    as from an older agent, is not judged)."""
    out = []
    for name, p in probes.items():
        e = p.get("endpoints")
        if e is None or (e.get("present") and e.get("models")):
            continue
        why = (
            f"it is unreadable ({e['error']})"
            if e.get("error")
            else "it lists no model"
            if e.get("present")
            else "there is none"
        )
        out.append(
            Problem(
                name,
                f"this phase's trainers ask the models listed in {e.get('path', 'the endpoints file')}, and {why}.",
                "Run `labctl orchestra start`: it writes the file on every host with the `train` role (give this "
                "host that role if it has not), and every rotation keeps it current.",
            )
        )
    return out


def sandbox_problems(probes: dict[str, dict[str, Any]]) -> list[Problem]:
    """Each training host knows where the sandbox service is and holds its private token."""
    out = []
    for name, p in probes.items():
        sb = p.get("sandbox")
        if sb is None or (sb.get("present") and sb.get("token") == "ok"):
            continue
        if not sb.get("present"):
            why = f"it is unreadable ({sb['error']})" if sb.get("error") else "there is none"
            what = f"this phase's trainers run the models' code in the sandbox service named in {sb.get('path')}, and {why}."
        else:
            what = f"the sandbox service's token on this host is {sb.get('token')}."
        out.append(
            Problem(
                name,
                what,
                "Run `labctl sandbox serve`: it starts the service on the host with the `sandbox` role and writes its "
                "address and token (mode 0600) on every host with the `train` role.",
            )
        )
    return out


def orchestra_problems(probes: dict[str, dict[str, Any]]) -> list[Problem]:
    """The warm set as every inference host's warm.json tells it: each file present, no model on
    any host short of loaded, and together at least the warm set's size (a host may hold none
    when the placement put the whole set elsewhere)."""
    if not probes:
        return [
            Problem(
                "all",
                "this phase needs the LLM orchestra's warm set, but no host has the `inference` role to hold it.",
                "give the orchestra's hosts role inference in the inventory, or --set requires_orchestra=false.",
            )
        ]
    out = []
    loaded, want = 0, 0
    for name, p in probes.items():
        orch = p.get("orchestra") or {}
        if not orch.get("present"):
            why = f" ({orch['error']})" if orch.get("error") else ""
            out.append(
                Problem(
                    name,
                    f"this phase needs the LLM orchestra's warm set loaded, but there is no rotation state at "
                    f"{orch.get('path', 'the orchestra state file')}{why}: the orchestra has not been rotated in here yet.",
                    ORCHESTRA_HINT,
                )
            )
            continue
        state = orch.get("state") or {}
        models = state.get("models") or []
        cold = [str(m.get("name", "?")) for m in models if m.get("state") != "loaded"]
        loaded += len(models) - len(cold)
        want = max(want, int(state.get("warm_size") or 0))
        if cold:
            out.append(
                Problem(
                    name,
                    f"the orchestra's warm set is not ready (not loaded: {', '.join(cold)}).",
                    ORCHESTRA_HINT,
                )
            )
    if not out and loaded == 0:
        out.append(Problem("all", "the orchestra's warm set is empty: no model is loaded.", ORCHESTRA_HINT))
    elif not out and loaded < want:
        out.append(
            Problem(
                "all", f"the orchestra's warm set is short: {loaded} of {want} models loaded.", ORCHESTRA_HINT
            )
        )
    return out


def node_env(
    pl: Placement,
    probe: dict[str, Any],
    settings: Settings,
    run_id: str,
    pythonpath: str,
    time_limit_s: int | None = None,
) -> dict[str, str]:
    env = {
        **run_env(settings, run_id, pl.device, pl.nproc, int(probe.get("cpu_count") or 1), time_limit_s),
        "LABCTL_HOST": pl.host.name,
    }
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    if settings.requires_orchestra:
        # A --script finds the models to ask as the reference trainer does (client.load_endpoints).
        env["LABCTL_ORCHESTRA_ENDPOINTS"] = paths.ORCHESTRA_ENDPOINTS
        # ...and runs their code as it does (labctl.agent.sandbox.client.load_service).
        env["LABCTL_SANDBOX_SERVICE"] = paths.SANDBOX_CLIENT
    iface = (probe.get("iface") or {}).get("name")
    if iface:
        env["GLOO_SOCKET_IFNAME"] = iface
        env["NCCL_SOCKET_IFNAME"] = iface
    if pl.device == "cuda":
        # nvidia-smi numbers GPUs in PCI bus order; CUDA's default order is fastest first.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g.index) for g in pl.gpus if g.index is not None)
    env.update(settings.env)
    return env


def run_env(
    settings: Settings, run_id: str, device: str, nproc: int, cpus: int | None, time_limit_s: int | None
) -> dict[str, str]:
    """The environment every node of the run gets, wherever it is; `cpus`: the node's, None unknown."""
    env = {
        RUN_ENV: run_id,
        "LABCTL_TRAIN_DEVICE": device,
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": LOG_PREFIX_TEMPLATE,
        "PYTHONUNBUFFERED": "1",
        **FRESH_STORE_ENV,
    }
    if cpus is not None:
        # Threads per process: the node's cores shared by its workers, not every worker taking all.
        env["OMP_NUM_THREADS"] = str(max(1, cpus // nproc))
    if time_limit_s is not None:
        # A user's --script cannot read the reference trainer's settings: it gets the limit here.
        env[TIME_LIMIT_ENV] = str(time_limit_s)
    if device == "cuda":
        env["NCCL_DEBUG"] = settings.nccl_debug
    return env


def plan_cluster_run(
    *,
    settings: Settings,
    phase: int,
    run_id: str,
    cluster: ClusterShape,
    device_override: str | None,
    script: str | None = None,
    script_args: tuple[str, ...] = (),
    time_limit_s: int | None = None,
) -> LaunchSpec:
    """The run on a cluster the flags describe: every node alike, nothing asked of any host.

    The job's scheduler picks the nodes and their addresses, so the nodes here have neither; the
    phase's `gpus:` names the lab's GPU models and means nothing there.
    """
    wanted = device_override or settings.device
    device = wanted if wanted != "auto" else "cuda" if cluster.gpus_per_node else "cpu"
    if device == "cuda" and not cluster.gpus_per_node:
        raise InputError(
            f"phase {phase} trains on cuda, but --gpus-per-node 0 gives its nodes no GPU.",
            "Give the GPUs each node has, e.g. --gpus-per-node 8, or train on CPUs with --device cpu.",
        )
    if device == "cpu" and cluster.gpus_per_node:
        raise InputError(
            f"phase {phase} trains on CPUs (device cpu), but --gpus-per-node {cluster.gpus_per_node} "
            "asks each node for GPUs it would not use.",
            "Give --gpus-per-node 0 for a CPU job, or train on the GPUs with --device cuda.",
        )
    one = settings.strategy == "single_gpu_debug"  # one process per node, as on a lab host
    nproc = 1 if one else cluster.gpus_per_node if device == "cuda" else settings.cpu_procs
    env = {**run_env(settings, run_id, device, nproc, cluster.cpus_per_node, time_limit_s), **settings.env}
    nodes = tuple(
        NodeSpec(host=f"node{i}", address="", nproc=nproc, device=device, python="python3", env=env)
        for i in range(cluster.nodes)
    )
    return LaunchSpec(
        run_id=run_id,
        phase=phase,
        dist_backend="nccl" if device == "cuda" else "gloo",
        nodes=nodes,
        head_address="",
        # 0 means "a free one" on a lab host, found by preflight; a job's nodes take the default.
        port=settings.port or type(settings).model_fields["port"].default,
        max_restarts=settings.max_restarts,
        settings=settings.trainer_settings(
            phase, run_id, f"labctl-runs/{run_id}/metrics.jsonl", time_limit_s
        ),
        script=script,
        script_args=script_args,
        rdzv_timeout=settings.rdzv_timeout,
        time_limit_s=time_limit_s,
    )
