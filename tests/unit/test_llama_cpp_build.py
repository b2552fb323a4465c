"""The `llama_cpp` resource without llama.cpp: which CUDA toolkit compiles for which GPU, the
architectures a host needs and a build covers, the plan as data (idempotent: a matching install
plans nothing), and the host-side build's all-or-nothing install, run for real with cmake on a
tiny stand-in project packed like llama-cpp-python's sdist (seconds, not the real build's
minutes: that one is tests/integration/test_llama_server.py)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.core.errors import AgentError
from labctl.agent.provision import llama_cpp as host
from labctl.agent.provision.llama_cpp import (
    build_command,
    build_covers,
    cmake_args,
    cuda_archs,
    cuda_check,
    manifest_mismatch,
    parse_nvcc_version,
    toolkit_covers,
)
from labctl.inventory.model import GPU, Host
from labctl.provision.resource import Change, PlanError
from labctl.provision.resources.llama_cpp import LlamaCpp

NVCC_124 = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2024 NVIDIA Corporation
Built on Thu_Mar_28_02:18:24_PDT_2024
Cuda compilation tools, release 12.4, V12.4.131
Build cuda_12.4.r12.4/compiler.34097967_0
"""
SHA = host.PINNED[host.DEFAULT_VERSION]
V = host.DEFAULT_VERSION
M5_GPUS = [
    {"name": "Tesla V100-PCIE-32GB", "compute_capability": "7.0"},
    {"name": "Tesla P40", "compute_capability": "6.1"},
    {"name": "Tesla P40", "compute_capability": "6.1"},
]


# -- toolkits and architectures ----------------------------------------------------------------


def test_nvcc_version_is_read_from_its_banner() -> None:
    assert parse_nvcc_version(NVCC_124) == "12.4"
    assert parse_nvcc_version("Cuda compilation tools, release 13.0, V13.0.48") == "13.0"
    assert parse_nvcc_version("command not found") is None


def test_cuda_13_cannot_compile_for_pascal_or_volta() -> None:
    assert toolkit_covers("13.0", "6.1", "Tesla P40") == (
        False,
        "CUDA 13.0 cannot compile for sm_61 (Tesla P40); install CUDA 12.x",
    )
    assert toolkit_covers("13.1", (7, 0))[0] is False
    assert toolkit_covers("13.0", "5.2")[0] is False  # Maxwell went with Pascal
    assert toolkit_covers("13.0", "7.5") == (True, "")  # Turing is the oldest 13.x keeps
    assert toolkit_covers("13.0", "12.0") == (True, "")
    for version in ("12.0", "12.4", "12.9"):
        assert toolkit_covers(version, "6.1") == (True, "")
        assert toolkit_covers(version, "7.0") == (True, "")


def test_older_drops_and_newer_gpus() -> None:
    assert toolkit_covers("12.0", "3.5") == (False, "CUDA 12.0 cannot compile for sm_35; install CUDA 11.x")
    assert toolkit_covers("11.8", "3.5") == (True, "")
    ok, why = toolkit_covers("11.4", "8.9", "RTX 4090")
    assert ok is False and why == (
        "CUDA 11.4 cannot compile for sm_89 (RTX 4090): that came in CUDA 11.8; install it or newer"
    )
    assert toolkit_covers("12.6", "12.0")[0] is False  # Blackwell needs 12.8
    assert toolkit_covers("12.8", "12.0") == (True, "")
    assert toolkit_covers("12.9", "10.1") == (True, "")
    assert toolkit_covers("13.0", "10.1")[0] is False  # renamed sm_110 in 13.0


def test_unknown_is_said_not_guessed() -> None:
    assert toolkit_covers("", "6.1") == (None, "nvcc's version '' is not one labctl reads")
    ok, why = toolkit_covers("12.4", "14.0")
    assert ok is None and "does not know" in why and "sm_140" in why


def test_archs_from_compute_capabilities() -> None:
    assert cuda_archs(["7.0", "6.1", "6.1"]) == ["61", "70"]
    assert cuda_archs([(8, 6), (7, 5)]) == ["75", "86"]
    assert cuda_archs(["61", "120"]) == ["61", "120"]
    assert cuda_archs([]) == []
    assert host.flavor(["61", "70"]) == "cuda-61_70" and host.flavor([]) == "cpu"
    assert host.default_prefix("0.3.36", ["61", "70"]) == "/opt/labctl/llama.cpp/0.3.36-cuda-61_70"
    assert host.default_prefix("0.3.36", []) == "/opt/labctl/llama.cpp/0.3.36-cpu"


