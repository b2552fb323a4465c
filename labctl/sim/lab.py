"""Bring a simulated lab up, down, and report on it; the CLI and the test fixtures both call this.

`up` converges: it compares what state.json records (and what the kernel shows) with what was
asked, and only changes the difference, so running it twice is a no-op.
"""

from __future__ import annotations

import ipaddress
import shutil
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import labctl
from labctl.agent.core.fsutil import write_atomic
from labctl.output.errors import HostError, InputError
from labctl.sim import netns, sshd
from labctl.sim.commands import require_root, require_tool, run
from labctl.sim.plan import (
    DEFAULT_BRIDGE,
    DEFAULT_PREFIX,
    DEFAULT_RATE,
    DEFAULT_SUBNET,
    MANAGED_PATHS,
    HostPlan,
    bridge_address,
    host_names,
    inventory_doc,
    known_hosts_text,
    lab_name,
    parse_rate,
    parse_subnet,
    plan_hosts,
    seed_hosts,
    sshd_config,
)
from labctl.sim.state import HostState, Recorder, SimState, load, locked, state_path

if TYPE_CHECKING:
    from rich.console import Console

DEFAULT_DIR = Path(".labctl/sim")
INVENTORY_FILE = "inventory.yaml"
KEY_FILE = "keys/id_ed25519"
KNOWN_HOSTS_FILE = "keys/known_hosts"
AUTHORIZED_KEYS_FILE = "keys/authorized_keys"
MAX_WORKERS = 8

T = TypeVar("T")


@dataclass
class HostStatus:
    name: str
    namespace: str
    address: str
    sshd_pid: int | None
    alive: bool  # the recorded sshd process is running
    reachable: bool  # port 22 answers with an SSH banner
    rate: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SimLab:
    """A running sim: where its inventory and keys are, and its hosts' addresses.

    `changes` says what the `up` that returned it did (empty when nothing needed doing).
    """

    dir: Path
    bridge: str
    prefix: str
    subnet: str
    rate: str
    hosts: dict[str, str]  # name -> address
    changes: list[str] = field(default_factory=list)

    @property
    def inventory_path(self) -> Path:
        return self.dir / INVENTORY_FILE

    @property
    def key_path(self) -> Path:
        return self.dir / KEY_FILE

    @property
    def known_hosts_path(self) -> Path:
        return self.dir / KNOWN_HOSTS_FILE

    @property
    def bridge_address(self) -> str:
        return bridge_address(self.subnet)

    def namespace(self, name: str) -> str:
        """The network namespace of host `name`, for `ip netns exec NS ...`."""
        self._check(name)
        return f"{self.prefix}{name}"

    def stop_host(self, name: str) -> bool:
        """Kill everything running on host `name` (its sshd and sessions): it looks dead, port 22 refuses."""
        self._check(name)
        return stop_host(self.dir, name)

    def start_host(self, name: str) -> bool:
        """Start host `name`'s sshd again; False when it was already running."""
        self._check(name)
        return start_host(self.dir, name)

    def set_sftp(self, name: str, enabled: bool) -> bool:
        """Run host `name`'s sshd with or without its sftp subsystem; True when that changed."""
        self._check(name)
        return set_sftp(self.dir, name, enabled)

    def status(self) -> list[HostStatus]:
        return status(self.dir)

    def down(self) -> list[str]:
        return down(self.dir)

    def as_dict(self) -> dict[str, Any]:
        return {
            "dir": str(self.dir),
            "inventory": str(self.inventory_path),
            "ssh_key": str(self.key_path),
            "known_hosts": str(self.known_hosts_path),
            "bridge": self.bridge,
            "bridge_address": self.bridge_address,
            "subnet": self.subnet,
            "rate": self.rate,
            "hosts": dict(self.hosts),
            "changes": list(self.changes),
        }

    def _check(self, name: str) -> None:
        if name not in self.hosts:
            raise InputError(f"The sim has no host {name}.", f"Its hosts: {', '.join(self.hosts)}.")


def _preflight() -> None:
    require_root()
    sshd.require_sshd()
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux")):
        require_tool(tool, package)
    require_tool("ssh-keygen", "openssh-client")


