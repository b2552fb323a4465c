"""The reference trainer (labctl/agent/train/trainer.py) on the CPU with real torch and a tiny tinylm.

Most runs are in-process (a Trainer with an empty environment, so never distributed); the
command line, the exit codes and the 2-process DDP run go through real subprocesses.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from labctl.agent.models.tinylm import build_model  # noqa: E402
from labctl.agent.train.ckpt import manifest_name, pt_name  # noqa: E402
from labctl.agent.train.corpus import Corpus, sample_range  # noqa: E402
from labctl.agent.train.settings import DEFAULTS, TrainerError, lr_factor, resolve_settings  # noqa: E402
from labctl.agent.train.trainer import Trainer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PY38 = Path("/root/.pyenv/versions/3.8.18/bin/python3")
TINY = {"vocab": 256, "d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 128}
# Large enough to learn the corpus's transitions within tens of steps.
LEARNS = {"vocab": 256, "d_model": 64, "n_layers": 2, "n_heads": 2, "d_ff": 256}


def settings(tmp_path: Path, **over: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "run_id": "t",
        "phase": 1,
        "steps": 6,
        "batch_size": 8,
        "accumulation_steps": 1,
        "seq_len": 32,
        "model": dict(TINY),
        "lr": 3e-3,
        "warmup_steps": 3,
        "weight_decay": 0.01,
        "grad_clip": 1.0,
        "mixed_precision": True,
        "ema": False,
        "dynamic_batch_sizing": False,
        "checkpoint_dir": str(tmp_path / "ck"),
        "checkpoint_every": 2,
        "keep_checkpoints": 3,
        "metrics_path": None,
        "log_every": 1,
        "seed": 0,
    }
    s.update(over)
    return s


def run_inproc(s: dict[str, Any]) -> list[dict[str, Any]]:
    """One standalone run in this process; its stdout events."""
    out = io.StringIO()
    t = Trainer(s, out=out, environ={})
    try:
        t.setup()
        t.run()
    finally:
        t.close()
    return [json.loads(line) for line in out.getvalue().splitlines()]


def run_cli(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 120
) -> tuple[int, list[dict[str, Any]], str]:
    full = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
        full.pop(key, None)
    full.update(env or {})
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=full
    )
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    return proc.returncode, events, proc.stderr


def of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == kind]


# -- the command line ----------------------------------------------------------------------


def test_standalone_run_learns_and_reports_every_event(tmp_path: Path) -> None:
    s = settings(
        tmp_path, steps=40, batch_size=16, seq_len=64, model=LEARNS, log_every=5, checkpoint_every=20
    )
    s["metrics_path"] = str(tmp_path / "deep" / "er" / "metrics.jsonl")
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(s))
    rc, events, err = run_cli(["-m", "labctl.agent.train.trainer", "--settings", f"@{path}"])
    assert rc == 0, err
    assert path.exists()  # every rank reads the file: it is not consumed
    start = events[0]
    assert start["event"] == "start" and start["world_size"] == 1 and start["device"] == "cpu"
    assert start["precision"] == "fp32" and any("mixed_precision" in n for n in start["notes"])
    assert start["resumed_from"] is None and start["skipped_checkpoints"] == [] and start["restart"] == 0
    assert (start["run_id"], start["phase"]) == ("t", 1)
    assert start["params"] == sum(
        p.numel() for p in build_model(resolve_settings(s)["model_config"]).parameters()
    )
    steps = of(events, "step")
    assert [e["step"] for e in steps] == list(range(5, 41, 5))
    assert all(e["steps"] == 40 and e["tokens_per_s"] > 0 and e["lr"] > 0 for e in steps)
    assert steps[-1]["loss"] < 0.8 * steps[0]["loss"], [e["loss"] for e in steps]
    assert steps[0]["loss"] > 4.5  # it started near ln(256) = 5.55, nothing was loaded
    assert [e["step"] for e in of(events, "checkpoint")] == [20, 40]
    for e in of(events, "checkpoint"):
        assert Path(e["path"]).exists() and len(e["sha256"]) == 64
    done = events[-1]
    assert done["event"] == "done" and done["step"] == 40 and done["loss"] == steps[-1]["loss"]
    metrics = [json.loads(line) for line in Path(s["metrics_path"]).read_text().splitlines()]
    assert metrics == events


def test_config_mismatch_fails_with_one_clear_line(tmp_path: Path) -> None:
    run_inproc(settings(tmp_path, steps=2))
    other = settings(tmp_path, steps=4, model=dict(TINY, d_model=64, n_heads=4))
    rc, events, err = run_cli(["-m", "labctl.agent.train.trainer", "--settings", json.dumps(other)])
    assert rc != 0
    assert of(events, "step") == []
    line = err.strip().splitlines()[-1]
    assert line.startswith("labctl trainer: error: checkpoint dir " + str(tmp_path / "ck"))
    assert "d_model 32 in the checkpoint vs 64 in the settings" in line
    assert "Traceback" not in err
    # Nothing was overwritten: the old run's checkpoints are still there and valid.
    assert sorted(os.listdir(tmp_path / "ck")) == [manifest_name(2), pt_name(2)]


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("{not json", "--settings is not valid JSON"),
        ('{"steps": 0}', "settings: steps must be an integer >= 1, got 0"),
        ('{"model": {"d_model": 30, "n_heads": 4}}', "must be a multiple of n_heads"),
        ('{"grad_clip": "big"}', "settings: grad_clip must be a number"),
        ("@/nonexistent/settings.json", "cannot read settings file /nonexistent/settings.json"),
    ],
)
def test_bad_settings_exit_nonzero_with_one_line(arg: str, message: str) -> None:
    rc, events, err = run_cli(["-m", "labctl.agent.train.trainer", "--settings", arg])
    assert rc == 2 and events == []
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("labctl trainer: error: ") and message in lines[0]


# -- resume and checkpoints --------------------------------------------------------------------


def test_resume_continues_the_step_count(tmp_path: Path) -> None:
    first = run_inproc(settings(tmp_path, steps=6))
    assert [e["step"] for e in of(first, "checkpoint")] == [2, 4, 6]
    second = run_inproc(settings(tmp_path, steps=10))
    start = second[0]
    assert start["resumed_from"] == 6 and start["skipped_checkpoints"] == []
    steps = [e["step"] for e in of(second, "step")]
    assert steps[0] == 7 and steps[-1] == 10
    assert second[-1]["step"] == 10
    # keep_checkpoints=3: the newest three survive.
    assert sorted(os.listdir(tmp_path / "ck")) == sorted(
        n for s in (6, 8, 10) for n in (pt_name(s), manifest_name(s))
    )
    # Asked for no more steps than are done: nothing is trained, nothing rewritten.
    third = run_inproc(settings(tmp_path, steps=10))
    assert third[0]["resumed_from"] == 10 and of(third, "step") == [] and of(third, "checkpoint") == []
    assert third[-1]["event"] == "done" and third[-1]["step"] == 10


def test_resume_is_exactly_an_uninterrupted_run(tmp_path: Path) -> None:
    """Weights, optimizer state and data after a resume are those the run would have had."""
    straight = run_inproc(settings(tmp_path / "a", steps=10, checkpoint_every=0))
    want = {e["step"]: e["loss"] for e in of(straight, "step")}

    s = settings(tmp_path / "b", steps=10, checkpoint_every=0)
    t = Trainer(s, out=io.StringIO(), environ={})
    t.setup()
    t.train_steps(1, 6)
    t.save(6)  # and then the process "dies"
    t.close()
    resumed = run_inproc(s)
    assert resumed[0]["resumed_from"] == 6
    got = {e["step"]: e["loss"] for e in of(resumed, "step")}
    assert sorted(got) == [7, 8, 9, 10]
    for step, loss in got.items():
        assert loss == pytest.approx(want[step], rel=1e-5, abs=1e-5), step


@pytest.fixture(scope="module")
def six_steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint folder with valid steps 2, 4 and 6 (made once, copied by each test)."""
    base = tmp_path_factory.mktemp("six")
    run_inproc(settings(base, steps=6))
    return base / "ck"


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x55
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("flip", "sha256 mismatch"),
        ("truncate", "truncated"),
        ("no-manifest", "manifest missing"),
    ],
)
def test_corrupt_newest_checkpoint_falls_back_to_the_previous(
    tmp_path: Path, six_steps: Path, how: str, reason: str
) -> None:
    shutil.copytree(six_steps, tmp_path / "ck")
    newest = tmp_path / "ck" / pt_name(6)
    if how == "flip":
        _flip(newest)
    elif how == "truncate":
        os.truncate(newest, newest.stat().st_size // 2)
    else:
        os.unlink(tmp_path / "ck" / manifest_name(6))
    events = run_inproc(settings(tmp_path, steps=8))
    start = events[0]
    assert start["resumed_from"] == 4
    assert len(start["skipped_checkpoints"]) == 1
    skipped = start["skipped_checkpoints"][0]
    assert skipped["step"] == 6 and skipped["path"] == str(newest) and reason in skipped["reason"]
    assert [e["step"] for e in of(events, "step")] == [5, 6, 7, 8]
    # Step 6 was trained again and its checkpoint rewritten: now valid.
    assert 6 in [e["step"] for e in of(events, "checkpoint")]


def test_resume_takes_the_newest_step_valid_on_every_host(
    tmp_path: Path, six_steps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another host (faked in the all-gather) lost step 6: every rank resumes from 4."""
    shutil.copytree(six_steps, tmp_path / "ck")
    real_gather = Trainer.gather

    def two_hosts(self: Trainer, obj: Any) -> list[Any]:
        got = real_gather(self, obj)
        if isinstance(obj, dict) and "valid" in obj:
            assert obj["valid"] == [2, 4, 6] and obj["host"] == "here"
            other = {"step": 6, "path": "/elsewhere/step-00000006.pt", "reason": "sha256 mismatch: ..."}
            got.append({"host": "there", "valid": [2, 4], "skipped": [other]})
        return got

    monkeypatch.setattr(Trainer, "gather", two_hosts)
    out = io.StringIO()
    t = Trainer(settings(tmp_path, steps=6), out=out, environ={"LABCTL_HOST": "here"})
    t.setup()
    assert t.resumed_from == 4 and t.step == 4
    skipped = {(e["host"], e["step"]): e["reason"] for e in t.start_event()["skipped_checkpoints"]}
    assert skipped == {
        ("there", 6): "sha256 mismatch: ...",
        ("here", 6): "not valid on every host (missing or invalid on there)",
    }
    t.close()


def test_nothing_valid_starts_over(tmp_path: Path, six_steps: Path) -> None:
    shutil.copytree(six_steps, tmp_path / "ck")
    for step in (2, 4, 6):
        os.unlink(tmp_path / "ck" / manifest_name(step))
    events = run_inproc(settings(tmp_path, steps=2))
    assert events[0]["resumed_from"] is None
    assert sorted(e["step"] for e in events[0]["skipped_checkpoints"]) == [2, 4, 6]
    assert of(events, "step")[0]["step"] == 1


def test_ema_is_kept_saved_and_restored(tmp_path: Path) -> None:
    s = settings(tmp_path, steps=4, ema=True, ema_decay=0.5, checkpoint_every=0)
    run_inproc(s)
    state = torch.load(tmp_path / "ck" / pt_name(4), weights_only=True)
    assert set(state["ema"]) == set(state["model"])
    name = "blocks.0.mlp.fc.weight"
    # An average of past weights: close to the weights, not equal to them.
    assert not torch.equal(state["ema"][name], state["model"][name])
    assert (state["ema"][name] - state["model"][name]).abs().max() < 0.05
    t = Trainer(dict(s, steps=5), out=io.StringIO(), environ={})
    t.setup()
    assert t.ema is not None and t.resumed_from == 4
    assert torch.equal(t.ema[[n for n, _ in t.module.named_parameters()].index(name)], state["ema"][name])
    t.close()


# -- the step ------------------------------------------------------------------------------------


def test_accumulation_equals_one_bigger_batch(tmp_path: Path) -> None:
    two = run_inproc(
        settings(tmp_path / "a", steps=8, batch_size=4, accumulation_steps=2, checkpoint_dir=None)
    )
    one = run_inproc(
        settings(tmp_path / "b", steps=8, batch_size=8, accumulation_steps=1, checkpoint_dir=None)
    )
    assert two[0]["global_batch"] == one[0]["global_batch"] == 8
    a = [e["loss"] for e in of(two, "step")]
    b = [e["loss"] for e in of(one, "step")]
    assert len(a) == len(b) == 8 and a[-1] < a[0]
    assert a == pytest.approx(b, rel=1e-4)
    # Not trivially equal: a different split of the same number of sequences trains differently.
    other = run_inproc(settings(tmp_path / "c", steps=8, batch_size=8, seed=1, checkpoint_dir=None))
    assert [e["loss"] for e in of(other, "step")] != pytest.approx(b, rel=1e-4)


def test_cuda_oom_halves_the_micro_batch_and_retries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = settings(
        tmp_path, steps=4, batch_size=8, accumulation_steps=1, dynamic_batch_sizing=True, checkpoint_dir=None
    )
    reference = [e["loss"] for e in of(run_inproc(s), "step")]
    out = io.StringIO()
    t = Trainer(s, out=out, environ={})
    t.setup()
    forward = t.module.forward
    calls: list[int] = []

    def small_memory(x: Any) -> Any:
        calls.append(x.shape[0])
        if x.shape[0] > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
        return forward(x)

    monkeypatch.setattr(t.module, "forward", small_memory)
    t.run()
    t.close()
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    resizes = of(events, "batch_resize")
    assert [(e["batch_size"], e["accumulation_steps"]) for e in resizes] == [(4, 2), (2, 4)]
    assert resizes[0]["step"] == 1 and "out of memory" in resizes[0]["reason"]
    assert calls[:2] == [8, 4] and set(calls[2:]) == {2}
    # Same samples per step, split finer: the same training.
    assert [e["loss"] for e in of(events, "step")] == pytest.approx(reference, rel=1e-4)


def test_oom_without_dynamic_batch_sizing_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = Trainer(settings(tmp_path, steps=2, checkpoint_dir=None), out=io.StringIO(), environ={})
    t.setup()

    def no_memory(x: Any) -> Any:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(t.module, "forward", no_memory)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        t.run()
    t.close()


def test_lr_warms_up_then_decays_to_a_tenth() -> None:
    assert [lr_factor(i, 4, 20) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(4, 4, 20) == 1.0
    mid = lr_factor(12, 4, 20)
    assert 0.1 < mid < 1.0 and mid == pytest.approx(0.55)
    assert lr_factor(20, 4, 20) == pytest.approx(0.1) and lr_factor(50, 4, 20) == pytest.approx(0.1)
    assert lr_factor(0, 0, 10) == 1.0


def test_settings_fill_defaults_per_key() -> None:
    s = resolve_settings({"model": {"d_model": 128, "n_heads": 4}, "gradient_scaling": {"enabled": False}})
    assert s["model"]["n_layers"] == DEFAULTS["model"]["n_layers"]
    assert s["model_config"]["d_model"] == 128 and s["model_config"]["max_seq"] == s["seq_len"]
    assert s["gradient_scaling"]["growth_interval"] == 2000 and s["gradient_scaling"]["enabled"] is False
    with pytest.raises(TrainerError, match="ema_decay must be below 1"):
        resolve_settings({"ema_decay": 1.0})
    with pytest.raises(TrainerError, match=r"gradient_scaling\.growth_interval"):
        resolve_settings({"gradient_scaling": {"growth_interval": 0}})


# -- the corpus ------------------------------------------------------------------------------------


def test_corpus_batches_are_a_pure_function_of_their_coordinates() -> None:
    a, b = Corpus(3, 256, 32), Corpus(3, 256, 32)
    x1, y1 = a.batch(10, 1, 1, 2, 4, 2)
    x2, y2 = b.batch(10, 1, 1, 2, 4, 2)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert x1.shape == (4, 32) and torch.equal(x1[:, 1:], y1[:, :-1])  # targets are the next bytes
    assert not torch.equal(a.batch(11, 1, 1, 2, 4, 2)[0], x1)  # another step
    assert not torch.equal(a.batch(10, 0, 1, 2, 4, 2)[0], x1)  # another micro-step
    assert not torch.equal(a.batch(10, 1, 0, 2, 4, 2)[0], x1)  # another rank
    assert not torch.equal(Corpus(4, 256, 32).batch(10, 1, 1, 2, 4, 2)[0], x1)  # another seed
    assert int(a.tokens.min()) >= 32 and int(a.tokens.max()) <= 126  # printable bytes
    small = Corpus(0, 50, 16)
    assert int(small.tokens.max()) < 50


@pytest.mark.parametrize(("world", "batch", "acc"), [(1, 8, 1), (1, 4, 2), (2, 4, 1), (2, 2, 2), (4, 1, 2)])
def test_every_layout_of_a_step_covers_the_same_samples(world: int, batch: int, acc: int) -> None:
    c = Corpus(0, 256, 16)
    want, _ = c.samples(5, 0, 8)
    parts = [c.batch(5, m, r, world, batch, acc)[0] for r in range(world) for m in range(acc)]
    assert torch.equal(torch.cat(parts), want)
    assert sample_range(1, 1, batch, acc)[0] == (acc + 1) * batch


def _conditional_entropy(context: Any, nxt: Any, n: int) -> float:
    """H(next | context) in nats, from counts; context ids in [0, n)."""
    counts = torch.zeros(n, 95, dtype=torch.float64)
    counts.index_put_((context, nxt), torch.ones(len(nxt), dtype=torch.float64), accumulate=True)
    rows = counts[counts.sum(1) > 0]
    p = rows / rows.sum(1, keepdim=True)
    h = -(p * p.clamp_min(1e-300).log()).sum(1)
    return float((h * rows.sum(1)).sum() / rows.sum())


def test_corpus_has_structure_to_learn() -> None:
    c = Corpus(0, 256, 32)
    rows = c.tokens.view(c.chains, c.chain_len) - 32  # pairs across two chains are no transitions
    assert int(rows.min()) == 0 and int(rows.max()) == 94
    a, b, nxt = rows[:, :-2].reshape(-1), rows[:, 1:-1].reshape(-1), rows[:, 2:].reshape(-1)
    first = _conditional_entropy(b, nxt, 95)
    second = _conditional_entropy(a * 95 + b, nxt, 95 * 95)
    # Far below ln 95 = 4.55 given one byte (8 successors: at most ln 8 = 2.08), lower given two.
    assert first < 2.08
    assert second < first - 0.15


# -- distributed ----------------------------------------------------------------------------------


def test_two_process_ddp_on_gloo(tmp_path: Path) -> None:
    s = settings(
        tmp_path,
        steps=30,
        batch_size=4,
        accumulation_steps=2,
        seq_len=64,
        model=LEARNS,
        log_every=5,
        checkpoint_every=15,
    )
    rc, events, err = run_cli(
        [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "labctl.agent.train.trainer",
            "--settings",
            json.dumps(s),
        ],
        timeout=180,
    )
    assert rc == 0, err[-3000:]
    # Only rank 0 speaks on stdout.
    assert len(of(events, "start")) == 1 and len(of(events, "done")) == 1
    start = events[0]
    assert start["world_size"] == 2 and start["backend"] == "gloo" and start["global_batch"] == 16
    steps = of(events, "step")
    assert [e["step"] for e in steps] == [5, 10, 15, 20, 25, 30]
    assert steps[-1]["loss"] < 0.8 * steps[0]["loss"]
    assert events[-1]["replicas_agree"] is True
    assert [e["step"] for e in of(events, "checkpoint")] == [15, 30]
    # Only local rank 0 writes, and what it wrote loads into a fresh model.
    state = torch.load(tmp_path / "ck" / pt_name(30), weights_only=True)
    model = build_model(resolve_settings(s)["model_config"])
    model.load_state_dict(state["model"])
    assert state["world_size"] == 2 and state["step"] == 30
    assert not [n for n in os.listdir(tmp_path / "ck") if n.endswith(".tmp")]


# -- packaging -------------------------------------------------------------------------------------


AGENT_MODULES = ("labctl.agent.train.trainer", "labctl.agent.train.ckpt", "labctl.agent.train.corpus")
NO_TORCH = (
    "import sys\n"
    "class Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in ('torch', 'numpy'):\n"
    "            raise ImportError('no ' + name + ' on this host')\n"
    "sys.meta_path.insert(0, Block())\n"
    "import " + ", ".join(AGENT_MODULES) + "\n"
    "from labctl.agent.train.settings import load_settings\n"
    "print(load_settings('{}')['model_config']['d_model'])\n"
)


def test_agent_modules_import_without_torch() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", NO_TORCH], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(DEFAULTS["model"]["d_model"])


@pytest.mark.skipif(not PY38.exists(), reason=f"no Python 3.8 interpreter at {PY38}")
def test_agent_modules_import_under_python38() -> None:
    proc = subprocess.run([str(PY38), "-c", NO_TORCH], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
