"""Doctor's verdicts: pure functions from what gather.py found to pass/warn/fail lines.

Seed 004 "Infrastructure Validation": hardware (GPUs found with their memory, driver and
CUDA), software (the torch build covers each GPU, one torch and NCCL across training hosts),
network (link speeds and bonds, bandwidth and latency), plus what this lab needs beyond it:
disk for checkpoints, the model cache's mount, sandbox images, clocks and pinned host keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from labctl.agent.core.gpus import runs_on
from labctl.doctor.gather import Gathered, HostFound, NetworkProbe, runs_sandboxes
from labctl.doctor.model import FAIL, PASS, WARN, Line
from labctl.doctor.tiers import NodeHas, Tier
from labctl.doctor.tiers import check_tier as check_tier_needs
from labctl.facts.compare import GIB, compare_declared, section_error
from labctl.facts.gpus import builds_for, fmt_cap, parse_cap, version_tuple

CKPT_WARN_GB = 100  # seed 003 §2.1: model checkpoints 100GB at the development scale
CKPT_FAIL_GB = 10
SKEW_WARN_S = 0.5  # torchrun's logs and rotation schedules line up across hosts only this far
SKEW_FAIL_S = 5.0
BANDWIDTH_SHARE_WARN = 0.5  # one stream under half its link: something other than the link is in the way
LATENCY_WARN_MS = 5.0  # a LAN connect plus one request; slower points at a routed or loaded path
CACHE_SIZE_TOLERANCE = 0.05


def _gb(n: Any) -> str:
    # Memory (RAM, GPU memory, the tmpfs cache) in GiB, as facts show it; disk space in GB.
    return f"{n / GIB:.1f} GiB" if isinstance(n, (int, float)) else "unknown"


def _gpus(f: HostFound) -> list[dict[str, Any]]:
    facts = f.facts or {}
    if section_error(facts, "gpus") is not None:
        return []
    return [g for g in facts.get("gpus") or [] if isinstance(g, dict)]


def check_gpus(f: HostFound) -> list[Line]:
    """Declared GPUs and RAM against the facts (facts.compare's sentences), found GPUs listed."""
    h, facts = f.host, f.facts or {}
    name = h.name
    declared = [g.model_dump() for g in h.gpus]
    lines = []
    no_driver = facts.get("gpu_source") == "none"
    for m in compare_declared(declared, None, facts):
        if no_driver and "found 0" in m:
            fix = (
                f"Install the NVIDIA driver on {name} (nvidia-smi -L must list the cards), "
                "or remove the GPUs it does not have from the inventory's gpus:."
            )
        else:
            fix = (
                f"Check the cards are seated and powered (nvidia-smi -L on {name}), "
                "or correct the inventory's gpus: to what is there."
            )
        lines.append(Line(FAIL, "GPUs declared", name, m, fix))
    found = _gpus(f)
    if declared and not lines:
        lines.append(
            Line(PASS, "GPUs declared", name, f"all {sum(g['count'] for g in declared)} declared GPUs found")
        )
    for g in found:
        lines.append(
            Line(
                PASS, "GPU", name,
                f"GPU {g.get('index')}: {g.get('name')} {_gb(g.get('memory_total_bytes'))}"
                f" (sm {g.get('compute_capability') or '?'})",
            )
        )  # fmt: skip
    for m in compare_declared([], h.ram_gb, facts):
        lines.append(Line(WARN, "RAM declared", name, m, f"Correct ram_gb: for {name} in the inventory."))
    if h.ram_gb is not None and not any(x.check == "RAM declared" for x in lines):
        total = (facts.get("memory") or {}).get("total_bytes")
        lines.append(
            Line(PASS, "RAM declared", name, f"declared {h.ram_gb:g} GiB, host reports {_gb(total)}")
        )
    return lines


def check_driver(f: HostFound) -> list[Line]:
    """The driver and the CUDA it supports, against the CUDA torch was built for."""
    name, facts = f.host.name, f.facts or {}
    found = _gpus(f)
    if not found:
        if f.host.gpus:
            return [
                Line(
                    FAIL, "driver", name, "no NVIDIA driver answers (neither NVML nor nvidia-smi)"
                    if facts.get("gpu_source") == "none" else "no GPU reported by the driver",
                    f"Install the NVIDIA driver on {name} and check `nvidia-smi` lists its cards.",
                )
            ]  # fmt: skip
        return []
    drivers = sorted({str(g.get("driver_version")) for g in found if g.get("driver_version")})
    cudas = sorted({str(g.get("cuda_driver_version")) for g in found if g.get("cuda_driver_version")})
    text = f"driver {', '.join(drivers) or 'unknown'}, CUDA {', '.join(cudas) or 'unknown'} supported"
    torch_cuda = (facts.get("torch") or {}).get("cuda")
    if torch_cuda and cudas and min(version_tuple(c) for c in cudas) < version_tuple(str(torch_cuda))[:2]:
        return [
            Line(
                FAIL, "driver", name, f"{text}; torch is built for CUDA {torch_cuda}",
                f"Update the NVIDIA driver on {name} to one supporting CUDA {torch_cuda}, or install a torch "
                "build for the CUDA it supports (labctl provision --tags torch).",
            )
        ]  # fmt: skip
    return [Line(PASS, "driver", name, text + (f"; torch built for CUDA {torch_cuda}" if torch_cuda else ""))]


def _caps(f: HostFound) -> list[tuple[str, tuple[int, int]]]:
    out = []
    for g in _gpus(f):
        cc = g.get("compute_capability")
        if cc:
            out.append((f"GPU {g.get('index')} {g.get('name')}", parse_cap(str(cc))))
    return out


def check_torch_build(f: HostFound) -> list[Line]:
    """The installed torch has kernels for every GPU the host reports (labctl/facts/gpus.py)."""
    name, torch = f.host.name, (f.facts or {}).get("torch") or {}
    caps = _caps(f)
    if not caps:
        return []
    if not torch.get("installed") or not torch.get("version"):
        why = torch.get("error") or "torch is not installed"
        status = FAIL if f.host.has_role("train") else WARN
        return [
            Line(status, "torch build", name, why, f"Install torch on {name}: labctl provision --tags torch.")
        ]
    version = str(torch["version"])
    if not torch.get("cuda"):
        return [
            Line(FAIL, "torch build", name, f"torch {version} is a CPU-only build",
                 f"Install a CUDA build on {name}: labctl provision --tags torch.")
        ]  # fmt: skip
    arch = [str(a) for a in torch.get("arch_list") or []]
    missing = [(what, cap) for what, cap in caps if arch and not runs_on(arch, cap)]
    if missing:
        builds = builds_for(version, [c for _, c in caps])
        fix = (
            f"Install torch {version.split('+')[0]}+{builds[0]} (it covers every GPU here): "
            "labctl provision --tags torch."
            if builds
            else f"No torch {version} build covers all these GPUs; pin an older torch in the torch_env resource."
        )
        found = "; ".join(f"{w} ({fmt_cap(c)})" for w, c in missing)
        return [
            Line(
                FAIL,
                "torch build",
                name,
                f"torch {version} (CUDA {torch['cuda']}) has no kernels for {found}",
                fix,
            )
        ]
    if not arch:
        return [Line(WARN, "torch build", name, f"torch {version} reported no CUDA arch list",
                     f"Check `python -c 'import torch; print(torch.cuda.get_arch_list())'` on {name}.")]  # fmt: skip
    covered = ", ".join(sorted({fmt_cap(c) for _, c in caps}))
    return [Line(PASS, "torch build", name, f"torch {version} (CUDA {torch['cuda']}) covers {covered}")]


def check_same_torch(found: list[HostFound]) -> list[Line]:
    """One torch and one NCCL version on every training host: torchrun's ranks must agree."""
    train = [f for f in found if f.host.has_role("train") and f.facts is not None]
    if not train:
        return []
    seen: dict[str, list[str]] = {}
    for f in train:
        t = (f.facts or {}).get("torch") or {}
        key = f"torch {t.get('version')}, NCCL {t.get('nccl')}" if t.get("installed") else "no torch"
        seen.setdefault(key, []).append(f.host.name)
    text = "; ".join(f"{k} on {', '.join(v)}" for k, v in sorted(seen.items()))
    if len(seen) > 1:
        return [Line(FAIL, "same torch/NCCL", None, text,
                     "Provision the same torch on every training host: labctl provision --tags torch --limit role:train.")]  # fmt: skip
    if "no torch" in seen:
        return [Line(WARN, "same torch/NCCL", None, text,
                     "Install torch on the training hosts: labctl provision --tags torch --limit role:train.")]  # fmt: skip
    return [Line(PASS, "same torch/NCCL", None, text)]


def check_nics(f: HostFound) -> list[Line]:
    """Declared NICs present and up at their speed; a declared bond up with its members."""
    from labctl.netbench.plan import host_link

    h, facts = f.host, f.facts or {}
    name = h.name
    if section_error(facts, "nics") is not None:
        return [
            Line(
                WARN,
                "NICs",
                name,
                f"NIC facts missing: {section_error(facts, 'nics')}",
                "Run labctl facts -v.",
            )
        ]
    nics = {str(n.get("name")): n for n in facts.get("nics") or [] if isinstance(n, dict)}
    lines = []
    for d in h.nics:
        n = nics.get(d.name)
        if n is None:
            lines.append(Line(FAIL, "NIC", name, f"{d.name} is declared but not on the host",
                              f"Correct nics: for {name} in the inventory (`ip link` lists what is there)."))  # fmt: skip
            continue
        state = n.get("operstate")
        # The speed as `facts.collect` shows it; a virtual NIC's (a veth, a bridge) is what its driver
        # says, not a cable's, so it is shown as such and never held against the declared one.
        reported = n.get("speed_mbps")
        speed = reported if not n.get("virtual") else None
        text = f"{d.name} {state}, " + (
            "no speed reported"
            if not reported
            else f"{reported} Mbit/s"
            + (" (virtual NIC: its driver's figure, not a link's)" if speed is None else "")
        )
        if n.get("master") and state != "up":
            state = "up" if nics.get(str(n["master"]), {}).get("operstate") == "up" else state
        if state not in ("up", "unknown"):
            lines.append(Line(FAIL, "NIC", name, text, f"Check {d.name}'s cable and switch port on {name}."))
        elif speed and d.speed_mbps and speed < d.speed_mbps:
            lines.append(Line(WARN, "NIC", name, f"{text}; declared {d.speed_mbps} Mbit/s",
                              f"Check the cable and switch port of {d.name} (ethtool {d.name}), or the inventory."))  # fmt: skip
        else:
            lines.append(
                Line(PASS, "NIC", name, text + (f"; declared {d.speed_mbps} Mbit/s" if d.speed_mbps else ""))
            )
    link = host_link(h, facts)
    if h.bond is not None:
        bond = nics.get(h.bond.name)
        if bond is None or not bond.get("is_bond"):
            lines.append(Line(WARN, "bond", name, f"declares {h.bond.name} ({h.bond.mode}) but it is not up",
                              "Bring it up: " + f.fixes.get("bond", f"labctl provision -p playbooks/network.yaml --limit {name}")))  # fmt: skip
        else:
            b = bond.get("bond") or {}
            slaves = [s.get("name") for s in b.get("slaves") or []]
            ok = bond.get("operstate") == "up" and b.get("mii_status") in (None, "up") and len(slaves) >= 2
            text = f"{h.bond.name} {b.get('mode')} {bond.get('operstate')}, members {', '.join(map(str, slaves))}"
            lines.append(Line(PASS if ok else WARN, "bond", name, text,
                              "" if ok else f"Check the bond's members and switch LACP config on {name}."))  # fmt: skip
    lines.append(Line(PASS if link.mbps else WARN, "link speed", name, link.describe(),
                      "" if link.mbps else f"Declare speed_mbps: for {name}'s NIC in the inventory."))  # fmt: skip
    return lines


def check_network(probe: NetworkProbe | None, skipped: str | None) -> list[Line]:
    """The short `bench network` between two hosts: rate against the link, and latency."""
    if probe is None:
        return [
            Line(
                WARN,
                "bandwidth",
                None,
                f"not measured: {skipped}",
                "Run doctor over two or more Linux hosts.",
            )
        ]
    pair = f"{probe.sender} -> {probe.receiver}"
    if probe.error or not probe.report:
        return [
            Line(
                FAIL,
                "bandwidth",
                None,
                f"{pair}: {probe.error}",
                probe.hint or "Check the network between them.",
            )
        ]
    r = probe.report
    best = r.get("best") or {}
    mbps, share = best.get("mbps"), best.get("share")
    if not isinstance(mbps, (int, float)):  # the sender answered with no stream measured
        return [
            Line(FAIL, "bandwidth", None, f"{pair}: no stream was measured",
                 f"Run labctl bench network --from {probe.sender} --to {probe.receiver} for detail.")
        ]  # fmt: skip
    link = (r.get("link") or {}).get("mbps")
    text = f"{pair}: {mbps:.0f} Mbit/s, 1 stream" + (
        f", {share:.0%} of the {link} Mbit/s link" if share else ""
    )
    lines = []
    if share is not None and share < BANDWIDTH_SHARE_WARN:
        lines.append(Line(WARN, "bandwidth", None, text,
                          f"Run labctl bench network --from {probe.sender} --to {probe.receiver} for detail."))  # fmt: skip
    else:
        lines.append(Line(PASS, "bandwidth", None, text))
    ms = [x.get("connect_ms") for x in r.get("runs") or [] if x.get("connect_ms") is not None]
    if not ms:
        lines.append(
            Line(WARN, "latency", None, f"{pair}: not reported", "Update labctl's agent on the hosts.")
        )
    elif min(ms) > LATENCY_WARN_MS:
        lines.append(Line(WARN, "latency", None, f"{pair}: {min(ms):.2f} ms to connect and get one answer",
                          "Check the path between them is one switched hop (traceroute)."))  # fmt: skip
    else:
        lines.append(Line(PASS, "latency", None, f"{pair}: {min(ms):.2f} ms to connect and get one answer"))
    return lines


def mount_of(mounts: list[dict[str, Any]], path: str) -> dict[str, Any] | None:
    """The mount that holds `path`: the longest mountpoint that is a prefix of it."""
    best = None
    for m in mounts:
        point = str(m.get("mountpoint") or "")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > len(str(best.get("mountpoint")))):
            best = m
    return best