def _resolve_dir(sim_dir: Path | str) -> Path:
    d = Path(sim_dir).expanduser().resolve()
    for mp in MANAGED_PATHS:
        if d == Path(mp.path) or Path(mp.path) in d.parents:
            raise InputError(
                f"The sim directory {d} is under {mp.path}, which each sim host replaces with its own copy.",
                "Use another --dir, e.g. .labctl/sim in your project.",
            )
    return d


def _python() -> str:
    for p in ("/usr/bin/python3", shutil.which("python3")):
        if p and Path(p).exists():
            return p
    return sys.executable


def load_seed() -> dict[str, Any]:
    """Hosts of the seed lab (labctl/data/lab.yaml); empty when the file is not there."""
    import yaml

    path = Path(labctl.__file__).parent / "data" / "lab.yaml"
    try:
        doc = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        return {}
    except yaml.YAMLError as e:
        raise InputError(f"The seed lab {path} is not valid YAML: {e}") from None
    return dict(seed_hosts(doc))


def _parallel(
    items: Sequence[T], fn: Callable[[T], Any], label: str, console: Console | None, key: Callable[[T], str]
) -> list[tuple[str, Exception]]:
    """Run fn over items on a few threads, with a progress bar on `console`; returns the failures."""
    failures: list[tuple[str, Exception]] = []
    if not items:
        return failures

    def work(progress_advance: Callable[[], None]) -> None:
        with ThreadPoolExecutor(max_workers=min(MAX_WORKERS, len(items))) as pool:
            futures = {pool.submit(fn, it): key(it) for it in items}
            for fut in as_completed(futures):
                exc = fut.exception()
                if exc is not None:
                    if not isinstance(exc, Exception):
                        raise exc
                    failures.append((futures[fut], exc))
                progress_advance()

    if console is None:
        work(lambda: None)
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task(label, total=len(items))
            work(lambda: progress.advance(task))
    return failures


def _raise_failures(what: str, failures: list[tuple[str, Exception]], sim_dir: Path) -> None:
    if not failures:
        return
    lines = [f"{name}: {e.message if isinstance(e, HostError | InputError) else e}" for name, e in failures]
    raise HostError(
        f"{what} failed on {len(failures)} host(s):\n  " + "\n  ".join(sorted(lines)),
        f"What was created is recorded in {state_path(sim_dir)}; `labctl sim down --dir {sim_dir}` removes it.",
    )


def _addresses_in_use() -> dict[str, str]:
    out = run(["ip", "-4", "-o", "addr", "show"]).stdout
    found: dict[str, str] = {}
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            found[parts[parts.index("inet") + 1].split("/")[0]] = parts[1]
    return found


def _check_conflicts(state: SimState, plans: Sequence[HostPlan], sim_dir: Path) -> None:
    """Refuse to adopt a bridge, namespace or address that another sim (or anything else) owns."""
    hint = "Another sim may use it: run `labctl sim down --dir THAT_DIR`, or pick --bridge/--prefix/--subnet."
    if not state.bridge_created and netns.link_exists(state.bridge):
        owner = netns.bridge_owner(state.bridge)
        if owner:
            raise HostError(
                f"The bridge {state.bridge} belongs to the sim in {owner}, not to the one in {sim_dir}.",
                f"Run `labctl sim down --dir {owner}` if that sim is no longer wanted (a run stopped"
                " before its teardown leaves it behind), or pick another --bridge/--prefix/--subnet.",
            )
        raise HostError(
            f"The bridge {state.bridge} already exists and is not part of the sim in {sim_dir}.", hint
        )
    gw = bridge_address(state.subnet)
    used = _addresses_in_use()
    if gw in used and used[gw] != state.bridge:
        raise HostError(f"The address {gw} (the sim's bridge) is already on {used[gw]}.", hint)
    existing = netns.namespaces()
    for p in plans:
        if p.name in state.hosts:
            continue
        if p.namespace in existing:
            raise HostError(
                f"The namespace {p.namespace} already exists and is not part of the sim in {sim_dir}.", hint
            )
        for v in p.veths:
            if netns.link_exists(v):
                raise HostError(
                    f"The interface {v} already exists and is not part of the sim in {sim_dir}.", hint
                )


