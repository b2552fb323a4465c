"""The sandbox service (`labctl sandbox serve`) on the real dockerd of this machine: in-process
for what one batch does, and on the simulated lab for the token's trip to the training host."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.agent.core import paths
from labctl.agent.sandbox.client import Sandbox, SandboxError, load_service
from labctl.agent.sandbox.service import Server, Service
from labctl.sandbox.api import lang_spec
from labctl.sandbox.limits import Limits
from tests.conftest import ON_THIS_MACHINE, run_json, sh

pytestmark = [pytest.mark.integration, ON_THIS_MACHINE]

TOKEN = "t0ken-for-the-tests-only-0123456789"


@pytest.fixture(scope="module")
def service(docker_images: dict[str, Any]) -> Iterator[tuple[Service, str]]:
    """python and c served on 127.0.0.1, plus go, whose image is never built here."""
    limits = Limits()
    langs = {lang: lang_spec(lang, limits) for lang in ("python", "c", "go")}
    svc = Service(langs, limits.as_dict(), TOKEN.encode(), pool=2, concurrency=4, lab="sandbox-service-test")
    httpd = Server("127.0.0.1", 0, svc)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    svc.warm()
    try:
        yield svc, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        svc.close()


def post(url: str, doc: Any, token: str | None = TOKEN, scheme: str = "Bearer") -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"{scheme} {token}"
    req = urllib.request.Request(url + "/v1/batch", json.dumps(doc).encode(), headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def prog(source: str, *tests: tuple[str, str | None], lang: str = "python", **kw: Any) -> dict[str, Any]:
    return {"lang": lang, "source": source, "tests": [{"stdin": i, "expect": o} for i, o in tests], **kw}


REVERSE = prog("print(input()[::-1])", ("abc\n", "cba"), ("xy\n", "yx"), ("q\n", "not q"))
ADD_C = prog(
    '#include <stdio.h>\nint main(){int a,b;scanf("%d %d",&a,&b);printf("%d\\n",a+b);return 0;}',
    ("1 2", "3"),
    ("40 2", "42"),
    lang="c",
)


def test_a_request_without_the_token_runs_nothing(service: tuple[Service, str]) -> None:
    svc, url = service
    before = svc.health()["served"]
    for token, scheme in (
        (None, "Bearer"),
        ("wrong-token-of-the-same-length-00000", "Bearer"),
        (TOKEN, "Basic"),
    ):
        code, doc = post(url, {"programs": [REVERSE]}, token, scheme)
        assert code == 401 and "Bearer" in doc["error"], (token, scheme, doc)
    # Even a path that does not exist answers 401 first: no route is shown to a caller without it.
    req = urllib.request.Request(url + "/v1/other", b"{}", {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 401
    assert svc.health()["served"] == before  # not one program ran


def test_a_batch_runs_each_program_against_its_tests_and_answers_in_order(
    service: tuple[Service, str],
) -> None:
    _, url = service
    slow = prog(
        "import sys\nif input() == '1':\n    while True: pass\nprint('ok')",
        ("1\n", None),
        ("2\n", "ok"),
        timeout=1,
    )
    code, doc = post(url, {"programs": [REVERSE, ADD_C, slow, REVERSE]})
    assert code == 200, doc
    rev, add, loop, rev2 = doc["results"]
    assert [t["ok"] for t in rev["tests"]] == [True, True, False] and (rev["passed"], rev["total"]) == (2, 3)
    assert [t["stdout"] for t in rev["tests"]] == ["cba\n", "yx\n", "q\n"]
    assert rev2["tests"] == [
        dict(t, wall_ms=t2["wall_ms"]) for t, t2 in zip(rev["tests"], rev2["tests"], strict=True)
    ]
    assert (
        add["lang"] == "c" and add["passed"] == 2 and [t["stdout"] for t in add["tests"]] == ["3\n", "42\n"]
    )
    # A test that runs past its limit is killed and fails alone: the next test still runs.
    assert (
        loop["tests"][0]["timed_out"] and loop["tests"][0]["exit_code"] == 137 and not loop["tests"][0]["ok"]
    )
    assert 1000 <= loop["tests"][0]["wall_ms"] < 5000
    assert loop["tests"][1]["ok"] and not loop["tests"][1]["timed_out"]


def test_what_the_batch_cannot_run_is_named(service: tuple[Service, str]) -> None:
    _, url = service
    for bad, says in (
        ({"programs": [dict(REVERSE, lang="cobol")]}, "programs[0].lang 'cobol' is not served here"),
        ({"programs": [dict(REVERSE, tests=[])]}, "programs[0].tests must be a list of 1 to 64"),
        ({"programs": [REVERSE, dict(REVERSE, timeout=3600)]}, "programs[1].timeout must be seconds"),
        ({"programs": "all"}, '{"programs": [...]}'),
    ):
        code, doc = post(url, bad)
        assert code == 400 and says in doc["error"], (bad, doc)
    # go is configured but its image was never built here: its program fails alone, saying so.
    code, doc = post(url, {"programs": [prog("package main", ("", None), lang="go"), REVERSE]})
    assert code == 200, doc
    go, rev = doc["results"]
    assert "no image" in go["error"] and "labctl-sandbox/go" in go["error"] and go["passed"] == 0
    assert rev["passed"] == 2


LEFTOVER = """
import os, subprocess
if input() == 'plant':
    # escapes its process group and session: only the runner's sweep can find it
    subprocess.Popen(['sh', '-c', 'while :; do echo x >> /tmp/spy; sleep 0.05; done'], start_new_session=True)
    open('/tmp/mark', 'w').write('left')
    print('planted')
