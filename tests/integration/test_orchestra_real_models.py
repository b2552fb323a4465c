"""Real model formats in the orchestra on the simulated lab: a tiny Llama-architecture Hugging Face
model (labctl's server, through transformers) and the same kind of model as a GGUF file
(llama.cpp's llama-server, built CPU-only from pinned sources and cached, tests/llama_cpp_build.py)
served side by side on m5, asked with the official `openai` SDK over the lab network, and a
rotation between them that loses no request. The models are made on irina by `labctl bench
make-model --format hf|gguf` from a seed: no download. The sim has no GPU: the servers run on
m5's CPU while the plan places them on its declared P40s."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from labctl.agent.core import paths
from labctl.agent.orchestra.client import ask_all, load_endpoints
from tests.conftest import labctl, labctl_process, m5_cache, orchestra_lab, run_json, sh
from tests.integration.test_orchestra import NETNS, servers

pytestmark = pytest.mark.integration
HF_A, GGUF, HF_B = "rm-hf-a", "rm-gguf", "rm-hf-b"


def make(inv: Path, name: str, fmt: str, seed: int) -> None:
    labctl(
        "-i", str(inv), "bench", "make-model", "--format", fmt, "--name", name, "--seed", str(seed),
        "--host", "irina", "--python", sys.executable, check=True, timeout=300,
    )  # fmt: skip


def orchestra(binary: Path, **extra: Any) -> dict[str, Any]:
    return {
        "hosts": "m5",
        "warm": 2,
        "rotate": 1,
        "every": "4h",
        "context": 512,
        "server": {
            "python": sys.executable,
            "start_timeout": 240,
            "stop_grace": 10,
            "binaries": {"llama.cpp": str(binary)},
        },
        "models": [
            {"name": HF_A, "format": "hf"},
            {"name": GGUF, "format": "gguf", "engine": "llama.cpp"},
            {"name": HF_B, "format": "hf"},
        ],
        **extra,
    }


@pytest.fixture(scope="module")
def real(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A copy of the lab's inventory with m5's cache mounted, two HF models and a GGUF on irina,
    and an orchestra file serving two of them on m5."""
    from tests.llama_cpp_build import llama_server

    inv = lab.inventory_path
    NETNS.update({h: os.stat(f"/run/netns/{lab.namespace(h)}").st_ino for h in lab.hosts})
    binary = llama_server()
    with m5_cache(lab):
        make(inv, HF_A, "hf", 0)
        make(inv, GGUF, "gguf", 1)
        make(inv, HF_B, "hf", 2)
        copy = orchestra_lab(inv, tmp_path_factory.mktemp("real"), orchestra(binary))
        try:
            yield copy
        finally:
            labctl("-i", str(copy), "orchestra", "stop", timeout=120)
            for pid in servers():
                os.kill(pid, signal.SIGKILL)
            sh(inv, "m5", "rm -rf /var/lib/labctl/orchestra")
            sh(inv, "irina", f"rm -rf /srv/models/{HF_A} /srv/models/{GGUF} /srv/models/{HF_B}")


def test_plan_reads_each_models_format_and_size_from_its_files_on_irina(real: Path) -> None:
    rc, doc = run_json(real, "orchestra", "plan")
    assert rc == 0, doc
    rows = {m["name"]: m for m in doc["models"]}
    assert (rows[HF_A]["format"], rows[HF_A]["engine"], rows[HF_A]["dtype"]) == ("hf", "labctl", "F32")
    assert (rows[GGUF]["format"], rows[GGUF]["engine"]) == ("gguf", "llama.cpp")
    for name in (HF_A, GGUF):
        row = rows[name]
        assert row["source"] == "files on irina" and row["params"] > 100_000 and row["kv_gb"] > 0
        assert row["context"] == 512  # the file's context: 512, within the models' own 512
    # The f16 GGUF holds the same kind of model in about half the bytes of the f32 folder.
    assert rows[GGUF]["weights_gb"] < 0.7 * rows[HF_A]["weights_gb"]
    assert {p["model"] for p in doc["placement"]} == {HF_A, GGUF}