def _remove_host(sim_dir: Path, rec: Recorder, hs: HostState) -> None:
    files = sshd.HostFiles(sim_dir, hs.name)
    netns.delete_namespace(hs.namespace)
    if hs.sshd_pid and sshd.is_alive(
        hs.sshd_pid, files
    ):  # outlived its namespace file; still ours by its config path
        netns.send_signal(hs.sshd_pid, signal.SIGKILL)
    for v in hs.veths:
        netns.delete_link(v)
    _rmtree_inside(sim_dir, files.dir)
    rec.remove_host(hs.name)


def _rmtree_inside(sim_dir: Path, path: Path) -> None:
    """Delete `path` only when it lies inside the sim directory, whatever a state file says."""
    path = path.resolve()
    if sim_dir not in path.parents:
        return
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _write_if_changed(path: Path, text: str, mode: int = 0o644) -> bool:
    try:
        if path.read_text() == text:
            return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(str(path), text.encode(), mode=mode)
    return True


def up(
    dir: Path | str = DEFAULT_DIR,
    hosts: Sequence[str] | None = None,
    count: int | None = None,
    rate: str | None = None,
    bridge: str | None = None,
    prefix: str | None = None,
    subnet: str | None = None,
    console: Console | None = None,
) -> SimLab:
    """Build (or converge) a simulated lab in `dir` and return it.

    Hosts are `hosts` (default m5, irina, pharaoh, workstation), then node01, node02, ... up to
    `count`. Each is a network namespace on `bridge` with its own sshd, host key, two NICs shaped to
    `rate` (default 1gbit) in both directions, and private copies of the paths labctl manages.
    `dir` receives inventory.yaml, keys/ and state.json.

    On an existing lab, None for any argument means "as recorded", so a bare `up()` only repairs:
    missing namespaces are rebuilt and dead sshds restarted. Given `hosts`/`count`, the lab becomes
    exactly those hosts (new ones added, recorded ones not named removed); a different `rate`
    re-shapes every link. `bridge`, `prefix` and `subnet` (default lcbr0, lc-, 10.250.0.0/24) are
    fixed when the lab is first built. Give distinct ones to run two labs side by side:

        lab = up(tmp_path / "sim", hosts=["a", "b"], bridge="lcbr9", prefix="lt-", subnet="10.251.0.0/24")
        lab.inventory_path, lab.hosts["a"]   # -> .../sim/inventory.yaml, '10.251.0.10'

    `console` gets a progress bar (stderr) when given.
    """
    _preflight()
    sim_dir = _resolve_dir(dir)
    if hosts is not None or count is not None:
        host_names(hosts, count)  # refuse bad names before touching anything
    if rate is not None:
        parse_rate(rate)
    try:
        return _up_locked(sim_dir, hosts, count, rate, bridge, prefix, subnet, console)
    finally:
        if not state_path(sim_dir).exists():  # refused before creating anything: leave no trace
            (sim_dir / ".lock").unlink(missing_ok=True)
            _rmdir_quiet(sim_dir)