def check_checkpoint_disk(f: HostFound) -> list[Line]:
    from labctl.agent.core.paths import TRAIN_DIR

    name, facts = f.host.name, f.facts or {}
    if not f.host.has_role("train") or section_error(facts, "mounts") is not None:
        return []
    m = mount_of([x for x in facts.get("mounts") or [] if isinstance(x, dict)], TRAIN_DIR)
    free = (m or {}).get("free_bytes")
    if not isinstance(free, int):
        return [
            Line(
                WARN, "checkpoint disk", name, f"free space under {TRAIN_DIR} unknown", "Run labctl facts -v."
            )
        ]
    text = f"{free / 1e9:.0f} GB free on {m.get('mountpoint')} for {TRAIN_DIR}"  # type: ignore[union-attr]
    if free < CKPT_FAIL_GB * 1e9:
        return [Line(FAIL, "checkpoint disk", name, text, f"Free space on {name} or keep fewer checkpoints.")]
    if free < CKPT_WARN_GB * 1e9:
        return [Line(WARN, "checkpoint disk", name, text + f" (a development node holds about {CKPT_WARN_GB} GB of checkpoints)",
                     f"Free space on {name}, or point the training checkpoints at a larger disk.")]  # fmt: skip
    return [Line(PASS, "checkpoint disk", name, text)]