def test_a_gguf_given_to_labctls_server_is_refused_before_any_host_changes(
    real: Path, tmp_path: Path
) -> None:
    import yaml

    book = tmp_path / "orchestra.yaml"
    doc = yaml.safe_load((real.parent / "playbooks" / "orchestra.yaml").read_text())
    doc["models"][1] = {"name": GGUF}  # no format typed, no engine: the files say GGUF
    book.write_text(yaml.safe_dump(doc))
    before = servers()
    proc = labctl("-i", str(real), "orchestra", "start", "-f", str(book), timeout=200)
    assert proc.returncode == 2, proc.stderr
    text = " ".join(proc.stderr.split())
    assert "labctl's server does not serve a GGUF file" in text and "engine llama.cpp" in text
    assert servers() == before


def chat_and_stream(base_url: str, name: str) -> tuple[str, str, str]:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == [name]
    messages = [{"role": "user", "content": "Write a function that adds two numbers."}]
    chat = client.chat.completions.create(model=name, messages=messages, max_tokens=12, temperature=0)  # type: ignore[arg-type]
    assert chat.choices[0].message.role == "assistant" and chat.usage and chat.usage.completion_tokens > 0
    streamed = client.chat.completions.create(
        model=name,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=12,
        temperature=0,
        stream=True,
    )
    parts = [c.choices[0].delta.content or "" for c in streamed if c.choices]
    done = client.completions.create(model=name, prompt="def add(a, b):", max_tokens=8, temperature=0)
    return chat.choices[0].message.content or "", "".join(parts), done.choices[0].text


def endpoints(inv: Path, tmp_path: Path) -> list[Any]:
    """What m5's trainer asks now (its endpoints.json, read by the trainer's client). Read by a
    labctl process of its own: the test's thread reads it while the test runs `rotate`."""
    proc = labctl_process(
        "--json", "-i", str(inv), "exec", "-l", "m5", "--", f"cat {paths.ORCHESTRA_ENDPOINTS}"
    )
    copy = tmp_path / "endpoints.json"
    copy.write_text(json.loads(proc.stdout)["results"][0]["stdout"])
    return load_endpoints(str(copy), environ={})


def test_hf_and_gguf_served_side_by_side_answer_the_openai_sdk_and_rotate_without_a_lost_request(
    real: Path, lab: Any, tmp_path: Path
) -> None:
    rc, doc = run_json(real, "orchestra", "start", timeout=600)
    assert rc == 0, doc
    assert sorted(servers().values()) == [GGUF, HF_A]
    m5 = lab.hosts["m5"]
    urls = {e.name: e.base_url for e in endpoints(real, tmp_path)}
    assert set(urls) == {HF_A, GGUF} and all(u.startswith(f"http://{m5}:") for u in urls.values())
    for name, url in urls.items():
        chat, streamed, text = chat_and_stream(url, name)
        # Greedy: the stream, joined, is the whole answer; each engine applied its chat template.
        assert chat and streamed == chat, (name, chat, streamed)
        assert text

    # A trainer asks the warm set without pause while the GGUF leaves and an HF model joins,
    # then back: every request is answered (by the model asked, or one that stood in).
    stop = threading.Event()
    answered: list[Any] = []

    def trainer() -> None:
        while not stop.is_set():
            answered.extend(ask_all(endpoints(real, tmp_path / "t"), "def f(x):", max_tokens=4))

    (tmp_path / "t").mkdir()
    t = threading.Thread(target=trainer, daemon=True)
    t.start()
    try:
        rc, out = run_json(real, "rotate", "--out", GGUF, "--in", HF_B, timeout=600)
        assert rc == 0, out
        assert [j["model"] for j in out["joined"]] == [HF_B] and sorted(servers().values()) == [HF_A, HF_B]
        rc, back = run_json(real, "rotate", "--out", HF_B, "--in", GGUF, timeout=600)
        assert rc == 0, back
    finally:
        stop.set()
        t.join(timeout=120)
    assert sorted(servers().values()) == [GGUF, HF_A]
    assert len(answered) >= 4 and all(a.ok for a in answered), [a for a in answered if not a.ok]
    assert {a.answered_by for a in answered} >= {HF_A}