def _up_locked(
    sim_dir: Path,
    hosts: Sequence[str] | None,
    count: int | None,
    rate_given: str | None,
    bridge: str | None,
    prefix: str | None,
    subnet: str | None,
    console: Console | None,
) -> SimLab:
    import yaml

    with locked(sim_dir):
        old = load(sim_dir)
        if old is not None:
            for opt, given, recorded in (
                ("bridge", bridge, old.bridge),
                ("prefix", prefix, old.prefix),
                ("subnet", subnet, old.subnet),
            ):
                if given is not None and given != recorded:
                    raise InputError(
                        f"The sim in {sim_dir} was built with --{opt} {recorded}, not {given}.",
                        f"Run `labctl sim down --dir {sim_dir}` first to rebuild it with another {opt}.",
                    )
            state = old
        else:
            state = SimState(
                dir=str(sim_dir),
                bridge=bridge or DEFAULT_BRIDGE,
                prefix=prefix or DEFAULT_PREFIX,
                subnet=subnet or DEFAULT_SUBNET,
                rate=rate_given or DEFAULT_RATE,
            )
        rate = rate_given or state.rate
        if hosts is None and count is None and state.hosts:
            names = list(state.hosts)
        else:
            names = host_names(hosts, count)
        net = parse_subnet(state.subnet)
        existing = {h.name: h.address for h in state.hosts.values()}
        plans = plan_hosts(names, state.subnet, state.bridge, state.prefix, existing)
        _check_conflicts(state, plans, sim_dir)

        rec = Recorder(sim_dir, state)
        changes: list[str] = []
        rec.save()

        # The bridge and forwarding rule are recorded before they are made, so `down` finds them
        # even if this run dies in between.
        gw = bridge_address(state.subnet)
        if not netns.link_exists(state.bridge):
            state.bridge_created = True
            rec.save()
            changes.append(f"created bridge {state.bridge} ({gw}/{net.prefixlen})")
        netns.create_bridge(state.bridge, gw, net.prefixlen, str(sim_dir))
        present = netns.forward_rule_present(state.bridge)
        if present is False:
            state.iptables_rule = netns.forward_rule(state.bridge)
            rec.save()
            netns.insert_forward_rule(state.bridge)
            changes.append(f"allowed forwarding on {state.bridge} in iptables")

        for mp in sshd.ensure_mount_points():
            if mp not in state.mount_points_created:
                state.mount_points_created.append(mp)
                changes.append(f"created mount point {mp} on this machine")
        rec.save()

        key = sim_dir / KEY_FILE
        for rel in (
            KEY_FILE,
            KEY_FILE + ".pub",
            KNOWN_HOSTS_FILE,
            AUTHORIZED_KEYS_FILE,
            "hosts",
            INVENTORY_FILE,
        ):
            rec.add_file(rel)
        if sshd.ensure_keypair(key, "labctl-sim-client"):
            changes.append(f"created client key {key}")
        authorized = sim_dir / AUTHORIZED_KEYS_FILE
        _write_if_changed(authorized, sshd.public_key(key) + "\n")

        wanted = {p.name for p in plans}
        stale = [h for h in list(state.hosts.values()) if h.name not in wanted]
        failures = _parallel(
            stale, lambda h: _remove_host(sim_dir, rec, h), "removing hosts", console, key=lambda h: h.name
        )
        changes += [f"removed host {h.name}" for h in stale if h.name not in state.hosts]
        _raise_failures("Removing hosts", failures, sim_dir)

        host_changes: dict[str, list[str]] = {}

        def converge(p: HostPlan) -> None:
            host_changes[p.name] = _converge_host(
                sim_dir, rec, p, rate, net.prefixlen, state.bridge, authorized
            )

        failures = _parallel(plans, converge, "starting hosts", console, key=lambda p: p.name)
        for p in plans:
            changes += host_changes.get(p.name, [])
        state.rate = rate
        with rec.lock:  # threads recorded hosts in finishing order; keep the order asked for
            state.hosts = {p.name: state.hosts[p.name] for p in plans if p.name in state.hosts} | {
                n: h for n, h in state.hosts.items() if n not in wanted
            }
        rec.save()
        _raise_failures("Bringing up hosts", failures, sim_dir)

        known = known_hosts_text(
            [(p.address, sshd.public_key(sshd.HostFiles(sim_dir, p.name).host_key)) for p in plans]
        )
        if _write_if_changed(sim_dir / KNOWN_HOSTS_FILE, known):
            changes.append(f"wrote {sim_dir / KNOWN_HOSTS_FILE}")
        doc = inventory_doc(plans, state.subnet, _python(), load_seed(), lab=lab_name(state.bridge))
        text = (
            f"# Written by `labctl sim up` for the simulated lab in {sim_dir}; `labctl sim down` removes it.\n"
            + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=110)
        )
        if _write_if_changed(sim_dir / INVENTORY_FILE, text):
            changes.append(f"wrote {sim_dir / INVENTORY_FILE}")
        return SimLab(
            dir=sim_dir,
            bridge=state.bridge,
            prefix=state.prefix,
            subnet=state.subnet,
            rate=rate,
            hosts={p.name: p.address for p in plans},
            changes=changes,
        )