def test_what_a_build_covers() -> None:
    assert build_covers(["61", "70"], "6.1") == "sass"
    assert build_covers(["61", "70"], "7.0") == "sass"
    assert build_covers(["61", "70"], "7.5") == "sass"  # sm_70 code runs on 7.x
    assert build_covers(["61", "70"], "8.6") == "ptx"  # JIT from compute_70
    assert build_covers(["61", "70"], "5.2") is None
    assert build_covers(["86-real"], "8.9") == "sass"
    assert build_covers(["86-real"], "9.0") is None  # no PTX in a -real entry
    assert build_covers(["75-virtual"], "7.5") == "ptx"
    assert build_covers([], "8.6") is None


def test_cuda_check_names_each_gpu() -> None:
    check = cuda_check(["61", "70"], M5_GPUS, "13.0")
    assert [g["build"] for g in check["gpus"]] == ["sass", "sass", "sass"]
    assert [g["nvcc"] for g in check["gpus"]] == [False, False, False]
    assert (
        check["problems"][0] == "CUDA 13.0 cannot compile for sm_70 (Tesla V100-PCIE-32GB); install CUDA 12.x"
    )
    check = cuda_check(["70"], M5_GPUS, "12.4")
    assert check["problems"] == ["the build (70) has no code for sm_61 (Tesla P40)"] * 2
    assert cuda_check([], M5_GPUS, None)["problems"] == []


def test_cmake_command_builds_the_server_alone_and_offline() -> None:
    argv = cmake_args("S", "B", "0.3.36", [])
    assert argv[:5] == ["cmake", "-S", "S", "-B", "B"]
    for flag in (
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
        "-DGGML_CUDA=OFF",
        "-DLLAMA_BUILD_COMMIT=llama-cpp-python-0.3.36",
    ):
        assert flag in argv
    cuda = cmake_args("S", "B", "0.3.36", ["61", "70"], "/usr/local/cuda-12.4/bin/nvcc", ninja=True)
    assert "-DGGML_CUDA=ON" in cuda and "-DCMAKE_CUDA_ARCHITECTURES=61;70" in cuda
    assert "-DCMAKE_CUDA_COMPILER=/usr/local/cuda-12.4/bin/nvcc" in cuda and cuda[5:7] == ["-G", "Ninja"]
    assert host.build_args("B", 2) == ["cmake", "--build", "B", "--target", "llama-server", "-j", "2"]


def test_manifest_mismatch_says_why() -> None:
    m = {"version": V, "source_sha256": SHA, "cuda_archs": ["61", "70"]}
    assert manifest_mismatch(m, V, SHA, ["61", "70"]) is None
    assert manifest_mismatch(None, V, SHA, []) == "nothing is installed there"
    assert "0.3.35" in str(manifest_mismatch({**m, "version": "0.3.35"}, V, SHA, ["61", "70"]))
    assert "other sources" in str(manifest_mismatch({**m, "source_sha256": "0" * 64}, V, SHA, ["61", "70"]))
    assert manifest_mismatch(m, V, SHA, ["61"]) == "it was built for cuda-61_70, not cuda-61"


# -- the resource's plan, as data --------------------------------------------------------------


def resource(params: dict[str, Any] | None = None, gpus: list[GPU] | None = None) -> LlamaCpp:
    h = Host(name="m5", address="10.0.0.1", python=sys.executable, gpus=gpus or [])
    res = LlamaCpp.from_playbook(h, params or {})
    assert isinstance(res, LlamaCpp)
    return res


def state(installs: dict[str, Any] | None = None, **found: Any) -> dict[str, dict[str, Any]]:
    base: dict[str, Any] = {"installs": installs or {}, "sdist": {}, "gpus": [], "nvcc": None, "cpus": 2}
    return {"llama": {**base, **found}}


def installed(op: dict[str, Any]) -> dict[str, Any]:
    """What the probe reads after the agent carried `op` out."""
    manifest = {"version": op["version"], "source_sha256": op["sha256"], "cuda_archs": op["cuda_archs"]}
    return {op["prefix"]: {"prefix": op["prefix"], "installed": True, "manifest": manifest, "error": None}}


