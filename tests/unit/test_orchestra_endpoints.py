"""Discovery that follows the rotation: the endpoints file a rotation writes on the hosts that
train (labctl/orchestra/endpoints.py, the agent's orchestra.publish), read back by the trainer's
client (load_endpoints), and a server that stops gracefully finishing what is in flight."""

from __future__ import annotations

import json
import signal
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from labctl.agent.core import paths
from labctl.agent.core.errors import AgentError
from labctl.agent.orchestra.backend import MAX_TOKENS
from labctl.agent.orchestra.client import Endpoint, check_budget, from_doc, load_endpoints
from labctl.agent.orchestra.host import publish_command
from labctl.documents.validation import DocumentError
from labctl.inventory.load import load_inventory
from labctl.orchestra.endpoints import consumers, endpoints_doc, serving_facts
from labctl.orchestra.rotate import start_args
from labctl.orchestra.spec import RemoteTier, load_orchestra
from labctl.orchestra.steps.publish import publish
from labctl.orchestra.steps.state import Rotation
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
            "api": "chat",
            "max_tokens": None,
            "context": None,
            "share": 1.0,  # every try, no limit: a tier that says nothing is asked as before
            "budget_per_month": None,
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


ORCHESTRA = """\
warm: 3
rotate: 1
context: 2048
server: {command: 'my-server --model {path} --port {port}'}
models:
  - {name: a, size_gb: 1, format: tinylm, engine: labctl}
  - {name: b, size_gb: 4, format: gguf, engine: llama.cpp, context: 8192, timeout_s: 30}
  - {name: c, size_gb: 4, format: hf, engine: vllm, api: chat, timeout_s: 120}
  - {name: d, size_gb: 4}
remote:
  - {name: hosted, base_url: 'https://api.example.com/v1', model: big-1, max_tokens: 16384, context: 128000}
"""
# What modelload.describe read: a's tinylm was made for 64 tokens, b's GGUF for 4096; c's was not read.
FILES: dict[str, dict[str, Any]] = {"a": {"context": 64}, "b": {"context": 4096}}
WARM = {
    "gpu1": [{"name": "a", "port": 8101}, {"name": "b", "port": 8102}],
    "gpu2": [{"name": "c", "port": 8103}, {"name": "d", "port": 8104}],
}


@pytest.fixture()
def orch(tmp_path: Path) -> Any:
    (tmp_path / "orchestra.yaml").write_text(ORCHESTRA)
    return load_orchestra(tmp_path / "orchestra.yaml")


