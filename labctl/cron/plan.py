"""The playbook `labctl cron install` applies, built as data: on the orchestrator labctl itself,
its launcher, its own SSH key, a copy of the lab (inventory rewritten to that key, pinned host
keys, playbooks) and the job; on every Linux host it drives, that key authorised."""

from __future__ import annotations

import copy
from pathlib import Path, PurePosixPath
from typing import Any

from labctl.agent.core import paths
from labctl.cron.jobs import ORCHESTRA_COPY, Job, companions
from labctl.inventory.model import Host, Inventory
from labctl.output.errors import InputError
from labctl.provision.playbook import Entry, Play, Playbook
from labctl.transport.shell import command_line, quote

ORCHESTRATOR_ROLE = "orchestrator"
BIN = paths.CONTROLLER_DIR + "/bin/labctl"
LIB = paths.CONTROLLER_DIR + "/current/lib"
LAB = paths.CONTROLLER_DIR + "/lab"
INVENTORY = LAB + "/inventory.yaml"
KEY = LAB + "/keys/id_ed25519"
KNOWN_HOSTS = LAB + "/keys/known_hosts"
PLAYBOOKS = LAB + "/playbooks"


def key_mark(orchestrator: str) -> str:
    """The comment of the orchestrator's key: it marks its line in every authorized_keys."""
    return f"labctl-orchestrator@{orchestrator}"


def orchestrator(inv: Inventory, name: str | None = None) -> Host:
    """The host that runs the schedule: --host, else the one host with role orchestrator."""
    if name is not None:
        if name not in inv.hosts:
            raise InputError(
                f"--host {name}: the inventory has no such host.", f"Hosts: {', '.join(inv.hosts)}."
            )
        host = inv.hosts[name]
    else:
        found = [h for h in inv.hosts.values() if h.has_role(ORCHESTRATOR_ROLE)]
        if len(found) != 1:
            what = (
                "No host has"
                if not found
                else f"{len(found)} hosts have ({', '.join(h.name for h in found)})"
            )
            raise InputError(
                f"{what} the role {ORCHESTRATOR_ROLE} in {inv.path}, so it is not clear where the schedule lives.",
                f"Give exactly one host `roles: [{ORCHESTRATOR_ROLE}]` in the inventory, or pass --host NAME.",
            )
        host = found[0]
    if host.is_windows or host.connection != "ssh":
        raise InputError(
            f"{host.name} cannot hold the schedule: labctl's jobs run on a Linux host reached over SSH.",
            "Pass --host with a Linux host of the inventory.",
        )
    return host


def driven_hosts(inv: Inventory) -> list[Host]:
    """The hosts a job on the orchestrator reaches over SSH with its key: the Linux ones."""
    return [h for h in inv.hosts.values() if not h.is_windows and h.connection == "ssh"]


def job_command(job: Job) -> str:
    """The shell command the cron entry runs on the orchestrator."""
    argv = [BIN, "-i", INVENTORY, *job.args]
    if job.waits_for is not None:
        # Blocking (no -n): the run starts once the other job's run, if any, has finished.
        argv = ["flock", f"{paths.LOCK_DIR}/{job.waits_for}.lock", *argv]
    line = command_line(argv)
    if job.output is None:
        return line
    out = quote(job.output)
    tmp = quote(job.output + ".tmp")
    # The snapshot is replaced whole, and the job still exits with labctl's code.
    return f"{line} >{tmp}; rc=$?; mv -f {tmp} {out}; exit $rc"


def launcher(python: str) -> str:
    """CONTROLLER_DIR/bin/labctl: the host's python with the installed release first on its
    path (-I: no user site, no PYTHON* variables, so nothing else on the host shadows it)."""
    return (
        f"#!{python} -I\n"
        "# labctl, as installed by `labctl cron install` (this file is overwritten there).\n"
        "import sys\n\n"
        f"sys.path.insert(0, {LIB!r})\n"
        "from labctl.cli.app import main\n\n"
        "main()\n"
    )


def rewrite_inventory(doc: dict[str, Any]) -> dict[str, Any]:
    """The inventory as the orchestrator reads it: every host reached with the orchestrator's
    own key and the copied known_hosts; host entries otherwise unchanged."""
    out = copy.deepcopy(doc)
    defaults = dict(out.get("defaults") or {})
    defaults["ssh_key"] = KEY
    defaults["known_hosts"] = KNOWN_HOSTS
    out["defaults"] = defaults
    for entry in (out.get("hosts") or {}).values():
        if isinstance(entry, dict):
            entry.pop("ssh_key", None)
            entry.pop("known_hosts", None)
    return out


def known_hosts_copy(hosts: list[Host]) -> str:
    """The pinned host keys of `hosts`' known_hosts files, merged (each line once)."""
    from labctl.agent.core.textedit import text_lines

    lines: list[str] = []
    for f in dict.fromkeys(h.known_hosts for h in hosts if h.known_hosts is not None):
        assert f is not None
        try:
            data = Path(f).read_bytes()
        except OSError as e:
            raise InputError(
                f"Cannot read the pinned host keys {f}: {e.strerror}.",
                "Run `labctl trust` first: the orchestrator needs the same pinned keys.",
            ) from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data[: e.start].count(b"\n") + 1
            raise InputError(
                f"The pinned host keys {f} are not text: line {line} is not UTF-8.",
                f"Fix or delete that line (`sed -i '{line}d' {quote(str(f))}`), then pin that host again with `labctl trust`.",
            ) from None
        # Cut at "\n" only, as ssh reads it: a comment holding U+2028 stays a comment in the copy.
        lines += [line for line in text_lines(text) if line.strip(" \t") and line not in lines]
    return "\n".join(lines) + ("\n" if lines else "")