def check_cache_mount(f: HostFound) -> list[Line]:
    h, facts = f.host, f.facts or {}
    if h.model_cache is None or section_error(facts, "mounts") is not None:
        return []
    path = h.model_cache.path
    want = h.model_cache.size_gb * GIB
    m = next(
        (x for x in facts.get("mounts") or [] if isinstance(x, dict) and x.get("mountpoint") == path), None
    )
    fix = f.fixes.get("cache", f"labctl provision --tags cache --limit {h.name}")
    if m is None:
        return [Line(WARN, "model cache", h.name, f"{path} is not mounted", f"Mount it: {fix}.")]
    size = m.get("size_bytes")
    text = f"{path} {m.get('fstype')} {_gb(size)} (declared {h.model_cache.size_gb:g} GiB)"
    if not isinstance(size, int) or abs(size - want) > CACHE_SIZE_TOLERANCE * want:
        return [Line(WARN, "model cache", h.name, text, f"Remount it at the declared size: {fix}.")]
    return [Line(PASS, "model cache", h.name, text)]


def check_sandbox(f: HostFound) -> list[Line]:
    from labctl.agent.sandbox import image_name

    h, facts = f.host, f.facts or {}
    if not runs_sandboxes(h):
        return []
    fix = f.fixes.get("sandbox", f"labctl provision -p playbooks/sandbox.yaml --limit {h.name}")
    docker = facts.get("docker") or {}
    if not docker.get("server_version"):
        why = "no Docker engine answers" if docker.get("cli") else "Docker is not installed"
        return [Line(FAIL, "docker", h.name, why, f"Install and start it: {fix}.")]
    lines = [Line(PASS, "docker", h.name, f"Docker {docker['server_version']}")]
    if f.images_error:
        return [*lines, Line(FAIL, "sandbox images", h.name, f.images_error, f"Check dockerd on {h.name}.")]
    langs = h.sandbox.languages if h.sandbox is not None else ["python"]
    have = {str(i.get("lang")) for i in f.images or [] if i.get("image")}
    missing = [x for x in langs if x not in have]
    if missing:
        lines.append(Line(FAIL, "sandbox images", h.name, f"missing {', '.join(image_name(x) for x in missing)}",
                          f"Build them: {fix}."))  # fmt: skip
    else:
        lines.append(Line(PASS, "sandbox images", h.name, f"{', '.join(langs)} images present"))
    return lines


