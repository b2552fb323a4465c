"""Load an inventory file: YAML with positions → validated, defaults merged, paths resolved.

It goes through the documents' one pipeline (labctl.documents.loader): all problems in a file
are collected and reported together, each as `FILE:LINE: FIELD: what is wrong. what to write
instead`, so one edit fixes them all. Each host is validated once, as written (`HostSpec`);
the `Host` it becomes is assembled from those checked values and the checked defaults.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from labctl.documents.loader import Document, open_document
from labctl.documents.validation import DocumentError, Problem, dotted, unknown_key
from labctl.documents.yamlpos import PositionedYaml
from labctl.inventory.model import (
    HOST_NAME_RE,
    Connections,
    ConnectionSettings,
    Defaults,
    Host,
    HostSpec,
    Inventory,
)

TOP_KEYS = {
    "lab": "a name for the lab, e.g. lab: homelab",
    "defaults": "keys merged into every host",
    "hosts": "the machines, a mapping of name to settings",
}
PATH_KEYS = ("ssh_key", "known_hosts")


class InventoryError(DocumentError):
    def __init__(self, path: Path, problems: list[Problem]) -> None:
        super().__init__(
            "inventory",
            path,
            problems,
            "Fix the lines named above and run `labctl inventory validate` again.",
        )


def _resolve(p: Path | None, base_dir: Path) -> Path | None:
    if p is None:
        return None
    p = Path(p).expanduser()
    return p if p.is_absolute() else (base_dir / p)


def load_inventory(path: Path) -> Inventory:
    doc = open_document(
        path,
        "inventory",
        "Pass one with -i/--inventory, set $LABCTL_INVENTORY, or write a starter one with "
        "`labctl init DIR` (DIR/inventory/lab.yaml: run labctl in DIR to leave out -i); "
        "`labctl sim up` writes one for the simulated lab.",
        InventoryError,
    )
    return build_inventory(doc)


def build_inventory(doc: Document) -> Inventory:
    pos, path, problems = doc.pos, doc.path, doc.problems
    data = doc.mapping("the file must be a mapping with keys lab, defaults and hosts", pos.line_of(()))
    for key in data:
        if key not in TOP_KEYS:
            problems.append((pos.line_of((key,)), str(key), unknown_key(key, list(TOP_KEYS))))
    lab = data.get("lab")
    if not isinstance(lab, str) or not lab:
        problems.append(
            (pos.line_of(("lab",)), "lab", f"'lab' is required and must be text. Write {TOP_KEYS['lab']}.")
        )
    elif any(ord(c) < 32 or ord(c) == 127 for c in lab):
        # The name tags processes through their environment, which cannot hold a NUL.
        problems.append(
            (pos.line_of(("lab",)), "lab", f"{lab!r} has a control character. Write {TOP_KEYS['lab']}.")
        )

    defaults: dict[str, Any] = {}
    connections: Connections | None = None
    raw_defaults = data.get("defaults") or {}
    if not isinstance(raw_defaults, dict):
        problems.append(
            (
                pos.line_of(("defaults",)),
                "defaults",
                "must be a mapping of settings, e.g. defaults: {user: root}",
            )
        )
    else:
        checked = doc.check(Defaults, raw_defaults, ("defaults",))
        if checked is not None:
            defaults = _set_values(checked)
            # Not a host's setting: the inventory's keeper reads it (labctl.keeper).
            connections = defaults.pop("connections", None)

    raw_hosts = data.get("hosts")
    hosts: dict[str, Host] = {}
    if not isinstance(raw_hosts, dict) or not raw_hosts:
        problems.append(
            (
                pos.line_of(("hosts",)),
                "hosts",
                "at least one host is required, e.g. hosts: {m5: {address: 192.168.1.10}}",
            )
        )
        raw_hosts = {}
    base_dir = path.parent
    for name, raw in raw_hosts.items():
        name_s = str(name)
        if not HOST_NAME_RE.match(name_s):
            problems.append(
                (
                    pos.line_of(("hosts", name)),
                    f"hosts.{name_s}",
                    "a host name must start with a letter or digit and use letters, digits, '-', '_' or '.'",
                )
            )
            continue
        if not isinstance(raw, dict):
            problems.append(
                (
                    pos.line_of(("hosts", name)),
                    f"hosts.{name_s}",
                    "must be a mapping with at least 'address', e.g. m5: {address: 192.168.1.10}",
                )
            )
            continue
        spec = doc.check(HostSpec, raw, ("hosts", name))
        if spec is None:
            continue
        merged = {**defaults, **_set_values(spec), "name": name_s}
        for key in PATH_KEYS:
            merged[key] = _resolve(merged.get(key), base_dir)
        # Every value was validated just above (or in `defaults`): validating the merge again
        # would check each host twice.
        host = Host.model_construct(**merged)
        key_file = host.ssh_key
        # Only a missing key here; what else is wrong with the file, the transport says before connecting.
        if host.connection == "ssh" and key_file is not None and not os.path.lexists(key_file):
            origin = ("hosts", name, "ssh_key") if "ssh_key" in raw else ("defaults", "ssh_key")
            problems.append(
                (
                    pos.line_of(origin),
                    dotted(origin),
                    f"the key file {key_file} does not exist. Point ssh_key at a private key (paths are relative to the inventory file) or create one with ssh-keygen -t ed25519 -f {key_file}.",
                )
            )
        hosts[name_s] = host

    problems.extend(_cross_checks(hosts, set(map(str, raw_hosts)), pos))
    doc.finish()
    return Inventory(lab=str(lab), path=path, hosts=hosts, connections=connections or Connections())


def _set_values(model: ConnectionSettings) -> dict[str, Any]:
    """The fields of `model` that hold a value (None is "not given": the default applies), as
    the validated objects themselves."""
    return {name: value for name in type(model).model_fields if (value := getattr(model, name)) is not None}


def _cross_checks(hosts: dict[str, Host], declared: set[str], pos: PositionedYaml) -> list[Problem]:
    """Checks that span hosts: unique addresses, cache sources that exist, bonds over real NICs."""
    out: list[Problem] = []

    def problem(loc: tuple[str | int, ...], message: str) -> None:
        out.append((pos.line_of(loc), dotted(loc), message))

    seen: dict[tuple[str, int], str] = {}
    for h in hosts.values():
        if h.connection == "ssh":
            key = (h.address, h.port)
            if key in seen:
                problem(
                    ("hosts", h.name, "address"),
                    f"{h.address}:{h.port} is already host '{seen[key]}'. Give each host its own address or port.",
                )
            seen.setdefault(key, h.name)
        mc = h.model_cache
        if mc is not None and mc.source is not None and mc.source not in hosts:
            # A source that is declared but invalid has its own error already.
            if mc.source not in declared:
                problem(
                    ("hosts", h.name, "model_cache", "source"),
                    f"'{mc.source}' is not a host in this inventory. Name one of: {', '.join(hosts)}.",
                )
        elif mc is not None and mc.source is not None and hosts[mc.source].storage is None:
            problem(
                ("hosts", h.name, "model_cache", "source"),
                f"host '{mc.source}' has no 'storage' section to fill the cache from. "
                "Add storage: {models: /srv/models} to it, or name another source.",
            )
        if h.bond is not None and h.nics:
            names = {n.name for n in h.nics}
            for i, iface in enumerate(h.bond.interfaces):
                if iface not in names:
                    problem(
                        ("hosts", h.name, "bond", "interfaces", i),
                        f"'{iface}' is not one of this host's nics ({', '.join(sorted(names))}). "
                        "Name a NIC listed under nics.",
                    )
    return out
