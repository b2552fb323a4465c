"""Remote tiers in the orchestra file: models outside the lab behind the OpenAI-compatible API.
Validated with the file (a key pasted where its variable's name goes is refused and never
echoed), shown by `orchestra plan`, and never contacted: a listener at the tier's address counts
every connection, and there must be none."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import HTTPServer
from pathlib import Path

import pytest

from labctl.documents.validation import DocumentError
from labctl.orchestra.spec import load_orchestra
from tests.conftest import labctl
from tests.unit.test_orchestra_client import Recording
from tests.unit.test_orchestra_plan import GOOD as LIBRARY
from tests.unit.test_playbook_roles import SERVE_ONLY as LAB

SECRET = "sk-proj-Zq9SECRETvalue0123456789"


def orchestra(tmp_path: Path, remote: str) -> Path:
    path = tmp_path / "orchestra.yaml"
    path.write_text(LIBRARY + "remote:\n" + remote)
    return path


@pytest.mark.parametrize(
    ("remote", "where", "words", "never_shown"),
    [
        (
            f"  - {{name: gpt, base_url: https://api.openai.com/v1, model: m, api_key_env: {SECRET}}}\n",
            ":8: remote[0].api_key_env:",
            "not the key itself",
            SECRET,
        ),
        (
            f"  - {{name: gpt, base_url: 'https://me:{SECRET}@api.example.com/v1', model: m}}\n",
            ":8: remote[0].base_url:",
            "user or password",
            SECRET,
        ),
        ("  - {name: gpt, base_url: ftp://files.example.com, model: m}\n", ":8: remote[0].base_url:", "http(s)", None),
        ("  - {name: gpt, base_url: 'https://x.example.com/v1?k=1', model: m}\n", ":8: remote[0].base_url:", "?query", None),
        ("  - {name: gpt, base_url: 'https://x.example.com:port/v1', model: m}\n", ":8: remote[0].base_url:", "http(s)", None),
        ("  - {name: gpt, base_url: https://x.example.com/v1, model: 'a b'}\n", ":8: remote[0].model:", "spaces", None),
        ("  - {name: a, base_url: https://x.example.com/v1, model: m}\n", ":8: remote[0].name:", "already models[0]", None),
        (
            "  - {name: g, base_url: https://x.example.com/v1, model: m}\n"
            "  - {name: g, base_url: https://y.example.com/v1, model: n}\n",
            ":9: remote[1].name:",
            "already remote[0]",
            None,
        ),
        ("  - {name: g, base_url: https://x.example.com/v1, model: m, concurrency: 0}\n", ":8: remote[0].concurrency:", "greater than or equal to 1", None),
        ("  - {name: g, base_url: https://x.example.com/v1, model: m, price_per_mtok: {input: -1}}\n", ":8: remote[0].price_per_mtok.input:", "greater than or equal to 0", None),
        (f"  - {{name: g, base_url: https://x.example.com/v1, model: m, api_key: {SECRET}}}\n", ":8: remote[0].api_key:", "Did you mean 'api_key_env'", SECRET),
        ("  - {name: g, base_url: https://x.example.com/v1, model: m, api: responses}\n", ":8: remote[0].api:", "'completions' or 'chat'", None),
        ("  - {name: g, base_url: https://x.example.com/v1, model: m, max_tokens: 0}\n", ":8: remote[0].max_tokens:", "greater than or equal to 1", None),
        ("  - {name: g, base_url: https://x.example.com/v1, model: m, context: 8}\n", ":8: remote[0].context:", "greater than or equal to 16", None),
    ],
)  # fmt: skip
def test_a_bad_remote_tier_is_named_by_line_and_a_secret_in_it_is_never_repeated(
    tmp_path: Path, remote: str, where: str, words: str, never_shown: str | None
) -> None:
    path = orchestra(tmp_path, remote)
    with pytest.raises(DocumentError) as e:
        load_orchestra(path)
    assert e.value.exit_code == 2
    assert f"{path}{where}" in e.value.message and words in e.value.message, e.value.message
    if never_shown:
        assert never_shown not in e.value.message and never_shown not in e.value.hint


def test_a_remote_tier_keeps_its_fields_and_its_url_without_a_trailing_slash(tmp_path: Path) -> None:
    orch = load_orchestra(
        orchestra(
            tmp_path,
            "  - {name: gpt-4o-mini, base_url: 'https://api.openai.com/v1/', model: gpt-4o-mini,\n"
            "     api_key_env: OPENAI_API_KEY, concurrency: 8, price_per_mtok: {input: 0.15, output: 0.6}}\n"
            "  - {name: lab-vllm, base_url: 'http://10.0.0.9:8000/v1', model: Qwen2.5-Coder-7B,\n"
            "     api: completions, max_tokens: 4096, context: 32768}\n",
        )
    )
    gpt, vllm = orch.remote
    assert (gpt.base_url, gpt.concurrency, gpt.price_per_mtok.output) == ("https://api.openai.com/v1", 8, 0.6)
    # A hosted tier is asked as a chat unless it says otherwise; its limits are not known unless given.
    assert (gpt.api, gpt.max_tokens, gpt.context) == ("chat", None, None)
    assert (vllm.api, vllm.max_tokens, vllm.context) == ("completions", 4096, 32768)
    assert vllm.api_key_env is None and vllm.key_present({}) and vllm.concurrency == 4
    assert not gpt.key_present({}) and not gpt.key_present({"OPENAI_API_KEY": ""})
    assert gpt.key_present({"OPENAI_API_KEY": SECRET})
    assert orch.names == ["a", "b", "c"]  # remote tiers are not part of the library that rotates


@pytest.fixture()
def listener() -> Iterator[tuple[int, list[str]]]:
    """A TCP port on this machine that records every connection made to it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    seen: list[str] = []

    def accept() -> None:
        while True:
            try:
                conn, peer = sock.accept()
            except OSError:
                return
            seen.append(str(peer))
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield int(sock.getsockname()[1]), seen
    finally:
        sock.close()


