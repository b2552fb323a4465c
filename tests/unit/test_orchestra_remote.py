"""Remote tiers in the orchestra file: models outside the lab behind the OpenAI-compatible API.
Validated with the file (a key pasted where its variable's name goes is refused and never
echoed), shown by `orchestra plan`, and never contacted: a listener at the tier's address counts
every connection, and there must be none."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import HTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from labctl.agent.orchestra.client import ask_all, from_doc, load_endpoints
from labctl.agent.orchestra.spend import month_of
from labctl.agent.train.phase3 import Phase3
from labctl.agent.train.settings import resolve_rl
from labctl.documents.validation import DocumentError
from labctl.orchestra.endpoints import endpoints_doc
from labctl.orchestra.spec import load_orchestra
from tests.conftest import labctl
from tests.unit.test_orchestra_client import FakeApi, Recording
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
        ("  - {name: g, base_url: https://x.example.com/v1, model: m, share: 0}\n", ":8: remote[0].share:", "above 0 and at most 1 (0.05: about one try in twenty", None),
        ("  - {name: g, base_url: https://x.example.com/v1, model: m, share: 5}\n", ":8: remote[0].share:", "above 0 and at most 1", None),
        ("  - {name: g, base_url: https://x.example.com/v1, model: m, share: 5%}\n", ":8: remote[0].share:", "valid number", None),
        ("  - {name: g, base_url: https://x.example.com/v1, model: m, share: true}\n", ":8: remote[0].share:", "yes/no value", None),
        ("  - {name: g, base_url: https://x.example.com/v1, model: m, budget_per_month: 0, price_per_mtok: {input: 1}}\n", ":8: remote[0].budget_per_month:", "dollars a month above 0", None),
        ("  - {name: g, base_url: https://x.example.com/v1, model: m, budget_per_month: -50, price_per_mtok: {input: 1}}\n", ":8: remote[0].budget_per_month:", "dollars a month above 0", None),
        ("  - {name: g, base_url: https://x.example.com/v1, model: m, budget_per_month: 50}\n", ":8: remote[0]:", "budget_per_month needs price_per_mtok", None),
        ("  - {name: g, base_url: https://x.example.com/v1, model: m, budget: 50}\n", ":8: remote[0].budget:", "unknown key 'budget'. Keys allowed here: ", None),
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
    assert (gpt.share, gpt.budget_per_month) == (1.0, None)  # every try, no limit: as before


def test_a_tiers_share_and_budget_reach_the_trainers_endpoints_through_the_endpoints_file(
    tmp_path: Path,
) -> None:
    orch = load_orchestra(
        orchestra(
            tmp_path,
            "  - {name: premium, base_url: 'https://api.example.com/v1', model: big, api_key_env: LABCTL_TEST_KEY,\n"
            "     price_per_mtok: {input: 2.5, output: 10}, share: 0.05, budget_per_month: 75}\n"
            "  - {name: open, base_url: 'http://10.0.0.9:8000/v1', model: m}\n",
        )
    )
    premium = orch.remote[0]
    assert premium.as_dict({})["share"] == 0.05 and premium.as_dict({})["budget_per_month"] == 75
    path = tmp_path / "endpoints.json"
    path.write_text(json.dumps(endpoints_doc("lab", {}, {}, orch.remote)))  # as orchestra.publish writes it
    hosted, plain = load_endpoints(str(path), {"LABCTL_TEST_KEY": SECRET})
    assert (hosted.name, hosted.remote, hosted.share, hosted.budget_per_month) == (
        "premium",
        True,
        0.05,
        75.0,
    )
    assert hosted.price_per_mtok == {"input": 2.5, "output": 10.0}
    assert (plain.remote, plain.share, plain.budget_per_month) == (True, 1.0, None)
    # A document an older labctl wrote has neither: every try, no limit.
    doc = json.loads(path.read_text())
    for r in doc["remote"]:
        del r["share"], r["budget_per_month"]
    assert [(e.share, e.budget_per_month) for e in from_doc(doc, {"LABCTL_TEST_KEY": SECRET})] == [
        (1.0, None),
        (1.0, None),
    ]
    doc["remote"][0]["share"] = 0
    with pytest.raises(ValueError, match="premium: share must be above 0 and at most 1"):
        from_doc(doc, {"LABCTL_TEST_KEY": SECRET})
    doc["remote"][0].update(share=0.5, budget_per_month="75")
    with pytest.raises(ValueError, match="premium: budget_per_month is '75', not a number of dollars"):
        from_doc(doc, {"LABCTL_TEST_KEY": SECRET})


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
        "     price_per_mtok: {input: 0.15, output: 0.6}, share: 0.05, budget_per_month: 75}\n"
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
    assert (remote[0]["share"], remote[0]["budget_per_month"]) == (0.05, 75)
    human = labctl(*args)
    assert human.returncode == 0, human.stderr
    shown = human.stdout + human.stderr
    assert "$LABCTL_TEST_KEY set here" in shown and "$LABCTL_TEST_NONE not set here" in shown
    assert "0.05" in shown and "no limit" in shown  # hosted's share; missing has no budget
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


class Priced(FakeApi):
    """A hosted API and a warm model on one port: each answer reports 100 prompt and 50 completion
    tokens, and every request is counted by the model it names."""

    asked: ClassVar[dict[str, int]] = {}

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Priced.asked[body["model"]] = Priced.asked.get(body["model"], 0) + 1
        usage = {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150}
        if self.path.endswith("/chat/completions"):
            message = {"role": "assistant", "content": "print(1)"}
            self.answer({"choices": [{"message": message, "finish_reason": "stop"}], "usage": usage})
        else:
            self.answer({"choices": [{"text": "print(1)", "finish_reason": "stop"}]})


@pytest.fixture()
def priced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Phase 3 against the stand-in, through the endpoints file as a rotation writes it: a warm
    model and the remote tier `remote` gives; this host's ledger in tmp_path."""
    Priced.asked.clear()
    fake = HTTPServer(("127.0.0.1", 0), Priced)
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    monkeypatch.setenv("LABCTL_TEST_KEY", SECRET)
    monkeypatch.setenv("LABCTL_REMOTE_SPEND", str(tmp_path / "spend"))
    port = fake.server_address[1]

    def run(remote: str) -> Phase3:
        orch = load_orchestra(
            orchestra(
                tmp_path,
                f"  - {{name: premium, base_url: 'http://127.0.0.1:{port}/v1', model: big, {remote}}}\n",
            )
        )
        hosts = {"h": SimpleNamespace(address="127.0.0.1")}
        doc = endpoints_doc("lab", hosts, {"h": [{"name": "warm-a", "port": port}]}, orch.remote)  # type: ignore[arg-type]
        path = tmp_path / "endpoints.json"
        path.write_text(json.dumps(doc))
        rl = resolve_rl({"tasks_per_step": 1, "group_size": 1, "answer_tokens": 16, "max_unjudged_steps": 0})

        def judge(programs: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [{"lang": "python", "passed": 1, "total": 1, "tests": [{"exit_code": 0, "timed_out": False}]}
                    for _ in programs]  # fmt: skip

        return Phase3(rl or {}, endpoints=lambda: load_endpoints(str(path)), ask=ask_all, run=judge)

    try:
        yield run
    finally:
        fake.shutdown()
        fake.server_close()


def test_a_tier_past_its_months_budget_is_not_asked_again_and_the_step_says_why(
    priced: Any, tmp_path: Path
) -> None:
    """$1000 and $2000 per million tokens: each answer of 100 + 50 tokens costs $0.20, so a budget
    of $0.50 is passed by the third answer, and no fourth request is made, in this run or the next."""
    tier = "api_key_env: LABCTL_TEST_KEY, price_per_mtok: {input: 1000, output: 2000}, budget_per_month: 0.5"
    p3 = priced(tier)
    events = []
    for step in range(1, 6):
        p3.rollouts(step, lambda p, n: [97] * n, 64)
        events.append(p3.window.flush())
    assert Priced.asked == {"big": 3, "warm-a": 5}
    month = month_of(time.time())
    assert [e["remote_spend_usd"] for e in events] == [{"premium": 0.2}] * 3 + [{}] * 2
    assert [e["remote_asked"] for e in events] == [{"premium": 1}] * 3 + [{}] * 2
    assert [e["remote_skipped"] for e in events[:3]] == [{}] * 3
    for e in events[3:]:
        assert e["remote_skipped"] == {"premium": f"budget 0.5 reached (0.60 spent in {month})"}
        assert e["tries_judged"] == 1  # the warm model still answers: the step goes on without the tier
    ledger = json.loads((tmp_path / "spend" / month / "premium.json").read_text())
    assert ledger["usd"] == pytest.approx(0.6) and ledger["answers"] == 3
    assert (ledger["prompt_tokens"], ledger["completion_tokens"], ledger["budget_per_month"]) == (
        300,
        150,
        0.5,
    )
    # The next run on this host finds the month's spend and asks the tier no more.
    again = priced(tier)
    again.rollouts(1, lambda p, n: [97] * n, 64)
    assert Priced.asked == {"big": 3, "warm-a": 6}
    assert "budget 0.5 reached" in again.window.flush()["remote_skipped"]["premium"]


def test_a_tier_with_a_share_is_asked_for_that_part_of_the_tries_the_same_ones_in_each_run(
    priced: Any,
) -> None:
    steps = 40
    counts = []
    for _ in range(2):
        Priced.asked.clear()
        p3 = priced("share: 0.25")
        asked_at = []
        for step in range(1, steps + 1):
            p3.rollouts(step, lambda p, n: [97] * n, 64)
            if p3.window.flush()["remote_asked"]:
                asked_at.append(step)
        counts.append((Priced.asked.get("big", 0), asked_at))
    (n, first), (m, second) = counts
    assert 3 <= n <= 20 and n == len(first), counts  # about a quarter of 40, never all or none
    assert (m, second) == (n, first)  # a hash of the try's name: the same tries each run
    assert Priced.asked["warm-a"] == steps  # the warm set answers every try


def test_the_shipped_orchestra_files_remote_tier_example_loads_as_written(tmp_path: Path) -> None:
    shipped = (Path(__file__).resolve().parents[2] / "playbooks" / "orchestra.yaml").read_text()
    head, example = shipped.split("# remote:\n")
    path = tmp_path / "orchestra.yaml"
    path.write_text(head + "remote:\n" + "".join(line[2:] + "\n" for line in example.splitlines()))
    tiers = {r.name: r for r in load_orchestra(path).remote}
    assert (tiers["gpt-4o"].share, tiers["gpt-4o"].budget_per_month) == (0.05, 75)
    assert (tiers["gpt-4o-mini"].share, tiers["gpt-4o-mini"].budget_per_month) == (1.0, None)
