"""Where the cache's source server listens: the storage host's inventory address, never loopback."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import agent_server


def test_a_storage_host_whose_name_resolves_to_loopback_serves_on_every_address(tmp_path: Path) -> None:
    # "localhost" stands for a host whose own name resolves to 127.0.1.1 on itself (Debian's
    # /etc/hosts): a source server there would listen where the pulling host can never connect.
    served = {"root": str(tmp_path), "models": [], "idle_timeout": 30}
    with agent_server("cache.serve", {**served, "bind": "localhost"}) as (info, _proc):
        assert info["address"] == "0.0.0.0"
    # An address given as such is taken as it is.
    with agent_server("cache.serve", {**served, "bind": "127.0.0.1"}) as (info, _proc):
        assert info["address"] == "127.0.0.1"
