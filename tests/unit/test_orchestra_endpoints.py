"""Discovery that follows the rotation: the endpoints file a rotation writes on the hosts that
train (labctl/orchestra/endpoints.py, the agent's orch_publish), read back by the trainer's
client (load_endpoints), and a server that stops gracefully finishing what is in flight."""

from __future__ import annotations

import json
import signal
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from labctl.agent import paths
from labctl.agent.errors import AgentError
from labctl.agent.orchestra.client import load_endpoints
from labctl.agent.orchestra.host import publish_command
from labctl.inventory.load import load_inventory
from labctl.orchestra.endpoints import consumers, endpoints_doc
from labctl.orchestra.spec import RemoteTier
from tests.unit.test_orchestra_server import call, in_flight, slow_server

LAB = """\
lab: two
defaults: {connection: local}
hosts:
  gpu1: {address: 10.0.0.5, roles: [train, inference]}
  gpu2: {address: "fd00::7", roles: [inference]}
  trainer: {address: 10.0.0.9, roles: [train]}
  win: {address: 10.0.0.10, roles: [train], os: windows}
"""
TIER = RemoteTier(
    name="hosted", base_url="https://api.example.com/v1", model="big-1", api_key_env="LABCTL_TEST_KEY"
)
OPEN_TIER = RemoteTier(name="lab-vllm", base_url="http://10.0.0.20:8000/v1", model="qwen")


@pytest.fixture()
def inventory(tmp_path: Path) -> Any:
    (tmp_path / "lab.yaml").write_text(LAB)
    return load_inventory(tmp_path / "lab.yaml")


@pytest.fixture()
def endpoints_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "orchestra" / "endpoints.json"
    monkeypatch.setattr(paths, "ORCHESTRA_ENDPOINTS", str(path))
    return path


def test_the_file_goes_to_every_host_that_trains_and_lists_each_warm_model_at_its_hosts_address(
    inventory: Any,
) -> None:
    assert [h.name for h in consumers(inventory)] == ["gpu1", "trainer"]  # not the Windows host
    warm = {
        "gpu2": [{"name": "c", "port": 8103}],
        "gpu1": [{"name": "a", "port": 8101}, {"name": "b", "port": 8102}, {"name": "starting"}],
    }
    doc = endpoints_doc("two", inventory.hosts, warm, [TIER])
    assert doc["lab"] == "two"
    assert [(m["name"], m["model"], m["base_url"], m["host"]) for m in doc["models"]] == [
        ("a", "a", "http://10.0.0.5:8101/v1", "gpu1"),
        ("b", "b", "http://10.0.0.5:8102/v1", "gpu1"),
        ("c", "c", "http://[fd00::7]:8103/v1", "gpu2"),
    ]  # a model without a port yet is not asked
    assert doc["remote"] == [
        {
            "name": "hosted",
            "model": "big-1",
            "base_url": "https://api.example.com/v1",
            "api_key_env": "LABCTL_TEST_KEY",
            "concurrency": 4,
            "timeout_s": 60.0,
            "price_per_mtok": {"input": 0.0, "output": 0.0},
        }
    ]
    draining = endpoints_doc("two", inventory.hosts, warm, [], without={"gpu1": ["b"], "gpu2": ["a"]})
    assert [m["name"] for m in draining["models"]] == ["a", "c"]  # b leaves gpu1; gpu2 has no a


def test_publish_replaces_the_file_atomically_world_readable_and_never_takes_a_key(
    endpoints_file: Path,
) -> None:
    doc = {"lab": "two", "models": [{"name": "a", "model": "a", "base_url": "http://10.0.0.5:8101/v1"}]}
    answer = publish_command({"endpoints": doc})
    assert answer["path"] == str(endpoints_file) and answer["models"] == 1
    written = json.loads(endpoints_file.read_text())
    assert written["models"] == doc["models"] and written["updated"] == answer["updated"]
    assert stat.S_IMODE(endpoints_file.stat().st_mode) == 0o644
    assert [p.name for p in endpoints_file.parent.iterdir()] == ["endpoints.json"]  # no temporary left
    keyed = {
        "models": [],
        "remote": [{"name": "h", "model": "m", "base_url": "https://x/v1", "api_key": "sk-1"}],
    }
    for bad, says in (
        (keyed, "never the key"),
        ({"models": "a"}, "models list"),
        ({"models": [{"name": "a"}]}, "name, base_url and model"),
    ):
        with pytest.raises(AgentError) as e:
            publish_command({"endpoints": bad})
        assert e.value.kind == "bad_args" and says in e.value.message
    assert json.loads(endpoints_file.read_text())["models"] == doc["models"]  # a refusal changes nothing


def test_the_client_reads_the_warm_set_and_the_tiers_whose_key_it_has(
    inventory: Any, endpoints_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    warm = {"gpu1": [{"name": "a", "port": 8101}]}
    publish_command({"endpoints": endpoints_doc("two", inventory.hosts, warm, [TIER, OPEN_TIER])})
    monkeypatch.setenv("LABCTL_ORCHESTRA_ENDPOINTS", str(endpoints_file))
    monkeypatch.delenv("LABCTL_TEST_KEY", raising=False)
    # Without the key the hosted tier is left out; the open one needs none.
    assert [(e.name, e.model, e.api_key) for e in load_endpoints()] == [
        ("a", "a", None),
        ("lab-vllm", "qwen", None),
    ]
    monkeypatch.setenv("LABCTL_TEST_KEY", "sk-test")
    got = load_endpoints()
    assert [(e.name, e.base_url, e.api_key) for e in got] == [
        ("a", "http://10.0.0.5:8101/v1", None),
        ("hosted", "https://api.example.com/v1", "sk-test"),
        ("lab-vllm", "http://10.0.0.20:8000/v1", None),
    ]
    endpoints_file.write_text("[]")
    with pytest.raises(ValueError, match="not an orchestra endpoints file"):
        load_endpoints(str(endpoints_file))
    with pytest.raises(OSError):
        load_endpoints(str(endpoints_file.parent / "missing.json"))


def test_a_server_told_to_stop_finishes_the_request_in_flight_then_exits_0(tmp_path: Path) -> None:
    """The drain on the server's side: SIGTERM mid-request, the answer still comes whole."""
    got: list[tuple[int, Any]] = []
    body = {"model": "slow", "prompt": "q", "max_tokens": 64, "temperature": 0}
    with slow_server(tmp_path, 5, stderr=subprocess.PIPE, text=True) as (proc, port):
        asking = in_flight(port, lambda: got.append(call(port, "POST", "/v1/completions", body)))
        proc.send_signal(signal.SIGTERM)
        asking.join(120)
        _, err = proc.communicate(timeout=60)
    ((code, doc),) = got
    assert code == 200 and doc["usage"]["completion_tokens"] == 64
    assert proc.returncode == 0
    events = [json.loads(line)["event"] for line in err.splitlines() if line.startswith("{")]
    assert events[-2:] == ["stopping", "stopped"]