def test_cpu_host_plans_upload_and_build_then_nothing() -> None:
    res = resource()
    probe = res.probes()["llama"]
    assert probe == {
        "kind": "llama_cpp",
        "root": host.ROOT,
        "prefix": "",
        "nvcc": "",
        "sdist": f"{host.SDIST_DIR}/llama_cpp_python-{V}.tar.gz",
    }
    change = res.plan(state())
    assert [op["op"] for op in change.ops] == ["upload_sdist", "llama_cpp"]
    build = change.ops[1]
    assert build == {
        "op": "llama_cpp",
        "sdist": probe["sdist"],
        "sha256": SHA,
        "version": V,
        "prefix": f"{host.ROOT}/{V}-cpu",
        "cuda_archs": [],
        "nvcc": "",
        "jobs": 2,
        "timeout": 3600,
    }
    assert change.summary[1].endswith(f"(CPU) into {host.ROOT}/{V}-cpu: nothing is installed there")
    assert "-DGGML_CUDA=OFF" in change.diffs[0] and "--target llama-server -j 2" in change.diffs[0]
    # The sdist already there (its sha256 matches): only the build.
    again = res.plan(state(sdist={"path": probe["sdist"], "exists": True, "sha256": SHA}))
    assert [op["op"] for op in again.ops] == ["llama_cpp"]
    # After the build: nothing to do, and the same after a second look.
    assert res.plan(state(installed(build))) == Change()
    assert not res.plan(state(installed(build), sdist={})).changed


def test_a_broken_or_other_install_is_rebuilt() -> None:
    res = resource()
    build = res.plan(state()).ops[-1]
    broken = installed(build)
    broken[build["prefix"]].update(installed=False, error="bin/llama-server is missing")
    change = res.plan(state(broken))
    assert change.changed and change.summary[-1].endswith(
        "its llama-server does not run (bin/llama-server is missing)"
    )
    other = installed({**build, "sha256": "0" * 64})
    assert "other sources" in res.plan(state(other)).summary[-1]


def test_gpu_host_builds_for_its_capabilities_with_a_toolkit_that_can() -> None:
    res = resource()
    nvcc12 = {"path": "/usr/local/cuda/bin/nvcc", "version": "12.4"}
    change = res.plan(state(gpus=M5_GPUS, nvcc=nvcc12))
    build = change.ops[-1]
    assert build["cuda_archs"] == ["61", "70"] and build["nvcc"] == "/usr/local/cuda/bin/nvcc"
    assert build["prefix"] == f"{host.ROOT}/{V}-cuda-61_70" and build["timeout"] == 4 * 3600
    assert "(CUDA sm_61, sm_70)" in change.summary[-1]
    assert "-DCMAKE_CUDA_ARCHITECTURES=61;70" in change.diffs[0]
    assert not res.plan(state(installed(build), gpus=M5_GPUS, nvcc=nvcc12)).changed
    # A CPU build there is not the one wanted.
    cpu_install = installed({**build, "prefix": build["prefix"], "cuda_archs": []})
    assert (
        "built for cpu, not cuda-61_70" in res.plan(state(cpu_install, gpus=M5_GPUS, nvcc=nvcc12)).summary[-1]
    )

    with pytest.raises(PlanError) as err:
        res.plan(state(gpus=M5_GPUS, nvcc={"path": "/usr/local/cuda/bin/nvcc", "version": "13.0"}))
    assert err.value.message == "m5: CUDA 13.0 cannot compile for sm_61 (Tesla P40); install CUDA 12.x."
    with pytest.raises(PlanError, match="needs nvcc"):
        res.plan(state(gpus=M5_GPUS))


def test_declared_gpus_stand_in_when_the_host_reports_none() -> None:
    res = resource(
        gpus=[GPU(model="Tesla P40", memory_gb=24, count=2), GPU(model="Tesla V100", memory_gb=32)]
    )
    change = res.plan(state(nvcc={"path": "/opt/cuda/bin/nvcc", "version": "12.2"}))
    assert change.ops[-1]["cuda_archs"] == ["61", "70"]


def test_cpu_and_explicit_archs_and_prefix() -> None:
    cpu = resource({"cuda": "cpu", "jobs": 1, "prefix": "/opt/llama"}).plan(state(gpus=M5_GPUS))
    assert (
        cpu.ops[-1]["cuda_archs"] == [] and cpu.ops[-1]["prefix"] == "/opt/llama" and cpu.ops[-1]["jobs"] == 1
    )
    assert resource({"prefix": "/opt/llama"}).probes()["llama"]["prefix"] == "/opt/llama"
    nvcc = {"path": "/usr/local/cuda/bin/nvcc", "version": "12.4"}
    only = resource({"cuda": "86,61"}).plan(state(gpus=M5_GPUS, nvcc=nvcc))
    assert only.ops[-1]["cuda_archs"] == ["61", "86"]