def _converge_host(
    sim_dir: Path, rec: Recorder, p: HostPlan, rate: str, prefixlen: int, bridge: str, authorized: Path
) -> list[str]:
    changes: list[str] = []
    hs = rec.state.hosts.get(p.name)
    if hs is None:
        hs = HostState(name=p.name, namespace=p.namespace, address=p.address, veths=list(p.veths))
        rec.update_host(hs)
    created = False
    if not netns.host_is_wired(p.namespace, p.veths, p.address, prefixlen):
        # A rewired namespace starts fresh: its old sshd (if any) was bound to the old interfaces,
        # and may even live on in a namespace someone deleted under it.
        sshd.stop(hs.sshd_pid, sshd.HostFiles(sim_dir, p.name))
        if netns.namespace_exists(p.namespace):
            netns.kill_namespace(p.namespace, grace=0.5)
        netns.build_host(bridge, p.namespace, p.veths, p.address, prefixlen)
        hs.rate = None
        hs.sshd_pid = None
        created = True
        changes.append(f"created host {p.name} at {p.address}")
        rec.update_host(hs)
    files, config_changed = sshd.prepare_host(sim_dir, p, authorized)
    if hs.rate != rate:
        netns.shape_host(p.namespace, p.veths, rate)
        if not created:
            changes.append(f"re-shaped {p.name} to {rate}")
        hs.rate = rate
        rec.update_host(hs)
    alive = sshd.is_alive(hs.sshd_pid, files)
    if alive and config_changed:
        sshd.stop(hs.sshd_pid, files)
        alive = False
    if not alive:
        hs.sshd_pid = sshd.start(p, files)
        if not created:
            changes.append(f"restarted sshd on {p.name}")
        rec.update_host(hs)
    return changes


def _require_state(sim_dir: Path) -> SimState:
    st = load(sim_dir)
    if st is None:
        raise InputError(f"There is no sim in {sim_dir}.", f"Bring one up: labctl sim up --dir {sim_dir}.")
    return st


def open_lab(dir: Path | str = DEFAULT_DIR) -> SimLab:
    """The sim recorded in `dir`, without changing anything."""
    sim_dir = _resolve_dir(dir)
    st = _require_state(sim_dir)
    return SimLab(
        dir=sim_dir,
        bridge=st.bridge,
        prefix=st.prefix,
        subnet=st.subnet,
        rate=st.rate,
        hosts={h.name: h.address for h in st.hosts.values()},
    )


def status(dir: Path | str = DEFAULT_DIR) -> list[HostStatus]:
    """Each recorded host: namespace, address, sshd pid, whether sshd runs and port 22 answers."""
    require_root()
    sim_dir = _resolve_dir(dir)
    st = load(sim_dir)
    if st is None:
        return []
    hosts = sorted(st.hosts.values(), key=lambda h: ipaddress.IPv4Address(h.address))

    def one(h: HostState) -> HostStatus:
        files = sshd.HostFiles(sim_dir, h.name)
        return HostStatus(
            name=h.name,
            namespace=h.namespace,
            address=h.address,
            sshd_pid=h.sshd_pid,
            alive=sshd.is_alive(h.sshd_pid, files),
            reachable=sshd.probe(h.address, timeout=1.0),
            rate=h.rate,
        )

    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        return list(pool.map(one, hosts))


def stop_host(dir: Path | str, name: str) -> bool:
    """Kill every process in host `name`'s namespace, its sshd first among them; False if none ran."""
    require_root()
    with _locked_host(dir, name) as (sim_dir, st, hs, files):
        was_alive = sshd.stop(hs.sshd_pid, files)
        killed = netns.kill_namespace(hs.namespace)
        hs.sshd_pid = None
        Recorder(sim_dir, st).update_host(hs)
    _drop_kept(Path(sim_dir) / INVENTORY_FILE, name)
    return was_alive or killed > 0


def _drop_kept(inventory: Path, name: str) -> None:
    """The lab's connection keeper (labctl.keeper), if one runs, drops its connection to `name`
    now rather than finding it dead at its next use."""
    from labctl.keeper import sock as ks
    from labctl.keeper.client import close_connections

    try:
        close_connections(inventory, name)
    except (ks.KeeperUnavailable, OSError):
        pass


