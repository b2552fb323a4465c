"""The attacks' judges on canned results: for each kind, a contained run and an escaped one."""

from __future__ import annotations

from typing import Any

import pytest

from labctl.sandbox.attacks import JUDGES, Attack, attacks_for, languages

CLEAN: dict[str, Any] = {"clean": True, "problems": [], "hostname": "labhost"}
DIRTY: dict[str, Any] = {
    "clean": False,
    "problems": ["process 4242 (sleep 1) still running in labctl-run-0123456789ab"],
    "hostname": "labhost",
}


def res(stdout: str = "", **kw: Any) -> dict[str, Any]:
    r = {
        "lang": "python",
        "exit_code": 0,
        "stdout": stdout,
        "stderr": "",
        "truncated": False,
        "timed_out": False,
        "oom_killed": False,
        "wall_ms": 400,
    }
    r.update(kw)
    return r


def attack(lang: str, name: str) -> Attack:
    return next(a for a in attacks_for(lang) if a.name == name)


# (lang, attack, contained results, escaped results, words the escape's detail names)
CASES = [
    ("python", "fork_bomb", [res(exit_code=137, timed_out=True, wall_ms=3100)], None, ""),
    (
        "python",
        "fork_bomb_neighbour",
        [res(exit_code=None, timed_out=True, wall_ms=5000), res("FORKED 8\nSURVIVED\n")],
        [
            res(exit_code=None, timed_out=True),
            res("ESCAPED the bomb starved this run: [Errno 11]\nSURVIVED\n"),
        ],
        "starved",
    ),
    (
        "c",
        "fork_bomb_neighbour",
        None,
        [res(exit_code=None, timed_out=True), res(stderr="OCI runtime exec failed", exit_code=126)],
        "did not finish",
    ),
    (
        "python",
        "memory_bomb",
        [res("MB 16\nMB 240\n", exit_code=137, oom_killed=True)],
        [res("MB 2048\nESCAPED allocated 2048 MiB\n")],
        "ESCAPED",
    ),
    (
        "c",
        "memory_bomb_threads",
        [res("MB 200\n", exit_code=137, oom_killed=True)],
        [res("MB 8\n")],
        "ended normally",
    ),
    (
        "python",
        "disk_fill_shm",
        [res("WROTE 64 MiB in /dev/shm - No space\n")],
        [res("WROTE 1024 MiB\nESCAPED wrote 1024 MiB into /dev/shm\n")],
        "ESCAPED",
    ),
    ("c", "disk_fill_work", [res(exit_code=137, oom_killed=True)], [res("")], "neither reported"),
    (
        "python",
        "files_for_next_run",
        [res("PLANTED /work,/tmp\n"), res("CHECKED /work /tmp\n")],
        [res("PLANTED /work\n"), res("ESCAPED found the earlier run's marker in /work\nCHECKED\n")],
        "marker",
    ),
    ("python", "files_for_next_run", None, [res(""), res("CHECKED /work\n")], "planted nothing"),
    ("c", "flood_stdout", [res("A" * 1000, truncated=True)], [res("A" * 5000)], "not marked truncated"),
    ("python", "enormous_line", None, [res("B" * (17 << 20), truncated=True)], "MiB of output came back"),
    (
        "python",
        "ignore_sigterm",
        [res("IGNORING\n", exit_code=137, timed_out=True, wall_ms=2100)],
        [res("IGNORING\n", exit_code=137, timed_out=True, wall_ms=600_000)],
        "lasted 600.0 s",
    ),
    ("c", "setsid_double_fork", [res("DETACHED\n")], None, ""),
    (
        "python",
        "cpu_burn",
        [res("CPU 2.0 WALL 2.0 WORKERS 4\n")],
        [res("CPU 3.9 WALL 2.0 WORKERS 4\n")],
        "1.95 cores",
    ),
    (
        "c",
        "net_tcp_gateway",
        [res("BLOCKED tcp 172.17.0.1:22 Network is unreachable\n")],
        [res("BLOCKED tcp 172.17.0.1:22 x\nESCAPED reached 172.17.0.1:2375 (refused: something answered)\n")],
        "2375",
    ),
    ("python", "net_udp", None, [res("")], "no attempt reported"),
    (
        "python",
        "proc_host",
        [res("HOSTNAME 0123abcd\nBLOCKED proc: 2 pids\n")],
        [res("HOSTNAME labhost\nBLOCKED proc: 2 pids\n")],
        "UTS",
    ),
    (
        "c",
        "keyctl",
        [res("BLOCKED keyctl join Operation not permitted\n")],
        [res("ESCAPED keyctl join returned 5\n")],
        "keyctl",
    ),
    (
        "python",
        "signal_other_run",
        [res("STARTED\nSURVIVED\n"), res("STARTED\nSURVIVED\n")],
        [
            res("STARTED\nESCAPED killed the other run's pids [7]\nSURVIVED\n"),
            res("STARTED\n", exit_code=137),
        ],
        "ESCAPED",
    ),
    (
        "c",
        "signal_other_run",
        None,
        [res("STARTED\nSURVIVED\n"), res("STARTED\n", exit_code=137)],
        "run 2 did not survive",
    ),
    (
        "c",
        "include_shadow",
        [res(stderr="main.c:1:10: fatal error: /etc/shadow: Permission denied", exit_code=1)],
        [res(stderr="error: 'root:$y$j9T$abc:19000:0' undeclared", exit_code=1)],
        "/etc/shadow",
    ),
    (
        "c",
        "include_host_file",
        [res(stderr="error: '0f3a9c' undeclared", exit_code=1)],
        [res(stderr="main.c:2:1: error: 'labhost' undeclared here", exit_code=1)],
        "hostname",
    ),
    ("c", "include_dev_zero", [res(exit_code=1, oom_killed=True)], [res("")], "compiled and ran"),
]