else:
    others = [p for p in os.listdir('/proc') if p.isdigit() and p != str(os.getpid())
              and b'/tmp/spy' in open(f'/proc/{p}/cmdline', 'rb').read()]
    print('clean' if not others and not os.listdir('/tmp') else f'dirty {others} {os.listdir("/tmp")}')
"""


def test_a_tests_leftovers_are_gone_before_the_next_test_starts(service: tuple[Service, str]) -> None:
    _, url = service
    code, doc = post(
        url, {"programs": [prog(LEFTOVER, ("plant\n", "planted"), ("look\n", "clean"), ("look\n", "clean"))]}
    )
    assert code == 200, doc
    (r,) = doc["results"]
    assert [t["stdout"] for t in r["tests"]] == ["planted\n", "clean\n", "clean\n"], r


def test_a_test_that_kills_the_runner_fails_the_rest_and_never_passes_them(
    service: tuple[Service, str],
) -> None:
    _, url = service
    killer = prog("import os, signal\nos.kill(-1, signal.SIGKILL)", ("", None), ("", None), ("", None))
    code, doc = post(url, {"programs": [killer, REVERSE]})
    assert code == 200, doc
    k, rev = doc["results"]
    assert k["passed"] == 0 and all(not t["ok"] for t in k["tests"]), k
    assert any("ended early" in t["stderr"] for t in k["tests"]), k
    assert rev["passed"] == 2  # the program beside it, in its own container, is untouched


SNOOP = """
import os
mine = set(os.listdir('/tmp')) | set(os.listdir('/work'))
procs = [open(f'/proc/{p}/cmdline', 'rb').read() for p in os.listdir('/proc') if p.isdigit()]
print('seen' if 'secret' in mine or any(b'plant-' in c for c in procs) else 'alone')
"""
PLANT = """
import subprocess, time
open('/tmp/secret', 'w').write('x'); open('/work/secret', 'w').write('x')
subprocess.Popen(['sh', '-c', 'sleep 30; :', 'plant-proc'], start_new_session=True)
time.sleep(1.5)
print('planted')
"""


def test_programs_of_one_batch_never_see_each_other(service: tuple[Service, str]) -> None:
    _, url = service
    programs = [prog(PLANT, ("", "planted"))] + [prog(SNOOP, ("", "alone"))] * 6
    code, doc = post(url, {"programs": programs})
    assert code == 200, doc
    assert [r["tests"][0]["stdout"] for r in doc["results"]] == ["planted\n"] + ["alone\n"] * 6


def test_the_trainers_client_reads_its_file_and_keeps_the_token_out_of_sight(
    service: tuple[Service, str], tmp_path: Path
) -> None:
    _, url = service
    token = tmp_path / "client-token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    (tmp_path / "client.json").write_text(json.dumps({"url": url, "token_file": str(token)}))
    sandbox = load_service(environ={"LABCTL_SANDBOX_SERVICE": str(tmp_path / "client.json")})
    (r,) = sandbox.run([REVERSE])
    assert (r["passed"], r["total"]) == (2, 3)
    assert TOKEN not in repr(sandbox) and TOKEN not in str(vars(sandbox).get("url"))
    with pytest.raises(SandboxError) as err:
        Sandbox(url, "another-token-not-the-services").run([REVERSE])
    assert err.value.status == 401 and TOKEN not in str(err.value)


@pytest.fixture(scope="module")
def sim_inv(
    docker_images: dict[str, Any], lab: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """The sim's inventory: irina serves python and c, m5 (role train) is the trainer."""
    doc = yaml.safe_load(lab.inventory_path.read_text())
    doc["defaults"]["ssh_key"] = str(lab.key_path)
    doc["defaults"]["known_hosts"] = str(lab.known_hosts_path)
    doc["hosts"]["irina"]["roles"] = ["storage", "sandbox"]
    doc["hosts"]["irina"]["sandbox"] = {"languages": ["python", "c"], "pool": 2}
    inv = tmp_path_factory.mktemp("serve") / "lab.yaml"
    inv.write_text(yaml.safe_dump(doc))
    try:
        yield inv
    finally:
        run_json(inv, "sandbox", "serve", "--stop", timeout=120)