def check_clocks(found: list[HostFound]) -> list[Line]:
    """Each host's clock against this machine's, read within one agent round trip."""
    lines = []
    for f in found:
        c = f.clock
        if c is None:
            continue
        mid, half = (c.before + c.after) / 2, (c.after - c.before) / 2
        skew = c.host - mid
        off = max(abs(skew) - half, 0.0)  # what the round trip cannot explain
        text = f"{skew:+.3f} s against this machine (±{half:.3f} s)"
        fix = f"Run NTP on {f.host.name}: timedatectl set-ntp true (or chrony)."
        status = FAIL if off > SKEW_FAIL_S else WARN if off > SKEW_WARN_S else PASS
        lines.append(Line(status, "clock skew", f.host.name, text, fix if status != PASS else ""))
    return lines


def check_host_key(f: HostFound) -> list[Line]:
    from labctl.transport.hostkeys import fingerprint, pinned_keys

    h = f.host
    if h.connection == "local":
        return []
    path = Path(h.known_hosts) if h.known_hosts else None
    keys = pinned_keys(path, h.address, h.port or 22)
    if not keys:
        return [Line(FAIL, "host key", h.name, f"no key pinned for {h.address} in {path or 'known_hosts'}",
                     f"Pin it: labctl trust {h.name}")]  # fmt: skip
    prints = ", ".join(f"{t} {fingerprint(k)}" for t, k in sorted(keys.items()))
    return [Line(PASS, "host key", h.name, f"pinned: {prints}")]


