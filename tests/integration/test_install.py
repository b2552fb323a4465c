"""README's user install, as a newcomer does it: a wheel built from the checkout, installed into a
fresh venv outside the repository, then run from a folder that is not the checkout."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# pip's own words when it cannot reach an index (or the index lacks the pinned dependencies).
NO_INDEX = re.compile(
    r"NewConnectionError|Temporary failure in name resolution|Could not fetch URL|ConnectTimeout|"
    r"ProxyError|Network is unreachable|No matching distribution found"
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def run(argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    # Nothing of the checkout or this session leaks in: no PYTHONPATH, no inventory, no venv.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "LABCTL_INVENTORY", "VIRTUAL_ENV", "COLUMNS", "LINES")
    }
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_a_wheel_installed_outside_the_checkout_inits_a_lab_that_validates(tmp_path: Path) -> None:
    import tomllib

    if REPO in tmp_path.parents:
        pytest.skip("the temporary folder is inside the checkout; the point is to be outside it")
    dist, venv, elsewhere = tmp_path / "dist", tmp_path / "venv", tmp_path / "elsewhere"
    elsewhere.mkdir()
    # README: `pip wheel --no-deps . -w dist/`. No build isolation here: this venv already has
    # setuptools, so building needs no index.
    built = run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            ".",
            "-w",
            str(dist),
        ],
        cwd=REPO,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = dist.glob("labctl-*.whl")
    made = run([sys.executable, "-m", "venv", str(venv)], cwd=elsewhere)
    assert made.returncode == 0, made.stderr
    py, labctl = venv / "bin/python", venv / "bin/labctl"
    installed = run(
        [str(py), "-m", "pip", "install", "-q", "--retries", "1", "--timeout", "20", str(wheel)], elsewhere
    )
    if installed.returncode and NO_INDEX.search(installed.stdout + installed.stderr):
        pytest.skip(f"pip cannot reach an index for labctl's dependencies: {installed.stderr.strip()[-300:]}")
    assert installed.returncode == 0, installed.stderr

    # The installed package runs, not the checkout's.
    where = run([str(py), "-c", "import labctl; print(labctl.__file__)"], elsewhere)
    assert where.stdout.startswith(str(venv)), where.stdout

    version = run([str(labctl), "--version"], elsewhere)
    assert version.returncode == 0, version.stderr
    expected = re.search(r'__version__ = "([^"]+)"', (REPO / "labctl/__init__.py").read_text())
    assert expected and version.stdout.strip() == f"labctl {expected.group(1)}"

    # init writes the package's data: the inventory where the default lookup finds it, the playbooks.
    lab = tmp_path / "x"
    init = run([str(labctl), "init", str(lab)], elsewhere)
    assert init.returncode == 0, init.stderr
    assert (lab / "playbooks/train.yaml").read_bytes() == (REPO / "playbooks/train.yaml").read_bytes()
    assert (lab / "playbooks/provision.yaml").read_bytes() == (REPO / "playbooks/provision.yaml").read_bytes()
    valid = run([str(labctl), "-i", str(lab / "inventory/lab.yaml"), "inventory", "validate"], elsewhere)
    assert valid.returncode == 0, valid.stderr
    # In the lab's folder, with no -i at all.
    here = run([str(labctl), "inventory", "validate"], lab)
    assert here.returncode == 0, here.stderr
    settings = run([str(labctl), "train", "settings"], lab)
    assert settings.returncode == 0 and "batch_size_per_gpu" in settings.stderr, settings.stderr

    # An extra's hint names this venv's interpreter, so what it says installs where labctl runs.
    hint = run(
        [str(py), "-c", "from labctl.output.errors import install_extra; print(install_extra('cloud'))"], lab
    )
    cloud = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cloud"]
    assert hint.stdout.strip() == f"{py} -m pip install {' '.join(cloud)}", hint.stdout