def test_each_model_carries_its_api_timeout_cap_and_served_context_to_the_trainers_client(
    inventory: Any, orch: Any, endpoints_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts = serving_facts(orch, FILES)
    doc = endpoints_doc("two", inventory.hosts, WARM, orch.remote, facts=facts)
    keys = ("name", "api", "timeout_s", "engine", "max_tokens", "context")
    assert [tuple(m[k] for k in keys) for m in doc["models"]] == [
        ("a", "completions", 60.0, "labctl", MAX_TOKENS, 64),  # labctl's server: its cap, the model's own
        ("b", "completions", 30.0, "llama.cpp", None, 4096),  # its context: 8192, capped at the file's
        ("c", "chat", 120.0, "vllm", None, 2048),  # the orchestra's context: the files were not read
        ("d", "completions", 60.0, "command", None, None),  # a template of the user's: not known
    ]
    # The context is the one each server is started with.
    assert "-c 4096 " in start_args(orch, "b", 0, FILES["b"])["command"]
    assert "--max-model-len 2048" in start_args(orch, "c", 0, None)["command"]
    (hosted,) = doc["remote"]
    assert (hosted["api"], hosted["max_tokens"], hosted["context"]) == ("chat", 16384, 128000)
    publish_command({"endpoints": doc})
    got = load_endpoints(str(endpoints_file), {})
    assert [(e.name, e.api, e.timeout_s, e.max_tokens, e.context, e.engine) for e in got] == [
        ("a", "completions", 60.0, 256, 64, "labctl"),
        ("b", "completions", 30.0, None, 4096, "llama.cpp"),
        ("c", "chat", 120.0, None, 2048, "vllm"),
        ("d", "completions", 60.0, None, None, "command"),
        ("hosted", "chat", 60.0, 16384, 128000, None),
    ]


def test_a_file_without_the_new_fields_is_read_with_the_orchestra_files_defaults(inventory: Any) -> None:
    """What an older labctl published, or `orchestra ask` builds without facts: each warm model a
    completion with the client's timeout, each remote tier a chat, no budget known."""
    doc = endpoints_doc("two", inventory.hosts, {"gpu1": [{"name": "a", "port": 8101}]}, [OPEN_TIER])
    assert doc["models"][0]["api"] == "completions" and "context" not in doc["models"][0]
    for m in doc["models"] + doc["remote"]:
        for key in ("api", "max_tokens", "context"):
            m.pop(key, None)
    a, tier = from_doc(doc, {})
    assert (a.api, a.timeout_s, a.max_tokens, a.context, a.engine) == ("completions", 60.0, None, None, None)
    assert (tier.api, tier.max_tokens, tier.context) == ("chat", None, None)
    assert check_budget([a, tier], 10_000, 10_000) == []  # nothing known, nothing claimed


def test_the_rotation_publishes_each_models_facts(
    inventory: Any, orch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """steps.publish: the document it sends every host that trains carries serving_facts."""
    import labctl.orchestra.steps.publish as publish_step

    sent: list[dict[str, Any]] = []

    def call_agent(run: Any, command: str, args: dict[str, Any], **kw: Any) -> dict[str, Any]:
        assert command == "orchestra.publish"
        sent.append(args["endpoints"])
        return {}

    monkeypatch.setattr(publish_step, "call_agent", call_agent)
    monkeypatch.setattr(
        publish_step, "fan_out", lambda ctx, hosts, step, **kw: [step(SimpleNamespace(host=h)) for h in hosts]
    )
    ex = object.__new__(Rotation)
    ex.ctx = SimpleNamespace(inventory=inventory)
    ex.orch, ex.files, ex.warm = orch, FILES, WARM
    ex.hosts = {n: inventory.hosts[n] for n in WARM}
    ex.consumers = consumers(inventory)
    ex.result = SimpleNamespace(published=[])
    publish(ex, "joined")
    assert len(sent) == 2  # gpu1 and trainer
    assert sent[0] == endpoints_doc("two", ex.hosts, WARM, orch.remote, facts=serving_facts(orch, FILES))
    assert [m["context"] for m in sent[0]["models"]] == [64, 4096, 2048, None]


def test_check_budget_names_the_model_and_the_fix(orch: Any, inventory: Any) -> None:
    doc = endpoints_doc("two", inventory.hosts, WARM, orch.remote, facts=serving_facts(orch, FILES))
    endpoints = from_doc(doc, {})
    assert check_budget(endpoints, 40, 512) == [
        "rl.answer_tokens 512 is above a's cap 256 (labctl's server): set rl.answer_tokens <= 256",
        "the prompt (about 40 tokens) and rl.answer_tokens 512 are above a's context of 64 (labctl's server): "
        "set rl.answer_tokens <= 24, or take a out of the orchestra file's models (it serves the context it "
        "was made with)",
    ]
    assert check_budget(endpoints, 40, 24) == []  # 40 + 24 fills a's 64 exactly
    # c is a chat: its template's tokens count beside the prompt's.
    long = check_budget(endpoints, 2000, 30)
    assert [p.split(" ", 1)[0] for p in long] == ["the", "the"] and "a's context of 64" in long[0]
    assert long[1] == (
        "the prompt (about 2064 tokens) fills c's context of 2048 (vLLM): shorten it (fewer "
        "rl.context_tokens), or give c a longer context: in the orchestra file (up to what it was trained for)"
    )
    small = Endpoint("tier", "https://api.example.com/v1", "m", api="chat", max_tokens=100, context=1000)
    assert check_budget([small], 900, 200) == [
        "rl.answer_tokens 200 is above tier's cap 100 (a remote tier): set rl.answer_tokens <= 100",
        "the prompt (about 964 tokens) and rl.answer_tokens 200 are above tier's context of 1000 (a remote "
        "tier): set rl.answer_tokens <= 36, or take tier out of the orchestra file's remote tiers",
    ]


@pytest.mark.parametrize(
    ("entry", "where", "words"),
    [
        ("{name: a, size_gb: 1, format: tinylm, api: chat}", ":4: models[0]:", "no chat template"),
        ("{name: a, size_gb: 1, api: responses}", ":4: models[0].api:", "'completions' or 'chat'"),
        ("{name: a, size_gb: 1, timeout_s: 0}", ":4: models[0].timeout_s:", "greater than 0"),
    ],
)
def test_a_models_api_and_timeout_are_checked_with_the_file(
    tmp_path: Path, entry: str, where: str, words: str
) -> None:
    path = tmp_path / "orchestra.yaml"
    path.write_text(f"warm: 2\nrotate: 1\nmodels:\n  - {entry}\n  - {{name: b, size_gb: 1}}\n")
    with pytest.raises(DocumentError) as e:
        load_orchestra(path)
    assert f"{path}{where}" in e.value.message and words in e.value.message, e.value.message