def check_alerts(f: HostFound) -> list[Line]:
    """Seed 004's alerts firing now: critical ones fail, warnings warn; none is a pass."""
    name = f.host.name
    if f.alerts_error:
        return [
            Line(
                WARN,
                "alerts",
                name,
                f"could not sample the host: {f.alerts_error}",
                "Run `labctl status` to see why.",
            )
        ]
    if f.alerts is None:
        return []
    if not f.alerts:
        return [Line(PASS, "alerts", name, "none firing")]
    return [
        Line(
            FAIL if a.severity == "critical" else WARN,
            f"alert {a.name}",
            name,
            a.message,
            "See `labctl status` for the trend; the thresholds are in alerts.yaml (--alerts).",
        )
        for a in f.alerts
    ]


def check_cron(f: HostFound) -> list[Line]:
    """Where labctl installed a scheduled job, something runs it: a cron daemon that reads this
    host's /etc/cron.d (systemd for a timer). Hosts with no job get no line."""
    from labctl.cron.install import idle_jobs, idle_text

    name = f.host.name
    if f.cron_error:
        return [
            Line(
                WARN, "cron", name, f"could not list labctl's jobs: {f.cron_error}", "Run `labctl cron list`."
            )
        ]
    jobs = [j for j in (f.cron or {}).get("jobs") or [] if isinstance(j, dict)]
    if not jobs:
        return []
    names = ", ".join(str(j.get("name")) for j in jobs)
    if idle_jobs(jobs):
        what, fix = idle_text(name, jobs)
        return [Line(FAIL, "cron", name, what, fix)]
    pids = ((f.cron or {}).get("daemons") or {}).get("cron") or []
    by = [f"cron (pid {', '.join(map(str, pids))})"] if any(j.get("backend") == "cron" for j in jobs) else []
    by += ["systemd"] if any(j.get("backend") == "systemd" for j in jobs) else []
    return [Line(PASS, "cron", name, f"{' and '.join(by) or 'a scheduler'} runs labctl's jobs {names}")]