def test_a_version_without_a_pin_needs_its_sha256() -> None:
    with pytest.raises(PlanError, match=re.escape("no sha256 pinned for llama-cpp-python 0.3.1")):
        resource({"version": "0.3.1"}).plan(state())
    change = resource({"version": "0.3.1", "sha256": "a" * 64}).plan(state())
    assert change.ops[-1]["sha256"] == "a" * 64 and change.ops[-1]["prefix"].endswith("/0.3.1-cpu")


def test_a_probe_error_is_a_plan_error() -> None:
    with pytest.raises(PlanError, match=re.escape("could not read llama.cpp's state on m5: OSError: boom")):
        resource().plan({"llama": {"error": "OSError: boom"}})


# -- the host-side build, on a stand-in project ------------------------------------------------

FAKE_CMAKE = """cmake_minimum_required(VERSION 3.14)
project(fake C)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
if (FAIL_CONFIGURE)
    message(FATAL_ERROR "stand-in refuses to configure")
endif()
add_executable(llama-server main.c)
"""
FAKE_MAIN = """#include <stdio.h>
int main(void) { puts("version: 0 (" COMMIT ")"); puts("built with a stand-in"); return 0; }
"""


def fake_sdist(folder: Path, version: str = "9.9.9", *, fail: bool = False) -> Path:
    """A tar.gz laid out like llama-cpp-python's sdist whose llama.cpp is a one-file C program
    that prints a version line as llama-server does."""
    files = {
        "CMakeLists.txt": FAKE_CMAKE.replace("if (FAIL_CONFIGURE)", "if (TRUE)" if fail else "if (FALSE)"),
        "main.c": FAKE_MAIN.replace("COMMIT", '"stand-in"'),
        "LICENSE": "MIT\n",
        "models/ggml-vocab-big.gguf": "skipped when unpacked\n",
    }
    path = folder / f"llama_cpp_python-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in {
            "pyproject.toml": "",
            **{f"vendor/llama.cpp/{k}": v for k, v in files.items()},
        }.items():
            data = text.encode()
            info = tarfile.TarInfo(f"llama_cpp_python-{version}/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


needs_cmake = pytest.mark.skipif(
    shutil.which("cmake") is None or shutil.which("c++") is None, reason="needs cmake and a compiler"
)


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


@needs_cmake
def test_build_installs_verifies_and_keeps_a_match(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    sdist = fake_sdist(tmp_path)
    prefix = tmp_path / "opt" / "9.9.9-cpu"
    first = build_command({"sdist": str(sdist), "prefix": str(prefix), "jobs": 2, "heartbeat_s": 0.2})
    assert first["built"] is True and first["prefix"] == str(prefix)
    assert first["server_version"].startswith("version: 0 (stand-in)")
    manifest = json.loads((prefix / "build.json").read_text())
    assert manifest == first["manifest"]
    assert manifest["version"] == "9.9.9" and manifest["cuda_archs"] == [] and manifest["nvcc"] is None
    assert manifest["source_sha256"] == host.sha256_of(str(sdist))
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in manifest["cmake_args"] and manifest["build_seconds"] > 0
    assert sorted(os.listdir(prefix)) == ["LICENSE", "bin", "build.json"]
    assert os.access(prefix / "bin" / "llama-server", os.X_OK)
    assert leftovers(prefix.parent) == []  # build and partial folders gone
    events = [json.loads(line) for line in capfd.readouterr().err.splitlines() if line.startswith("{")]
    assert [e["step"] for e in events if e["step_elapsed"] == 0] == [
        "check",
        "unpack",
        "configure",
        "compile",
        "install",
        "done",
    ]

    again = build_command({"sdist": str(sdist), "prefix": str(prefix)})
    assert again["built"] is False and again["manifest"] == manifest

    probe = host.probe({"root": str(prefix.parent), "sdist": str(sdist)})
    entry = probe["installs"][str(prefix)]
    assert entry["installed"] is True and entry["manifest"] == manifest and entry["error"] is None
    assert probe["sdist"]["sha256"] == manifest["source_sha256"]
    assert host.build_op({"op": "llama_cpp", "sdist": str(sdist), "prefix": str(prefix)}).startswith("kept ")


@needs_cmake
def test_a_failed_build_leaves_nothing_and_names_the_log(tmp_path: Path) -> None:
    prefix = tmp_path / "opt" / "9.9.9-cpu"
    with pytest.raises(AgentError) as err:
        build_command({"sdist": str(fake_sdist(tmp_path, fail=True)), "prefix": str(prefix)})
    assert err.value.kind == "llama_cpp"
    assert "cmake (configure) exited 1" in err.value.message
    assert f"Full log: {prefix}.log" in err.value.message
    assert "stand-in refuses to configure" in (tmp_path / "opt" / "9.9.9-cpu.log").read_text()
    assert not prefix.exists() and leftovers(prefix.parent) == []


def test_sources_of_another_sha256_are_refused_before_building(tmp_path: Path) -> None:
    sdist = fake_sdist(tmp_path)
    with pytest.raises(AgentError, match="not the pinned " + "0" * 64):
        build_command({"sdist": str(sdist), "prefix": str(tmp_path / "p"), "sha256": "0" * 64})
    with pytest.raises(AgentError, match="are not on this host"):
        build_command(
            {"sdist": str(tmp_path / "llama_cpp_python-1.0.0.tar.gz"), "prefix": str(tmp_path / "p")}
        )
    assert not (tmp_path / "p").exists()


def test_a_folder_that_is_not_a_build_is_not_replaced(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "mine.txt").write_text("keep")
    with pytest.raises(AgentError, match=re.escape("is not a llama.cpp build of labctl's")):
        build_command({"sdist": str(fake_sdist(tmp_path)), "prefix": str(tmp_path / "p")})
    assert (tmp_path / "p" / "mine.txt").read_text() == "keep"


def test_stale_folders_of_a_killed_build_are_removed(tmp_path: Path) -> None:
    dead = 2**22 + 12345  # above pid_max's default: no process has it
    for kind in ("build", "partial", "old"):
        (tmp_path / f".p.{kind}-{dead}").mkdir()
    (tmp_path / ".p.build-1").mkdir()  # pid 1 runs: not stale
    (tmp_path / ".other.build-99999999").mkdir()
    assert sorted(host.remove_stale(str(tmp_path), "p")) == [
        f".p.{k}-{dead}" for k in ("build", "old", "partial")
    ]
    assert leftovers(tmp_path) == [".other.build-99999999", ".p.build-1"]


def test_a_cuda_build_without_nvcc_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host, "find_nvcc", lambda nvcc="": None)
    with pytest.raises(AgentError, match=r"a CUDA build needs nvcc, and it is neither on PATH"):
        build_command(
            {"sdist": str(fake_sdist(tmp_path)), "prefix": str(tmp_path / "p"), "cuda_archs": ["61"]}
        )
    assert not (tmp_path / "p").exists()


@needs_cmake
@pytest.mark.slow
def test_the_resource_end_to_end_on_this_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """provision_host with a `connection: local` host and the real agent: the controller pushes the
    sdist from its cache, the host builds, the engine's verify plans nothing; a second run is ok."""
    import threading

    from rich.console import Console

    from labctl.hosts.context import Context
    from labctl.hosts.fanout import HostRun
    from labctl.provision.engine import provision_host
    from labctl.provision.playbook import Entry

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cache = tmp_path / "cache" / "labctl" / "llama.cpp"
    cache.mkdir(parents=True)
    sdist = fake_sdist(cache)
    params = {"version": "9.9.9", "sha256": host.sha256_of(str(sdist)), "prefix": str(tmp_path / "opt" / "b")}

    def run() -> tuple[Any, str]:
        out = io.StringIO()
        ctx = Context(console=Console(file=out, width=300), inventory_path=tmp_path / "lab.yaml")
        h = Host(name="here", address="127.0.0.1", connection="local", python=sys.executable, gpus=[])
        try:
            [result] = provision_host(
                HostRun(ctx, h, threading.Event()), [Entry("llama_cpp", params, [], None)], False
            )
        finally:
            ctx.close()
        return result, out.getvalue()

    result, shown = run()
    assert result.status == "changed", result
    assert result.summary[0].startswith(
        "upload llama_cpp_python-9.9.9.tar.gz to " + str(tmp_path / "opt" / "src")
    )
    label = "here: llama_cpp 9.9.9 (auto): "
    for what in ("checking the sources [", "configuring the build [", "compiling llama-server [", "done ["):
        assert label + what in shown, shown
    assert (tmp_path / "opt" / "src" / sdist.name).read_bytes() == sdist.read_bytes()
    assert json.loads((tmp_path / "opt" / "b" / "build.json").read_text())["version"] == "9.9.9"
    assert result.events[-1]["step"] == "done"
    again, _ = run()
    assert again.status == "ok" and not again.changed