def start_host(dir: Path | str, name: str) -> bool:
    """Start host `name`'s sshd if it is not running; False when it already was."""
    _preflight()
    with _locked_host(dir, name) as (sim_dir, st, hs, files):
        if sshd.is_alive(hs.sshd_pid, files):
            return False
        if not netns.namespace_exists(hs.namespace):
            raise HostError(
                f"The namespace {hs.namespace} of sim host {name} is gone.",
                f"Run `labctl sim up --dir {sim_dir}` to rebuild it.",
            )
        hs.sshd_pid = sshd.start(_plan_of(hs), files)
        Recorder(sim_dir, st).update_host(hs)
        return True


def set_sftp(dir: Path | str, name: str, enabled: bool) -> bool:
    """Restart host `name`'s sshd with or without the sftp subsystem (a minimal install has none).

    For tests of hosts without SFTP; `labctl sim up` puts the subsystem back. The new sshd gets
    fresh mounts (the managed paths only): what a session mounted on that host is gone.
    """
    _preflight()
    with _locked_host(dir, name) as (sim_dir, st, hs, files):
        text = sshd_config(
            hs.address,
            str(files.host_key),
            str(files.pid_file),
            str(sim_dir / AUTHORIZED_KEYS_FILE),
            sftp=enabled,
        )
        if files.config.exists() and files.config.read_text() == text:
            return False
        files.config.write_text(text)
        sshd.stop(hs.sshd_pid, files)
        hs.sshd_pid = sshd.start(_plan_of(hs), files)
        Recorder(sim_dir, st).update_host(hs)
        return True


@contextmanager
def _locked_host(dir: Path | str, name: str) -> Iterator[tuple[Path, SimState, HostState, sshd.HostFiles]]:
    """Host `name` of the sim in `dir`, with the sim's lock held and its state read under it."""
    sim_dir = _resolve_dir(dir)
    _require_state(sim_dir)  # before locking, which would create the directory
    with locked(sim_dir):
        st = _require_state(sim_dir)
        yield sim_dir, st, _host(st, name, sim_dir), sshd.HostFiles(sim_dir, name)


def _plan_of(hs: HostState) -> HostPlan:
    """The plan a recorded host was made from, as far as starting its sshd needs."""
    return HostPlan(
        name=hs.name, namespace=hs.namespace, address=hs.address, veths=(hs.veths[0], hs.veths[1])
    )


def _host(st: SimState, name: str, sim_dir: Path) -> HostState:
    if name not in st.hosts:
        raise InputError(
            f"The sim in {sim_dir} has no host {name}.", f"Its hosts: {', '.join(st.hosts) or 'none'}."
        )
    return st.hosts[name]


def down(dir: Path | str = DEFAULT_DIR, console: Console | None = None) -> list[str]:
    """Remove what the sim in `dir` recorded, and nothing else; returns what was removed.

    Every process in each recorded namespace is killed first (sshd and any session it left).
    On a failure the state keeps what is left, so running `down` again finishes the job.
    """
    require_root()
    sim_dir = _resolve_dir(dir)
    if not state_path(sim_dir).exists():
        return []
    removed: list[str] = []
    with locked(sim_dir):
        st = load(sim_dir)
        if st is None:
            return []
        rec = Recorder(sim_dir, st)
        hosts = list(st.hosts.values())
        failures = _parallel(
            hosts, lambda h: _remove_host(sim_dir, rec, h), "removing hosts", console, key=lambda h: h.name
        )
        removed += [f"host {h.name} ({h.namespace}, {h.address})" for h in hosts if h.name not in st.hosts]
        _raise_failures("Removing hosts", failures, sim_dir)
        if st.iptables_rule:
            if netns.remove_bridge_forwarding(st.bridge):
                removed.append(f"iptables rule FORWARD -i {st.bridge} -o {st.bridge} -j ACCEPT")
            st.iptables_rule = None
            rec.save()
        if st.bridge_created:
            if netns.delete_link(st.bridge):
                removed.append(f"bridge {st.bridge}")
            st.bridge_created = False
            rec.save()
        for rel in st.files:
            _rmtree_inside(sim_dir, sim_dir / rel)
        for sub in ("keys", "hosts"):
            _rmdir_quiet(sim_dir / sub)
        state_path(sim_dir).unlink(missing_ok=True)
        (sim_dir / ".lock").unlink(missing_ok=True)
    _rmdir_quiet(sim_dir)
    return removed


def _rmdir_quiet(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass
