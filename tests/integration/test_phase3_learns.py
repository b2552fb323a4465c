"""Phase 3 with models that write real code, on the simulated lab: coder models labctl trains on
irina's CPU (`bench make-model --kind coder`), served by m5 through transformers, their programs
run in irina's sandbox service. The reward is above 0 on the tasks they were trained on and the
policy gradient runs on every step; `bench phase3 --learn` finds a warm coder whose hint
matters, asks only its tasks, and reports the reward per step. Each model is served twice from
one folder (`path:`), as a second server of a model is."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ON_THIS_MACHINE, labctl, m5_cache, orchestra_lab, run_json, sh

pytestmark = [pytest.mark.integration, ON_THIS_MACHINE]
CODER, HINT = "p3l-coder", "p3l-hint"  # two tasks each: quick to train on two shared cores
TASKS = ["sum_two", "product_two"]  # the first two whose solution fits: what both learn
CKPT = "/var/lib/labctl/train/p3l-test"
# A CET small enough for two cores shared with the model servers and the sandbox.
CET = [
    "batch_size_per_gpu=2", "seq_len=288", "model.d_model=32", "model.n_layers=1", "model.n_heads=2",
    "model.d_ff=64", "log_every=1", "checkpoint_every=100", "rl.answer_tokens=64",
]  # fmt: skip


def served_twice(name: str) -> list[dict[str, Any]]:
    return [{"name": name, "format": "hf"}, {"name": f"{name}-2", "path": name, "format": "hf"}]


def orchestra(first: str, then: str) -> dict[str, Any]:
    """`first`'s two servers warm (one pinned, the other first in the library), `then`'s two to
    rotate in."""
    return {
        "hosts": "m5",
        "warm": 2,
        "rotate": 1,
        "every": "4h",
        "context": 512,
        "pinned": [first],
        "server": {"python": sys.executable, "start_timeout": 180, "stop_grace": 10, "drain_s": 1},
        "models": served_twice(first) + served_twice(then),
    }


@pytest.fixture(scope="module")
def coders(
    lab: Any, docker_images: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """The lab with m5's cache mounted, a coder and a hint-matters coder on irina (both trained on
    TASKS), irina serving python sandboxes; playbooks/orchestra.yaml keeps the coder warm, and
    learn.yaml beside it the hint-matters one."""
    inv = lab.inventory_path
    with m5_cache(lab):
        for name, extra in ((CODER, []), (HINT, ["--hint-matters"])):
            argv = ["-i", str(inv), "bench", "make-model", "--kind", "coder", "--tasks", "2", "--name", name]
            labctl(*argv, "--host", "irina", "--python", sys.executable, *extra, check=True, timeout=900)

        def python_sandbox(doc: dict[str, Any]) -> None:
            doc["hosts"]["irina"]["sandbox"] = {"languages": ["python"], "pool": 2}

        copy = orchestra_lab(inv, tmp_path_factory.mktemp("p3l"), orchestra(CODER, HINT), python_sandbox)
        (copy.parent / "learn.yaml").write_text(yaml.safe_dump(orchestra(HINT, CODER)))
        try:
            yield copy
        finally:
            labctl("-i", str(copy), "orchestra", "stop", timeout=120)
            labctl("-i", str(copy), "sandbox", "serve", "--stop", timeout=120)
            sh(inv, "m5", f"rm -rf /var/lib/labctl/orchestra {CKPT}")
            sh(inv, "irina", f"rm -rf /srv/models/{CODER} /srv/models/{HINT}")


def newest_steps(inv: Path) -> list[dict[str, Any]]:
    files = sorted((inv.parent / ".labctl" / "runs").glob("*/metrics.jsonl"), key=lambda p: p.stat().st_mtime)
    events = [json.loads(line) for line in files[-1].read_text().splitlines() if line.strip()]
    return [e for e in events if e.get("event") == "step"]


def test_the_coders_programs_pass_and_the_policy_gradient_runs_on_every_step(coders: Path) -> None:
    rc, doc = run_json(coders, "orchestra", "start", timeout=400)
    assert rc == 0, doc
    # Two servers of one folder: both described from the same files, the folder synced once.
    assert sorted(t["model"] for t in doc["joined"]) == [CODER, f"{CODER}-2"], doc
    rc, served = run_json(coders, "sandbox", "serve", timeout=300)
    assert rc == 0, served
    sh(coders, "m5", f"rm -rf {CKPT}")
    argv = ["train", "--phase", "3", "--limit", "m5", "--device", "cpu", "--python", sys.executable]
    own = ["steps=4", f"checkpoint_dir={CKPT}", f"rl.tasks=[{','.join(TASKS)}]", "rl.answer_temperature=0"]
    for s in [*CET, *own, "rl.tasks_per_step=1"]:
        argv += ["--set", s]
    rc, run = run_json(coders, *argv, timeout=900)
    assert rc == 0 and run["state"] == "finished", run
    steps = newest_steps(coders)
    assert [e["step"] for e in steps] == [1, 2, 3, 4]
    # The coder's two tasks in turn (rl.tasks): both servers write the solution, every test passes.
    assert [e["reward"] for e in steps] == [1.0] * 4, steps
    assert all(e["policy_loss"] is not None and e["policy_loss"] != 0 for e in steps), steps
    assert all(set(e["orchestra_ms"]) == {CODER, f"{CODER}-2"} for e in steps)
    # The two servers agree: one program per step went to the sandbox for both answers.
    assert [e["programs_run"] for e in steps] == [1] * 4 and all(e["answers_cut"] == 0 for e in steps)


def test_bench_learn_asks_the_hint_coders_tasks_and_reports_the_reward_per_step(coders: Path) -> None:
    """After the test above: its warm set is a coder whose hint does not matter."""
    bench = ["bench", "phase3", "--learn", "--learn-steps", "3", "--limit", "m5", "--device", "cpu"]
    bench += ["--train-python", sys.executable]
    for s in CET:
        bench += ["--set", s]
    proc = labctl("-i", str(coders), *bench, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "No warm model is a coder model whose hint matters" in proc.stderr
    assert "make-model --kind coder --hint-matters" in proc.stderr

    learn = str(coders.parent / "learn.yaml")
    rc, doc = run_json(coders, "orchestra", "stop", timeout=200)
    assert rc == 0, doc
    rc, doc = run_json(coders, "orchestra", "start", "-f", learn, timeout=400)
    assert rc == 0, doc
    rc, doc = run_json(coders, *bench, "-f", learn, "--set", "rl.group_size=4", timeout=900)
    assert rc == 0, doc
    fig = doc["learning"]
    assert fig["models"] == [HINT, f"{HINT}-2"] and fig["other_models"] == [] and fig["tasks"] == TASKS
    assert fig["steps"] == 3 and len(fig["rewards"]) == 3
    assert all(r is not None and 0.0 <= r <= 1.0 for r in fig["rewards"]), fig
    assert fig["first_mean"] is not None and fig["window"] == 1
    steps = newest_steps(coders)
    # The caller's --set won over the learning run's own (rl.group_size=8): 4 contexts a step.
    assert [e["tries"] for e in steps] == [4, 4, 4] and fig["policy_loss_steps"] == sum(
        1 for e in steps if e["policy_loss"] is not None
    )
