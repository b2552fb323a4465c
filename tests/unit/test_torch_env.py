"""torch_env's build on a host, for real with this machine's python, venv and pip, from tiny fake
torch wheels (`+cpu`, `+cu126`) in a local index and a local find-links folder: nothing leaves
the machine. A fake CUDA wheel says its GPUs are available (there is no GPU here): those tests
say `mock_gpu` in their names. The version, 2.6.9, is one no real index on this machine has.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from labctl.agent.core import paths
from labctl.agent.core.errors import AgentError
from labctl.agent.provision.commands import apply_command
from labctl.hosts.context import Context
from labctl.hosts.fanout import HostRun
from labctl.inventory.model import Host
from labctl.provision.engine import ResourceResult, provision_host
from labctl.provision.playbook import Entry
from labctl.provision.resources.torch_env import TorchEnv

VERSION = "2.6.9"
M5_GPUS = "Tesla V100-PCIE-32GB, 7.0\nTesla P40, 6.1\n"  # what nvidia-smi would say on the seed M5

NUMPY_NOISE = """\
A module that was compiled using NumPy 1.x cannot be run in
NumPy 2.2.6 as it may crash. To support both 1.x and 2.x
versions of NumPy, modules must be compiled with NumPy 2.0.
Some module may need to rebuild instead e.g. with 'pybind11>=2.12'.

If you are a user of the module, the easiest solution will be to
downgrade to 'numpy<2' or try to upgrade the affected module.
We expect that some modules will need time to support NumPy 2.

Traceback (most recent call last):  File "<string>", line 3, in <module>
  File "/envs/t/lib/python3.11/site-packages/torch/__init__.py", line 1477, in <module>
    from .functional import *  # noqa: F403
/envs/t/lib/python3.11/site-packages/torch/_subclasses/functional_tensor.py:276: UserWarning: \
Failed to initialize NumPy: _ARRAY_API not found (Triggered internally at ../torch/csrc/utils/tensor_numpy.cpp:84.)
  cpu = _conversion_method_template(device=torch.device("cpu"))
