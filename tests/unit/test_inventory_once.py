"""Each host of an inventory is validated once: as written (HostSpec), then assembled."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest

from labctl.inventory import model
from labctl.inventory.load import load_inventory


def test_each_host_is_validated_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = tmp_path / "lab.yaml"
    inv.write_text(
        "lab: once\n"
        "defaults: {user: ops, port: 2222}\n"
        "hosts:\n"
        "  a: {address: 10.0.0.1, gpus: [{model: P40, memory_gb: 24}]}\n"
        "  b: {address: 10.0.0.2, connection: local, port: 22}\n"
    )
    checked: list[str] = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(ipaddress, name)

        @staticmethod
        def ip_address(v: str) -> Any:
            checked.append(v)
            return ipaddress.ip_address(v)

    monkeypatch.setattr(model, "ipaddress", Counting())
    lab = load_inventory(inv)
    assert sorted(checked) == ["10.0.0.1", "10.0.0.2"]
    a, b = lab.hosts["a"], lab.hosts["b"]
    assert (a.user, a.port, a.connection, a.gpus[0].model) == ("ops", 2222, "ssh", "P40")
    assert (b.user, b.port, b.connection) == ("ops", 22, "local")
    assert isinstance(a, model.Host) and a.model_fields_set >= {"name", "address", "user", "port"}