def playbook_files(inventory_path: Path) -> dict[str, str]:
    """The default playbooks folder (beside the inventory, as labctl/documents/defaults.py finds it)."""
    from labctl.documents.defaults import default_places
    from labctl.documents.validation import path_component

    for folder in default_places(Path("playbooks"), inventory_path):
        if folder.is_dir():
            out: dict[str, str] = {}
            for p in sorted(folder.iterdir()):
                if p.suffix in (".yaml", ".yml") and p.is_file():
                    # Each becomes a file of the same name in the orchestrator's lab copy.
                    path_component(
                        p.name, f"A playbook's file name in {folder}", "site.yaml (rename the file)"
                    )
                    try:
                        out[p.name] = p.read_text()
                    except UnicodeDecodeError:
                        raise InputError(
                            f"The playbook {p} is not UTF-8 text.",
                            f"Save {p} as UTF-8, or move it out of {folder}.",
                        ) from None
            return out
    return {}


def lab_playbooks(inventory_path: Path, orchestra_file: Path | None) -> dict[str, str]:
    """The playbooks of the lab copy: the default folder's, with the lab copy's orchestra file
    (the one the rotate job runs by) replaced by `orchestra_file`'s content, or left out when
    None: installing another job must not swap the file rotate was installed with."""
    out = playbook_files(inventory_path)
    name = PurePosixPath(ORCHESTRA_COPY).name
    out.pop(name, None)
    if orchestra_file is not None:
        out[name] = Path(orchestra_file).read_text()
    return out


def entry(type_name: str, **params: Any) -> Entry:
    return Entry(type_name, params, ["schedule", type_name], None)


def install_playbook(
    job: Job,
    orch: Host,
    hosts: list[Host],
    inventory_doc: dict[str, Any],
    known_hosts: str,
    playbooks: dict[str, str],
    public_key: str | None,
) -> Playbook:
    """Everything `cron install` provisions for `job` but the entry itself (cron_playbook), as
    one playbook of data. `public_key` None: the orchestrator's key does not exist yet
    (--check), so no host can be told to authorise it."""
    import yaml

    mark = key_mark(orch.name)
    on_orch = [
        entry("controller_install", root=paths.CONTROLLER_DIR),
        entry("file", path=BIN, content=launcher(orch.python), mode="0755"),
        entry("ssh_keypair", path=KEY, comment=mark),
        entry(
            "file",
            path=INVENTORY,
            content=yaml.safe_dump(rewrite_inventory(inventory_doc), sort_keys=False),
            mode="0600",
        ),
        entry("file", path=KNOWN_HOSTS, content=known_hosts, mode="0644"),
        *(
            entry("file", path=f"{PLAYBOOKS}/{name}", content=text, mode="0644")
            for name, text in playbooks.items()
        ),
    ]
    plays = [Play(hosts=orch.name, entries=on_orch, name=f"labctl on {orch.name}")]
    if public_key is not None and hosts:
        plays.append(
            Play(
                hosts=",".join(h.name for h in hosts),
                entries=[entry("authorized_key", mark=mark, key=public_key)],
                name=f"{mark} authorised",
            )
        )
    return Playbook(
        path=Path(f"<labctl cron install {job.name}>"), name=f"cron install {job.name}", plays=plays
    )


def cron_playbook(job: Job, schedule: str, orch: Host) -> Playbook:
    """The job's entry on the orchestrator, and its companions' on their own schedules, applied
    once everything they run with is in place."""
    crons = [
        entry("cron", name=j.name, schedule=when, command=job_command(j))
        for j, when in [(job, schedule), *companions(job)]
    ]
    return Playbook(
        path=Path(f"<labctl cron install {job.name}>"),
        name=f"cron {job.name}",
        plays=[Play(orch.name, crons)],
    )


def keypair_playbook(orch: Host) -> Playbook:
    """The orchestrator's key alone: made first, so its public half can be authorised."""
    return Playbook(
        path=Path("<labctl cron install: key>"),
        name="orchestrator key",
        plays=[Play(hosts=orch.name, entries=[entry("ssh_keypair", path=KEY, comment=key_mark(orch.name))])],
    )


def remove_playbook(name: str, orch: Host, hosts: list[Host], purge: bool) -> Playbook:
    """The job gone from the orchestrator; with `purge` also its key's authorisations and the
    installed copy of labctl (key and lab copy included). A known job's companions go with it."""
    from labctl.cron.jobs import JOBS

    names = [name, *(c for c, _ in JOBS[name].companions)] if name in JOBS else [name]
    plays = [Play(hosts=orch.name, entries=[entry("cron", name=n, state="absent") for n in names])]
    if purge:
        plays[0].entries.append(entry("controller_install", root=paths.CONTROLLER_DIR, state="absent"))
        if hosts:
            plays.append(
                Play(
                    hosts=",".join(h.name for h in hosts),
                    entries=[entry("authorized_key", mark=key_mark(orch.name), state="absent")],
                )
            )
    return Playbook(path=Path(f"<labctl cron remove {name}>"), name=f"cron remove {name}", plays=plays)
