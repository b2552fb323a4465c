"""The sandbox's container config (limits → Docker Engine API JSON) and the exec stream's
demultiplexer with its byte cap, on canned bytes."""

from __future__ import annotations

import struct

import pytest

from labctl.agent.sandbox.docker import Demux
from labctl.sandbox.bench import baseline_argv
from labctl.sandbox.limits import MIB, Limits, container_config, docker_run_argv, pool_id


def frame(stream: int, data: bytes) -> bytes:
    return struct.pack(">BxxxI", stream, len(data)) + data


def test_config_is_hardened_with_every_limit() -> None:
    lim = Limits(memory_mb=300, cpus=0.5, pids=32, work_mb=10, tmp_mb=20, nofile=100, fsize_mb=5)
    c = container_config("labctl-sandbox/python:latest", "python", lim, compiled=False)
    hc = c["HostConfig"]
    assert c["Image"] == "labctl-sandbox/python:latest"
    assert c["User"] == "65534:65534" and c["NetworkDisabled"] is True
    assert hc["NetworkMode"] == "none" and hc["ReadonlyRootfs"] is True
    assert hc["CapDrop"] == ["ALL"] and "CapAdd" not in hc and "Privileged" not in hc
    assert hc["SecurityOpt"] == ["no-new-privileges"]  # no seccomp=unconfined: the default profile stays
    assert hc["PidsLimit"] == 32
    assert hc["Memory"] == hc["MemorySwap"] == 300 * MIB
    assert hc["NanoCpus"] == 500_000_000
    assert {u["Name"]: (u["Soft"], u["Hard"]) for u in hc["Ulimits"]} == {
        "nofile": (100, 100),
        "fsize": (5 * MIB, 5 * MIB),
    }  # no nproc: it is per uid across the host (every sandbox is nobody); PidsLimit is per container
    assert hc["Init"] is True and hc["LogConfig"]["Type"] == "none"
    work, tmp = hc["Tmpfs"]["/work"].split(","), hc["Tmpfs"]["/tmp"].split(",")
    assert "size=10m" in work and "size=20m" in tmp
    for opts in (work, tmp):
        assert {"noexec", "nosuid", "nodev", "uid=65534", "gid=65534"} <= set(opts)
        assert "exec" not in opts
    assert c["Cmd"] == ["sleep", "infinity"]
    assert c["Labels"]["labctl.sandbox"] == "1" and c["Labels"]["labctl.lang"] == "python"


def test_compiled_languages_may_exec_from_work_only() -> None:
    # Docker's own tmpfs default is noexec: a compiled program needs "exec" said outright
    hc = container_config("img", "c", Limits(), compiled=True)["HostConfig"]
    assert "exec" in hc["Tmpfs"]["/work"].split(",") and "noexec" not in hc["Tmpfs"]["/work"].split(",")
    assert "noexec" in hc["Tmpfs"]["/tmp"].split(",")


def test_pool_id_follows_the_limits_not_the_labels() -> None:
    a = container_config("img", "python", Limits(), compiled=False)
    b = container_config("img", "python", Limits(pids=65), compiled=False)
    assert a["Labels"]["labctl.pool"] == pool_id(a) != b["Labels"]["labctl.pool"]
    assert container_config("img", "python", Limits(), compiled=False) == a


def test_docker_run_baseline_has_the_same_limits() -> None:
    c = container_config("img", "c", Limits(), compiled=True)
    spec = {"config": c, "file": "main.c", "compile": ["gcc", "-o", "main", "main.c"], "run": ["./main"]}
    argv = baseline_argv(spec)
    assert argv[:3] == ["docker", "run", "--rm"] and argv[-4] == "img"
    joined = " ".join(argv)
    for flag in (
        "--network none",
        "--read-only",
        "--cap-drop ALL",
        "--security-opt no-new-privileges",
        "--init",
    ):
        assert flag in joined
    assert f"--memory {256 * MIB} --memory-swap {256 * MIB}" in joined
    assert (
        "--pids-limit 64" in joined and "--ulimit nofile=256:256" in joined and "--log-driver none" in joined
    )
    assert argv[-1] == "cat > /work/main.c && gcc -o main main.c && exec ./main </dev/null"
    assert docker_run_argv(c, ["true"])[-2:] == ["img", "true"]


def test_demux_splits_streams_across_any_read_boundary() -> None:
    data = frame(1, b"hello ") + frame(2, b"oops\n") + frame(1, b"world\n") + frame(0, b"ignored")
    for step in (1, 3, 7, len(data)):
        d = Demux(cap=1024)
        for i in range(0, len(data), step):
            d.feed(data[i : i + step])
        assert (d.stdout, d.stderr, d.truncated) == (b"hello world\n", b"oops\n", False)


def test_demux_caps_each_stream_and_keeps_reading() -> None:
    d = Demux(cap=10)
    d.feed(frame(1, b"a" * 8) + frame(1, b"b" * 8) + frame(2, b"e" * 3))
    d.feed(frame(1, b"c" * 100_000))
    d.feed(frame(2, b"f" * 4))
    assert d.stdout == b"a" * 8 + b"bb" and d.stderr == b"eeeffff" and d.truncated


@pytest.mark.parametrize("cap", [0, 5])
def test_demux_one_enormous_frame_stays_within_the_cap(cap: int) -> None:
    d = Demux(cap=cap)
    big = frame(1, b"x" * 5_000_000)
    for i in range(0, len(big), 65536):
        d.feed(big[i : i + 65536])
    assert len(d.stdout) == cap and d.truncated


def test_the_run_summary_says_no_exit_code_after_a_timeout() -> None:
    from labctl.sandbox.render import summary

    killed = {"lang": "python", "exit_code": None, "wall_ms": 1052, "timed_out": True}
    assert summary(killed).startswith("sandbox: python, no exit code, 1052 ms")
    assert "exit 3" in summary({"lang": "c", "exit_code": 3, "wall_ms": 40})
