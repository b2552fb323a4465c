"""`labctl doctor` on the simulated lab, over real SSH: the sim has no GPUs, so every declared
GPU must fail with its fix while what the hosts really have passes; `--tier dev` must name
exactly the figures of seed 003 §1.1 that no sim host reaches, worked out here from the
hosts' own facts."""

from __future__ import annotations

from typing import Any

import pytest

from labctl.facts.compare import GIB, compare_declared
from labctl.inventory.load import load_inventory
from labctl.netbench.plan import host_link
from tests.conftest import run_json

pytestmark = pytest.mark.integration


def _lines(doc: dict[str, Any], check: str, host: str | None = None) -> list[dict[str, Any]]:
    return [x for x in doc["lines"] if x["check"] == check and (host is None or x["host"] == host)]


def _dev_missing(inv: Any, facts: dict[str, dict[str, Any]]) -> set[str]:
    """The figures of seed 003's dev tier that no host's facts reach, independently of doctor."""
    from labctl.doctor.tiers import SHORTFALL, TIERS

    t = TIERS["dev"]
    met = {"GPUs": False, "CPU cores": False, "RAM": False, "storage": False, "network": False}
    for name, f in facts.items():
        gpus = [g["memory_total_bytes"] / GIB for g in f.get("gpus") or [] if g.get("memory_total_bytes")]
        met["GPUs"] |= sum(m >= t.gpu_memory_gb * (1 - SHORTFALL) for m in gpus) >= t.gpus
        cores = f["cpu"].get("physical_cores") or f["cpu"]["logical_cpus"]
        met["CPU cores"] |= cores >= t.cpu_cores
        met["RAM"] |= f["memory"]["total_bytes"] / GIB >= t.ram_gb * (1 - SHORTFALL)
        disk = sum(d["size_bytes"] or 0 for d in f["disks"] if not d.get("removable")) / 1e12
        met["storage"] |= disk >= t.storage_tb * (1 - SHORTFALL)
        met["network"] |= (host_link(inv.host(name), f).mbps or 0) >= t.network_mbps
    return {k for k, ok in met.items() if not ok}


def test_doctor_fails_declared_missing_gpus_passes_what_is_there_and_lists_the_dev_tier_gaps(
    lab: Any,
) -> None:
    inv_path = lab.inventory_path
    inv = load_inventory(inv_path)
    rc, facts_doc = run_json(inv_path, "facts")
    facts = {r["host"]: r["facts"] for r in facts_doc["results"] if r["status"] == "ok"}
    assert facts, facts_doc

    rc, doc = run_json(inv_path, "doctor", "--tier", "dev", timeout=180)
    assert rc == 1 and doc["tier"] == "dev"

    for name, f in facts.items():
        host = inv.host(name)
        assert _lines(doc, "reachable", name)[0]["status"] == "pass"
        assert _lines(doc, "host key", name)[0]["status"] == "pass"
        assert [x["status"] for x in _lines(doc, "clock skew", name)] == ["pass"]
        missing = compare_declared([g.model_dump() for g in host.gpus], None, f)
        gpu_lines = _lines(doc, "GPUs declared", name)
        # each sentence facts.compare makes about this host is one failing line with its fix.
        assert sorted(x["found"] for x in gpu_lines if x["status"] == "fail") == sorted(missing)
        for x in gpu_lines:
            if x["status"] == "fail":
                assert "NVIDIA driver" in x["fix"] or "inventory" in x["fix"], x
        # The GPUs really there (none on the sim) pass, one line each.
        assert len([x for x in _lines(doc, "GPU", name) if x["status"] == "pass"]) == len(f["gpus"])
        for x in _lines(doc, "NIC", name):
            assert x["status"] == "pass", x

    # The 1-second bench network between two hosts: it measured, over the sim's shaped link.
    (bw,) = _lines(doc, "bandwidth")
    (lat,) = _lines(doc, "latency")
    assert bw["status"] in ("pass", "warn") and "Mbit/s" in bw["found"], bw
    # Its verdict depends on this machine's load; that it was measured does not.
    assert lat["status"] in ("pass", "warn") and float(lat["found"].split(": ")[1].split(" ms ")[0]) > 0, lat

    tier = {x["check"].split(": ", 1)[1]: x for x in doc["lines"] if x["check"].startswith("tier dev: ")}
    assert set(tier) == {"GPUs", "CPU cores", "RAM", "storage", "network"}
    failing = {k for k, x in tier.items() if x["status"] == "fail"}
    assert failing == _dev_missing(inv, facts)
    for k in failing:
        assert tier[k]["fix"].startswith("missing to reach development"), tier[k]
        assert "a development node" in tier[k]["found"], tier[k]


def test_doctor_rejects_an_unknown_tier_before_touching_a_host(lab: Any) -> None:
    rc, doc = run_json(lab.inventory_path, "doctor", "--tier", "huge")
    assert rc == 2 and "--tier 'huge'" in doc["error"] and "dev, research, prod" in doc["hint"]