def test_plan_shows_the_remote_tiers_and_whether_their_key_is_set_never_the_key_or_a_connection(
    tmp_path: Path, listener: tuple[int, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, seen = listener
    (tmp_path / "lab.yaml").write_text(LAB)
    path = orchestra(
        tmp_path,
        f"  - {{name: hosted, base_url: 'http://127.0.0.1:{port}/v1', model: big, api_key_env: LABCTL_TEST_KEY,\n"
        "     price_per_mtok: {input: 0.15, output: 0.6}}\n"
        f"  - {{name: missing, base_url: 'http://127.0.0.1:{port}/v1', model: m, api_key_env: LABCTL_TEST_NONE}}\n",
    )
    monkeypatch.setenv("LABCTL_TEST_KEY", SECRET)
    monkeypatch.setenv("COLUMNS", "200")  # one line per tier: the words checked below stay whole
    monkeypatch.delenv("LABCTL_TEST_NONE", raising=False)
    args = ("-i", str(tmp_path / "lab.yaml"), "orchestra", "plan", "--offline", "-f", str(path))
    proc = labctl("--json", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    remote = json.loads(proc.stdout)["remote"]
    assert [(r["name"], r["model"], r["key_set"]) for r in remote] == [
        ("hosted", "big", True),
        ("missing", "m", False),
    ]
    assert remote[0]["price_per_mtok"] == {"input": 0.15, "output": 0.6}
    human = labctl(*args)
    assert human.returncode == 0, human.stderr
    shown = human.stdout + human.stderr
    assert "$LABCTL_TEST_KEY set here" in shown and "$LABCTL_TEST_NONE not set here" in shown
    for out in (proc.stdout, proc.stderr, human.stdout, human.stderr):
        assert SECRET not in out
    assert seen == []  # plan never contacts a remote tier


def test_orchestra_ask_asks_a_tier_whose_key_is_set_with_that_key_and_names_the_one_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No model is warm on this lab's one host (this machine, read only): the keyed tier, a
    local stand-in for a hosted API, is the one asked."""
    Recording.seen.clear()
    fake = HTTPServer(("127.0.0.1", 0), Recording)
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    try:
        (tmp_path / "lab.yaml").write_text(LAB)
        base = f"http://127.0.0.1:{fake.server_address[1]}/v1"
        path = orchestra(
            tmp_path,
            f"  - {{name: hosted, base_url: '{base}', model: big, api_key_env: LABCTL_TEST_KEY}}\n"
            f"  - {{name: missing, base_url: '{base}', model: m, api_key_env: LABCTL_TEST_NONE}}\n",
        )
        monkeypatch.setenv("LABCTL_TEST_KEY", SECRET)
        monkeypatch.delenv("LABCTL_TEST_NONE", raising=False)
        args = (
            "-i",
            str(tmp_path / "lab.yaml"),
            "orchestra",
            "ask",
            "-f",
            str(path),
            "--max-tokens",
            "5",
            "print(",
        )
        proc = labctl("--json", *args)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        doc = json.loads(proc.stdout)
        assert [(a["name"], a["text"], a["ok"]) for a in doc["answers"]] == [("hosted", "ok", True)]
        assert doc["skipped"] == ["missing"]
        (seen,) = Recording.seen
        assert seen["auth"] == f"Bearer {SECRET}" and seen["body"]["model"] == "big"
        # A remote tier is a chat by default: the prompt goes as the user's message.
        assert seen["body"]["max_tokens"] == 5 and seen["path"] == "/v1/chat/completions"
        assert seen["body"]["messages"] == [{"role": "user", "content": "print("}]
        refused = labctl(*args, "--no-remote")
        assert refused.returncode == 2 and "No model is warm" in refused.stderr
        assert "labctl orchestra start" in refused.stderr
        for out in (proc.stdout, proc.stderr, refused.stdout, refused.stderr):
            assert SECRET not in out
    finally:
        fake.shutdown()
        fake.server_close()