def check_host(f: HostFound) -> list[Line]:
    name = f.host.name
    if f.skipped:
        return [
            *check_host_key(f),
            Line(WARN, "reachable", name, f"skipped: {f.skipped}", "Check it by hand."),
        ]
    if f.error or f.facts is None:
        return [*check_host_key(f), Line(FAIL, "reachable", name, f.error or "no facts", f.hint or "")]
    out = [Line(PASS, "reachable", name, "agent answered")]
    for check in (check_host_key, check_gpus, check_driver, check_torch_build, check_nics,
                  check_checkpoint_disk, check_cache_mount, check_sandbox, check_cron, check_alerts):  # fmt: skip
        out += check(f)
    return out


def check_lab(g: Gathered) -> list[Line]:
    lines: list[Line] = []
    for f in g.hosts:
        lines += check_host(f)
    lines += check_same_torch(g.hosts)
    lines += check_network(g.network, g.network_skipped)
    lines += check_clocks(g.hosts)
    return lines


def node_has(f: HostFound) -> NodeHas:
    """One host's facts in the units of seed 003's tiers."""
    from labctl.netbench.plan import host_link

    facts = f.facts or {}
    gpus = [g["memory_total_bytes"] / GIB for g in _gpus(f) if isinstance(g.get("memory_total_bytes"), int)]
    cpu = facts.get("cpu") or {}
    cores = cpu.get("physical_cores") or cpu.get("logical_cpus")
    total = (facts.get("memory") or {}).get("total_bytes")
    disks = [d for d in facts.get("disks") or [] if isinstance(d, dict) and not d.get("removable")]
    sizes = [d["size_bytes"] for d in disks if isinstance(d.get("size_bytes"), int)]
    return NodeHas(
        host=f.host.name,
        gpu_memory_gb=gpus,
        cpu_cores=int(cores) if isinstance(cores, int) else None,
        ram_gb=total / GIB if isinstance(total, int) else None,
        storage_tb=sum(sizes) / 1e12 if sizes else None,
        network_mbps=host_link(f.host, facts).mbps,
    )


def check_tier(found: list[HostFound], tier: Tier) -> list[Line]:
    """A scale tier (seed 003) figure by figure: met, or what is missing to reach it."""
    nodes = [node_has(f) for f in found if f.facts is not None]
    lines = []
    for need in check_tier_needs(nodes, tier):
        check = f"tier {tier.name}: {need.what}"
        text = f"needs {need.wanted} ({need.section}); best: {need.best}"
        fix = "" if need.met else f"missing to reach {tier.title}: {need.wanted}"
        lines.append(Line(PASS if need.met else FAIL, check, None, text, fix))
    return lines


def check_keeper(state: dict[str, Any]) -> list[Line]:
    """The connection keeper (labctl.keeper), from client.keeper_state: a folder it cannot use
    warns (every command then connects itself); off or not running yet passes."""
    check = "connection keeper"
    if not state["enabled"]:
        return [
            Line(
                PASS,
                check,
                None,
                "off (connections: {persist: 0} or $LABCTL_KEEPER=0): each command connects itself",
            )
        ]
    if state.get("folder_problem"):
        return [
            Line(
                WARN,
                check,
                None,
                f"not used: {state.get('reason')}",
                "Make that folder yours and mode 700 (`chmod 700 FOLDER`), or remove it: labctl creates it again.",
            )
        ]
    if not state["running"]:
        return [Line(PASS, check, None, "not running: the next command starts it")]
    conns = state["connections"]
    hosts = ", ".join(sorted({c["host"] for c in conns})) or "none"
    # An agent kept running on a connection serves its agent calls (keeper/agents.py).
    agents = sum(1 for c in conns if c.get("agents"))
    return [
        Line(
            PASS,
            check,
            None,
            f"pid {state.get('pid')} keeps {len(conns)} connection(s) ({hosts}), {agents} with an agent "
            f"kept running, for {state['persist']:g} s after the last command",
        )
    ]