def test_serve_on_the_lab_hands_the_token_to_the_trainer_only(
    sim_inv: Path, lab: Any, tmp_path: Path
) -> None:
    rc, doc = run_json(sim_inv, "sandbox", "serve", timeout=300)
    assert rc == 0, doc
    irina = lab.hosts["irina"]
    assert (
        doc["host"] == "irina"
        and doc["url"] == f"http://{irina}:8790"
        and doc["state"] in ("started", "restarted")
    )
    assert doc["langs"] == {"c": "ready", "python": "ready"} and doc["trainers"] == {"m5": "ok"}
    # m5 holds the address (0644) and the token (0600); the address file never holds the token.
    listing = sh(sim_inv, "m5", f"stat -c '%a %n' {paths.SANDBOX_CLIENT} {paths.SANDBOX_CLIENT_TOKEN}")
    assert listing.split("\n")[:2] == [f"644 {paths.SANDBOX_CLIENT}", f"600 {paths.SANDBOX_CLIENT_TOKEN}"]
    client_doc = json.loads(sh(sim_inv, "m5", f"cat {paths.SANDBOX_CLIENT}"))
    token = sh(sim_inv, "m5", f"cat {paths.SANDBOX_CLIENT_TOKEN}").strip()
    assert len(token) >= 32 and token not in json.dumps(client_doc) and token not in json.dumps(doc)
    assert client_doc["url"] == doc["url"] and client_doc["token_file"] == paths.SANDBOX_CLIENT_TOKEN
    # The trainer's client, with m5's two files, runs a batch on irina over the lab network.
    (tmp_path / "token").write_text(token)
    (tmp_path / "client.json").write_text(json.dumps(dict(client_doc, token_file=str(tmp_path / "token"))))
    (r,) = load_service(str(tmp_path / "client.json")).run([REVERSE])
    assert (r["passed"], r["total"]) == (2, 3)
    code, _ = post(doc["url"], {"programs": [REVERSE]}, token=None)
    assert code == 401
    # Again: the running service is left as it is; --status says what it served.
    rc, again = run_json(sim_inv, "sandbox", "serve", timeout=120)
    assert rc == 0 and again["state"] == "running" and again["pid"] == doc["pid"], again
    rc, st = run_json(sim_inv, "sandbox", "serve", "--status")
    assert rc == 0 and st["state"] == "running" and st["served"]["programs"] >= 1 and st["url"] == doc["url"]
    # Stopped: the port closes and m5 forgets the address and the token.
    rc, stopped = run_json(sim_inv, "sandbox", "serve", "--stop", timeout=120)
    assert rc == 0 and stopped["stopped"] and stopped["trainers"] == {"m5": "ok"}, stopped
    left = sh(sim_inv, "m5", f"ls -A {paths.SANDBOX_DIR} 2>/dev/null; true").split()
    assert "client.json" not in left and "client-token" not in left, left
    with pytest.raises(SandboxError):
        Sandbox(doc["url"], token).health()
    rc, st = run_json(sim_inv, "sandbox", "serve", "--status")
    assert rc == 1 and st["state"] == "stopped"