"""


def fake_torch_wheel(folder: Path, build: str, *, gpus_work: bool = False, on_import: str = "") -> Path:
    """A torch wheel of VERSION+build whose torch.version.cuda is that build's; `on_import` runs
    first when torch is imported."""
    local = f"{VERSION}+{build}"
    cuda = None if build == "cpu" else f"{build[2:-1]}.{build[-1]}"
    init = (
        f"{on_import}\n"
        "import types\n"
        "from . import version\n"
        f"__version__ = {local!r}\n"
        f"cuda = types.SimpleNamespace(is_available=lambda: {gpus_work},\n"
        "    get_arch_list=lambda: ['sm_60', 'sm_70'], nccl=types.SimpleNamespace(version=lambda: (2, 21, 5)))\n"
    )
    info = f"torch-{local}.dist-info"
    files = {
        "torch/__init__.py": init,
        "torch/version.py": f"__version__ = {local!r}\ncuda = {cuda!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {local}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: labctl-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"torch-{local}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return wheel


def index_with(root: Path, *wheels: Path) -> str:
    """A PEP 503 index in `root` holding `wheels` (none: an index without torch); its file:// URL."""
    project = root / "simple" / "torch"
    project.mkdir(parents=True)
    links = ""
    for w in wheels:
        (project / w.name).write_bytes(w.read_bytes())
        links += f'<a href="{w.name.replace("+", "%2B")}">{w.name}</a>\n'
    (project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return (root / "simple").as_uri()


@pytest.fixture()
def host_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """labctl's envs folder and record on the 'host' (this machine) moved under tmp_path."""
    envs = tmp_path / "envs"
    monkeypatch.setattr(paths, "ENVS_DIR", str(envs))
    monkeypatch.setattr(paths, "TORCH_ENV_RECORD", str(envs / "torch.json"))
    return envs


def plan(params: dict[str, Any], gpus: str = "", record: str | None = None) -> Any:
    res = TorchEnv.from_playbook(Host(name="m5", address="10.0.0.1", python=sys.executable), params)
    state = {
        "gpus": {"rc": 0, "stdout": gpus},
        "record": {"exists": record is not None, "text": record or ""},
    }
    return res.plan(state)


def leftovers(envs: Path) -> list[str]:
    return sorted(p.name for p in envs.iterdir() if ".partial-" in p.name) if envs.exists() else []


@pytest.mark.slow
def test_mock_gpu_cu126_env_is_built_under_a_temporary_name_and_named_once_verified(
    host_dirs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = index_with(tmp_path / "idx", fake_torch_wheel(tmp_path / "w", "cu126", gpus_work=True))
    change = plan({"version": VERSION, "index_url": url}, gpus=M5_GPUS)
    final = host_dirs / f"torch-{VERSION}-cu126"
    stale = host_dirs / f".torch-{VERSION}-cu126.partial-999999999"  # a killed run's, pid long gone
    (stale / "bin").mkdir(parents=True)
    change.ops[0]["heartbeat_s"] = 0.2
    apply_command({"ops": change.ops})

    record = json.loads((host_dirs / "torch.json").read_text())
    assert record["version"] == f"{VERSION}+cu126" and record["cuda"] == "12.6" and record["build"] == "cu126"
    assert record["python"] == f"{final}/bin/python" and record["source"].endswith(".whl")
    assert leftovers(host_dirs) == []  # its own partial renamed, the stale one removed
    # The env works under its name: scripts point there, not at the partial they were made in.
    # pip runs on the env's own python: its shebang, or for a path past the kernel's shebang
    # limit (a deep test folder), the /bin/sh trampoline venv writes instead, names it.
    pip = subprocess.run([f"{final}/bin/pip", "--version"], capture_output=True, text=True)
    assert pip.returncode == 0 and f" from {final}/lib/" in pip.stdout, pip.stdout + pip.stderr
    assert ".partial-" not in (final / "bin/pip").read_text()
    assert ".partial-" not in (final / "bin/activate").read_text()
    out = subprocess.run(
        [f"{final}/bin/python", "-c", "import torch; print(torch.__version__)"], capture_output=True
    )
    assert out.stdout.decode().strip() == f"{VERSION}+cu126"
    events = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    steps = [e["step"] for e in events]
    assert [s for i, s in enumerate(steps) if s not in steps[:i]] == ["venv", "pip", "verify", "done"]
    # While pip ran, it said so more than once, with how long it had been at it and pip's latest line.
    beats = [e for e in events if e["step"] == "pip" and e["step_elapsed"] > 0]
    assert beats and all(e["detail"] for e in beats)
    # Built and recorded: the next plan is empty.
    assert not plan(
        {"version": VERSION, "index_url": url}, M5_GPUS, (host_dirs / "torch.json").read_text()
    ).changed


@pytest.mark.slow
def test_a_cpu_wheel_in_the_hosts_find_links_never_reaches_a_cuda_env(
    host_dirs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The incident: the cu126 index had no such torch, pip took the +cpu wheel the host's pip
    configuration pointed at, and a half-made env stayed as torch-VERSION-cu126."""
    monkeypatch.setenv("PIP_FIND_LINKS", str(fake_torch_wheel(tmp_path / "wheels", "cpu").parent))
    url = index_with(tmp_path / "idx")
    change = plan({"version": VERSION, "index_url": url}, gpus=M5_GPUS)
    with pytest.raises(AgentError) as err:
        apply_command({"ops": change.ops})
    assert f"pip could not install torch {VERSION}+cu126 from {url}" in err.value.message
    assert f"No matching distribution found for torch=={VERSION}" in err.value.message
    assert f"Full log: {host_dirs}/torch-{VERSION}-cu126.log" in err.value.message
    assert not (host_dirs / f"torch-{VERSION}-cu126").exists() and leftovers(host_dirs) == []
    assert not (host_dirs / "torch.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("where", ["index", "host_find_links"])
def test_a_wheel_of_another_build_is_refused_naming_both_builds(
    where: str, host_dirs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu = fake_torch_wheel(tmp_path / "wheels", "cpu")
    if where == "index":  # a mirror that serves the CPU build under the cu126 index's name
        params = {"version": VERSION, "cuda": "cu126", "index_url": index_with(tmp_path / "idx", cpu)}
    else:  # index_url: "" asks for the host's pip configuration, whose find-links has +cpu
        monkeypatch.setenv("PIP_FIND_LINKS", str(cpu.parent))
        params = {"version": VERSION, "cuda": "cu126", "index_url": ""}
    change = plan(params)  # no GPU: only the check of the build itself can catch this
    with pytest.raises(AgentError) as err:
        apply_command({"ops": change.ops})
    message = err.value.message
    assert (
        f"the wheel pip installed is torch {VERSION}+cpu (a CPU-only build), not the cu126 build "
        "chosen (built for CUDA 12.6); pip took it from " in message
    )
    assert str(tmp_path / ("idx" if where == "index" else "wheels")) in message
    assert not (host_dirs / f"torch-{VERSION}-cu126").exists() and leftovers(host_dirs) == []


def test_a_record_of_another_build_at_the_path_is_rebuilt(host_dirs: Path) -> None:
    path = f"{host_dirs}/torch-2.13.0-cu126/bin/python"
    cpu = json.dumps({"version": "2.13.0+cpu", "cuda": None, "python": path})
    assert plan({"version": "2.13.0"}, M5_GPUS, cpu).changed
    good = json.dumps({"version": "2.13.0+cu126", "cuda": "12.6", "python": path})
    assert not plan({"version": "2.13.0"}, M5_GPUS, good).changed


def test_isolated_pip_keeps_only_the_hosts_network_settings() -> None:
    from labctl.agent.provision.torch_env import pip_network_flags

    settings = (
        ":env:.cert='/env/ca.crt'\n:env:.find-links='/opt/wheels'\n:env:.default-timeout='180'\n"
        "global.cert='/etc/ca.crt'\nglobal.extra-index-url='file:///opt/pypi/simple'\n"
        "global.trusted-host='a.lan b.lan'\nglobal.constraint='/etc/c.txt'\n"
    )
    flags, ignored = pip_network_flags(settings)
    assert flags == [
        *("--cert", "/env/ca.crt", "--timeout", "180"),
        *("--trusted-host", "a.lan", "--trusted-host", "b.lan"),
    ]
    assert ignored == ["find-links", "extra-index-url", "constraint"]


def test_the_error_line_is_found_under_warnings_and_numpys_notice() -> None:
    from labctl.agent.provision.torch_env import main_error, wrong_build

    pip = "WARNING: Retrying (Retry(total=4))\nERROR: No matching distribution found for torch==2.13.0\n[notice] A new release of pip\n"
    assert main_error(pip) == "No matching distribution found for torch==2.13.0"
    failed = (
        NUMPY_NOISE
        + 'Traceback (most recent call last):\n  File "x"\nOSError: libcudart.so.12: cannot open\n'
    )
    assert main_error(failed) == "OSError: libcudart.so.12: cannot open"
    assert wrong_build({"version": "2.13.0", "cuda": "12.8"}, "2.13.0", "cu126")  # PyPI's plain wheel
    assert wrong_build({"version": "2.13.0", "cuda": "12.6"}, "2.13.0", "cu126") is None


def run_engine(
    tmp_path: Path, params: dict[str, Any], *, json_mode: bool = False
) -> tuple[ResourceResult, str]:
    """provision_host on this machine as a `connection: local` host, through the real agent."""
    out = io.StringIO()
    ctx = Context(
        console=Console(file=out, width=300), inventory_path=tmp_path / "lab.yaml", json_mode=json_mode
    )
    host = Host(name="here", address="127.0.0.1", connection="local", python=sys.executable, gpus=[])
    try:
        [result] = provision_host(
            HostRun(ctx, host, threading.Event()), [Entry("torch_env", params, [], None)], False
        )
    finally:
        ctx.close()
    return result, out.getvalue()


@pytest.mark.slow
def test_progress_of_a_torch_env_build_is_shown_and_kept_in_json(host_dirs: Path, tmp_path: Path) -> None:
    url = index_with(tmp_path / "idx", fake_torch_wheel(tmp_path / "w", "cpu"))
    result, shown = run_engine(tmp_path, {"version": VERSION, "index_url": url})
    assert result.status == "changed", result
    label = f"here: torch_env {VERSION} (auto): "
    for what in ("creating the virtualenv [", "installing torch [", "verifying torch [", "done ["):
        assert label + what in shown, shown
    assert f"s]: from {url}" in shown  # where pip installs from, said before it starts
    assert [e["step"] for e in result.events][-1] == "done"
    assert {"venv", "pip", "verify"} <= {e["step"] for e in result.events}
    assert all(isinstance(e["elapsed"], float) for e in result.events)
    assert result.to_json()["events"] == result.events


@pytest.mark.slow
def test_a_torch_that_does_not_import_fails_on_its_error_not_on_numpys_notice(
    host_dirs: Path, tmp_path: Path
) -> None:
    noise = f"import sys\nsys.stderr.write({NUMPY_NOISE!r})\n"
    broken = (
        noise
        + "raise OSError('libcudart.so.12: cannot open shared object file: No such file or directory')\n"
    )
    url = index_with(tmp_path / "idx", fake_torch_wheel(tmp_path / "w", "cu126", on_import=broken))
    result, shown = run_engine(
        tmp_path, {"version": VERSION, "cuda": "cu126", "index_url": url}, json_mode=True
    )
    assert result.status == "failed"
    log = host_dirs / f"torch-{VERSION}-cu126.log"
    assert result.error == (
        "torch does not import in the new env: OSError: libcudart.so.12: cannot open shared object "
        f"file: No such file or directory. Full log: here:{log}."
    )
    assert "NumPy 1.x" in log.read_text()  # the whole output is kept, in the log
    assert result.hint and "system library" in result.hint
    assert (result.events[-1]["event"], result.events[-1]["step"]) == ("failed", "verify")
    assert shown == "" and result.to_json()["events"] == result.events  # --json: events, no lines
    assert not (host_dirs / f"torch-{VERSION}-cu126").exists() and leftovers(host_dirs) == []
    assert os.listdir(host_dirs) == [log.name]
