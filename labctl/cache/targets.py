"""Who holds a model cache, which host stores its models, and where: decided here only.

`labctl cache` (sync, status, evict, verify, pin), `bench model-load` and `bench make-model`
all ask this module, so a host without a model_cache, a cache without a source or a source
without storage is refused the same way everywhere: one paragraph, exit 2.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from labctl.agent.cache.manifest import check_name
from labctl.output.errors import InputError

if TYPE_CHECKING:
    from labctl.inventory.model import Host, Inventory, ModelCache


@dataclass
class Target:
    """A cache host, its model_cache, and the storage host and folder its models come from."""

    host: Host
    cache: ModelCache
    source: Host
    root: str

    @property
    def where(self) -> str:
        return f"{self.host.name}: the cache {self.cache.path}"

    def stored(self, model: str) -> str:
        """`model`'s path on the storage host."""
        return in_folder(self.root, model)

    def cached(self, model: str) -> str:
        """`model`'s path in the cache, once synced."""
        return in_folder(self.cache.path, model)


def in_folder(folder: str, name: str) -> str:
    return f"{folder.rstrip('/')}/{name}"


def check_models(models: Sequence[str], command: str, example: str | None = None) -> list[str]:
    """The model names given to `labctl cache COMMAND`, each checked, duplicates dropped; the
    error's example is that command's own (or `example`, for another command's)."""
    from labctl.agent.core.errors import AgentError

    example = example or f"For example: labctl cache {command} tinylm-1g --host m5."
    out: list[str] = []
    for m in models:
        try:
            check_name(m)
        except AgentError as e:
            raise InputError(f"{e.message}.", example) from None
        if m not in out:
            out.append(m)
    if not out:
        raise InputError("No model named.", example)
    return out


def host_named(inv: Inventory, name: str) -> Host:
    if name not in inv.hosts:
        raise InputError(f"No host '{name}' in {inv.path}.", f"Hosts: {', '.join(inv.hosts)}.")
    return inv.hosts[name]


def has_cache(host: Host) -> bool:
    """A host labctl can fill a RAM cache on (the cache is Linux-only)."""
    return host.model_cache is not None and not host.is_windows


def cache_of(inv: Inventory, host: Host) -> ModelCache:
    if host.model_cache is None:
        with_cache = [h.name for h in inv.hosts.values() if h.model_cache is not None]
        raise InputError(
            f"{host.name} has no model_cache in {inv.path}, so it has no RAM cache to fill.",
            f"Hosts with one: {', '.join(with_cache) or 'none'}. Or add model_cache: "
            "{path: /mnt/model-cache, size_gb: N, source: STORAGE_HOST} to it.",
        )
    return host.model_cache


def library_root(host: Host) -> str:
    """The model folder of a host with storage (the caller checked that it has some)."""
    assert host.storage is not None
    return host.storage.models.rstrip("/") or "/"


def resolve_target(inv: Inventory, name: str) -> Target:
    """The cache host `name`, its cache and its storage host, or a one-paragraph InputError."""
    host = host_named(inv, name)
    if host.is_windows:
        raise InputError(f"{name} runs Windows; the model cache is Linux-only.", "Pick a Linux host.")
    mc = cache_of(inv, host)
    storage_hosts = [h.name for h in inv.hosts.values() if h.storage is not None]
    if not mc.source:
        raise InputError(
            f"{name}'s model_cache has no source: labctl does not know which host to copy models from.",
            f"Add source: HOST to its model_cache (hosts with storage: {', '.join(storage_hosts) or 'none'}).",
        )
    if mc.source not in inv.hosts:
        raise InputError(
            f"{name}'s model_cache.source is '{mc.source}', which is not a host in {inv.path}.",
            f"Hosts with storage: {', '.join(storage_hosts) or 'none'}.",
        )
    source = inv.hosts[mc.source]
    if source.storage is None:
        raise InputError(
            f"{name}'s model_cache.source is {source.name}, which declares no storage in {inv.path}.",
            f"Add storage: {{models: /srv/models}} to {source.name}, or point source at a host with storage "
            f"({', '.join(storage_hosts) or 'none'}).",
        )
    return Target(host, mc, source, library_root(source))


def cache_hosts(inv: Inventory, limit: str | None) -> list[Host]:
    """Hosts with a model_cache among those `limit` selects; an error when there is none."""
    from labctl.inventory.select import select_hosts

    chosen = select_hosts(inv, limit, label="--host")
    hosts = [h for h in chosen if has_cache(h)]
    if not hosts:
        raise InputError(
            f"None of {', '.join(h.name for h in chosen)} has a model_cache in {inv.path}.",
            "Add model_cache: {path, size_gb, source} to a host, or pick one with --host.",
        )
    return hosts


def load_host(inv: Inventory, name: str | None) -> Host:
    """Where `bench model-load --model` loads: the host named, else the first with a model_cache.
    (`--file` with no host loads on `this_machine()`.)"""
    if name:
        return host_named(inv, name)
    for h in inv.hosts.values():
        if has_cache(h):
            return h
    raise InputError(
        f"No host has a model_cache in {inv.path}, so there is no cache to load --model from.",
        "Name the host with --host, or load a file on this machine with --file PATH.",
    )


def this_machine() -> Host:
    """The machine labctl runs on, as a `connection: local` host whose agent runs on this Python."""
    import socket
    import sys

    from labctl.inventory.model import Host

    return Host.model_validate(
        {
            "name": socket.gethostname() or "local",
            "address": "127.0.0.1",
            "connection": "local",
            "python": sys.executable,
        }
    )


def storage_host(inv: Inventory, limit: str | None) -> Host:
    """Where `bench make-model` writes: the first host `limit` selects (default: those with
    storage), each of which must have storage."""
    from labctl.inventory.select import select_hosts

    hosts = (
        select_hosts(inv, limit, label="--host")
        if limit is not None
        else [h for h in inv.hosts.values() if h.storage]
    )
    if not hosts or any(h.storage is None for h in hosts):
        raise InputError(
            f"No storage host to write the model on{f' ({limit} has no storage section)' if limit else ''}.",
            "Give a host with storage: {models: /srv/models} in the inventory, with --host.",
        )
    return hosts[0]