@pytest.mark.parametrize(
    ("lang", "name", "good", "bad", "why"), CASES, ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CASES)]
)
def test_judge_tells_contained_from_escaped(lang: str, name: str, good: Any, bad: Any, why: str) -> None:
    a = attack(lang, name)
    if good is not None:
        ok, detail = a.judge(good, CLEAN)
        assert ok, detail
    if bad is not None:
        ok, detail = a.judge(bad, CLEAN)
        assert not ok
        assert why in detail


@pytest.mark.parametrize("lang", languages())
def test_every_attack_escapes_when_the_host_is_left_dirty(lang: str) -> None:
    """Whatever the runs said, a process or container left on the host is an escape."""
    for a in attacks_for(lang):
        runs = [
            res("PLANTED /work\nCHECKED\nSURVIVED\nCPU 1 WALL 2\nBLOCKED x\nWROTE 64\n", truncated=True)
        ] * len(a.programs)
        ok, detail = a.judge(runs, DIRTY)
        assert not ok, a.name
        assert "still running" in detail


def test_python_and_c_cover_every_family_of_the_issue() -> None:
    wanted = {
        "fork_bomb", "fork_bomb_neighbour", "memory_bomb", "memory_bomb_threads", "disk_fill_work", "disk_fill_tmp", "disk_fill_shm",
        "files_for_next_run", "flood_stdout", "flood_stderr", "enormous_line", "ignore_sigterm",
        "setsid_double_fork", "cpu_burn", "net_tcp_gateway", "net_tcp_outside", "net_udp", "net_dns",
        "docker_socket", "proc_host", "mount", "unshare", "keyctl", "signal_other_run",
    }  # fmt: skip
    for lang in ("python", "c"):
        names = {a.name for a in attacks_for(lang)}
        assert wanted <= names, (lang, wanted - names)
    assert {"include_shadow", "include_host_file"} <= {a.name for a in attacks_for("c")}


def test_requests_carry_each_attacks_limits_and_together_runs_are_pairs() -> None:
    a = attack("python", "signal_other_run")
    reqs = a.requests()
    assert a.together and len(reqs) == 2
    assert all(
        r["lang"] == "python" and r["timeout"] == a.timeout and r["memory_mb"] == a.memory_mb for r in reqs
    )


def test_a_language_without_attacks_has_none() -> None:
    assert attacks_for("cobol") == []


def test_each_attack_is_written_once_with_a_program_for_every_language_it_claims() -> None:
    """One table: an attack's name, family and line appear once, beside its program per
    language; every language's list is made from it, in the table's order."""
    from labctl.sandbox.attacks import ATTACKS

    names = [spec.name for spec in ATTACKS]
    assert len(names) == len(set(names))
    assert languages() == sorted({lang for spec in ATTACKS for lang in spec.programs})
    for spec in ATTACKS:
        assert spec.kind in JUDGES, spec.name
        assert spec.programs, f"{spec.name} has a program in no language"
        for lang, prog in spec.programs.items():
            assert prog.sources and all(src.strip() for src in prog.sources), (spec.name, lang)
            assert len(prog.sources) == 2 or not spec.together, (spec.name, lang)
            assert prog.what != spec.what, f"{spec.name}/{lang} repeats the attack's line"
            made = spec.attack(lang)
            assert (made.name, made.lang, made.kind, made.programs) == (
                spec.name,
                lang,
                spec.kind,
                prog.sources,
            )
    for lang in languages():
        assert [a.name for a in attacks_for(lang)] == [s.name for s in ATTACKS if lang in s.programs]


def test_the_selftest_table_renders_each_host_row_with_what_was_left_on_the_host() -> None:
    """`labctl sandbox selftest` without --json: one row per attack naming its host (the host
    check's findings are shown in the detail, not in place of the host's name)."""
    import io

    from rich.console import Console

    from labctl.sandbox.render import render_selftest

    doc = {
        "hosts": ["irina"],
        "escaped": 1,
        "rows": [
            {"host": "irina", "lang": "python", "attack": "fork_bomb", "contained": True, "detail": "pids held",
             "host_problems": []},
            {"host": "irina", "lang": "c", "attack": "mount", "contained": False, "detail": "[mounted]",
             "host_problems": ["container labctl-run-x left"]},
        ],
    }  # fmt: skip
    out = io.StringIO()
    render_selftest(Console(file=out, width=200), doc)
    text = out.getvalue()
    assert "irina" in text and "fork_bomb" in text and "NO" in text
    assert "[mounted]" in text and "left on the host: container labctl-run-x left" in text
    assert "1 contained, 1 escaped, 0 not run" in text


def test_selftest_runs_only_the_attacks_named_in_the_languages_that_have_them() -> None:
    """--attack include_shadow with python and c: c's compiler attack runs, python has no such
    attack and adds no row; the engine sees nothing else."""
    from labctl.sandbox.selftest import selftest

    asked: list[str] = []

    def run_batch(reqs: list[dict[str, Any]], conc: int) -> list[dict[str, Any]]:
        asked.extend(r["lang"] for r in reqs)
        return [res(exit_code=1, stderr="error: cannot include /etc/shadow") for _ in reqs]

    def check(action: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"snapshot": {}} if action == "snapshot" else CLEAN

    rows = selftest(["python", "c"], run_batch, check, only=["include_shadow", "fork_bomb"])
    assert [(r["lang"], r["attack"]) for r in rows] == [
        ("python", "fork_bomb"),
        ("c", "fork_bomb"),
        ("c", "include_shadow"),
    ]
    assert len(asked) == sum(len(attack(lang, name).programs) for lang, name in
                             [("python", "fork_bomb"), ("c", "fork_bomb"), ("c", "include_shadow")])  # fmt: skip


def test_an_attack_name_no_language_has_is_refused_with_the_closest_name() -> None:
    from labctl.output.errors import InputError
    from labctl.sandbox.selftest import check_attack_names

    check_attack_names(["include_shadow"], ["python", "c"])
    with pytest.raises(InputError) as e:
        check_attack_names(["include_shadow"], ["python"])
    assert "No self-test attack is named 'include_shadow' for python" in e.value.message
    with pytest.raises(InputError) as e:
        check_attack_names(["fork_bom"], ["python"])
    assert "Did you mean 'fork_bomb'?" in e.value.message
    assert "fork_bomb_neighbour" in e.value.hint and "include_shadow" not in e.value.hint


def test_selftest_cli_refuses_an_unknown_attack_with_exit_2_before_any_host(tmp_path: Any) -> None:
    """The inventory's sandbox host is at an address nothing answers: a refusal that needed the
    host would say it is unreachable (exit 1), not name the attack (exit 2)."""
    import subprocess
    import sys

    inv = tmp_path / "lab.yaml"
    inv.write_text(
        "lab: t\nhosts:\n  box:\n    address: 127.0.0.9\n    port: 1\n    roles: [sandbox]\n"
        "    sandbox: {languages: [python]}\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "labctl", "-i", str(inv), "sandbox", "selftest", "--lang", "python",
         "--attack", "memory_bom"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Did you mean 'memory_bomb'?" in r.stderr and "Traceback" not in r.stderr
