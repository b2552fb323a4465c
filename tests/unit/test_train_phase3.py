"""Phase 3's loop (labctl/agent/train/phase3.py) with the lab's parts stood in by functions:
what a step asks, how it judges, what it reports, and that its gradient points the right way."""

from __future__ import annotations

import time
from typing import Any

import pytest

from labctl.agent.orchestra.client import Answer
from labctl.agent.sandbox.client import SandboxError
from labctl.agent.train.phase3 import Phase3, context_text, policy_loss, program_of, rl_batch
from labctl.agent.train.settings import RL_DEFAULTS, TrainerError, resolve_rl, resolve_settings
from labctl.agent.train.tasks import TASKS


def answer(name: str, text: str | None, latency: float = 0.1, **kw: Any) -> Answer:
    a = Answer(name)
    a.text, a.latency_s = text, latency
    if text is None:
        a.error, a.kind = "timed out", "timeout"
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def by_name(prompt: str) -> Any:
    """The task a prompt is about: its header names it."""
    (task,) = [t for t in TASKS if f"# Task: {t.name}\n" in prompt]
    return task


class Lab:
    """The warm set and the sandbox, as a step sees them: "good" answers every task with its
    reference solution, "bad" with a program that prints nothing, "slow" times out."""

    def __init__(self) -> None:
        self.endpoints: list[Any] = [["good", "bad", "slow"]]
        self.prompts: list[str] = []
        self.batches: list[list[dict[str, Any]]] = []
        self.run_errors: list[SandboxError] = []

    def list_endpoints(self) -> list[Any]:
        return self.endpoints.pop(0) if len(self.endpoints) > 1 else self.endpoints[0]

    def ask(self, endpoints: list[str], prompt: str, **kw: Any) -> list[Answer]:
        self.prompts.append(prompt)
        task = by_name(prompt)
        texts = {"good": f"```python\n{task.solution}```\n", "bad": "print()", "slow": None}
        return [
            answer(e, texts[e], retried=e == "bad", waited_s=0.5 if e == "bad" else 0.0) for e in endpoints
        ]

    def run(self, programs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.run_errors:
            raise self.run_errors.pop(0)
        self.batches.append(programs)
        out = []
        for p in programs:
            task = next(t for t in TASKS if t.as_program(p["source"])["tests"] == p["tests"])
            ok = p["source"] == task.solution
            tests = [{"ok": ok, "exit_code": 0, "timed_out": False} for _ in p["tests"]]
            out.append(
                {"lang": "python", "passed": len(tests) if ok else 0, "total": len(tests), "tests": tests}
            )
        return out


def phase3(lab: Lab, **rl: Any) -> Phase3:
    return Phase3(resolve_rl(rl) or {}, endpoints=lab.list_endpoints, ask=lab.ask, run=lab.run)


def counting_sampler(prompt: list[int], n: int) -> list[int]:
    return [ord("a")] * n


def test_rl_settings_are_checked_with_the_key_named() -> None:
    assert resolve_rl(None) is None and resolve_rl({}) == RL_DEFAULTS
    with pytest.raises(TrainerError, match=r"unknown keys \['contxt'\]"):
        resolve_rl({"contxt": 3})
    with pytest.raises(TrainerError, match=r"rl\.context_tokens must be an integer >= 1"):
        resolve_rl({"context_tokens": 0})
    with pytest.raises(TrainerError, match=r"seq_len \(16\) must be longer than rl\.context_tokens \(16\)"):
        resolve_settings({"seq_len": 16, "rl": {"context_tokens": 16}})
    assert resolve_settings({"seq_len": 64, "rl": {"tasks_per_step": 2}})["rl"]["tasks_per_step"] == 2


def test_a_step_asks_every_warm_model_runs_their_code_and_judges_by_pass_rate() -> None:
    lab = Lab()
    p3 = phase3(lab, tasks_per_step=2, context_tokens=4)
    rolls = p3.rollouts(1, counting_sampler, 64)
    assert [r.task.name for r in rolls] == [TASKS[0].name, TASKS[1].name]
    # Each prompt is the task's statement and the CET's context; the models' fenced code is run.
    assert all(p.endswith("# Hint: aaaa\n") for p in lab.prompts)
    (batch,) = lab.batches  # one sandbox batch per step, every answer of every task in it
    assert len(batch) == 4 and batch[0]["source"] == TASKS[0].solution and batch[0]["timeout"] == 5.0
    # good passes all, bad none; slow's timeout is left out of the reward, not counted as zero.
    assert [r.reward for r in rolls] == [0.5, 0.5]
    w = p3.window.flush(p3.baseline)
    assert w["reward"] == 0.5 and w["answers_failed"] == 2 and w["answers_retried"] == 2
    assert w["answer_errors"] == {"slow": "timed out"}  # why, per model, in the step event
    assert w["rotation_wait_s"] == pytest.approx(1.0, abs=0.05)  # bad's two retries lost 0.5 s each
    assert set(w["orchestra_ms"]) == {"good", "bad"} and w["orchestra_ms"]["good"]["p50"] == 100.0
    assert w["executions"] == sum(len(t.tests) for t in TASKS[:2]) * 2 and w["exec_success_rate"] == 1.0
    assert p3.window.flush(p3.baseline)["reward"] is None  # flushed: the next window starts empty


def test_the_advantage_is_the_reward_above_a_moving_baseline() -> None:
    lab = Lab()
    p3 = phase3(lab, baseline_decay=0.5)
    (r,) = p3.rollouts(1, counting_sampler, 64)
    assert r.reward == 0.5 and r.advantage == 0.0 and p3.baseline == 0.5  # the first step sets the level
    lab.endpoints = [["good"]]
    (r,) = p3.rollouts(2, counting_sampler, 64)
    assert r.reward == 1.0 and r.advantage == 0.5 and p3.baseline == 0.75
    lab.endpoints = [["bad"]]
    (r,) = p3.rollouts(3, counting_sampler, 64)
    assert r.reward == 0.0 and r.advantage == -0.75


def test_a_rotation_that_lists_no_model_is_waited_for_and_counted() -> None:
    lab = Lab()
    lab.endpoints = [[], [], ["good"]]
    p3 = phase3(lab)
    t0 = time.monotonic()
    (r,) = p3.rollouts(1, counting_sampler, 64)
    assert r.reward == 1.0 and time.monotonic() - t0 >= 0.4
    assert p3.window.flush(p3.baseline)["rotation_wait_s"] >= 0.4
    lab.endpoints = [[]]
    p3 = phase3(lab, wait_s=0.3)
    with pytest.raises(TrainerError, match=r"no warm model to ask for 0.3 s .*labctl orchestra status"):
        p3.rollouts(1, counting_sampler, 64)


def test_the_sandbox_is_tried_again_but_a_refusal_stops_the_run() -> None:
    lab = Lab()
    lab.run_errors = [SandboxError("busy", 503), SandboxError("no answer", 0)]
    p3 = phase3(lab, sandbox_tries=3)
    (r,) = p3.rollouts(1, counting_sampler, 64)
    assert r.reward == 0.5 and p3.window.sandbox_errors == 2
    lab.run_errors = [SandboxError("HTTP 401: send Authorization", 401)]
    with pytest.raises(TrainerError, match="the sandbox service failed 1 times: HTTP 401"):
        p3.rollouts(2, counting_sampler, 64)


def test_each_rank_takes_its_own_tasks_in_turn() -> None:
    lab = Lab()
    ranks = [
        Phase3(resolve_rl({"tasks_per_step": 2}) or {}, r, 2, 256, lab.list_endpoints, lab.ask, lab.run)
        for r in (0, 1)
    ]
    names = [[t.name for t in p.tasks_for(s)] for s in (1, 2) for p in ranks]
    flat = [n for step in names for n in step]
    assert flat == [t.name for t in TASKS[:8]]  # no task twice within a step, none skipped
    assert ranks[0].tasks_for(len(TASKS)) != ranks[0].tasks_for(1) or len(TASKS) % 4 == 0


def test_what_the_models_write_and_read() -> None:
    assert program_of("Here:\n```python\nprint(1)\n```\nDone") == "print(1)\n"
    assert program_of("```\nprint(2)\n") == "print(2)\n"  # cut off before its closing fence
    assert program_of("print(3)") == "print(3)"
    assert context_text([104, 105, 0, 200, 126]) == "hi??~"


def test_the_policy_gradient_raises_a_rewarded_context_and_lowers_a_punished_one() -> None:
    import torch

    from labctl.agent.tinylm import build_model, make_config
    from labctl.agent.train.phase3 import Rollout

    torch.manual_seed(0)
    model = build_model(make_config(vocab=256, d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq=16))
    prompt, context = [10, 11, 12], [40, 41]
    roll = Rollout(TASKS[0], prompt, context)
    roll.advantage = 0.5
    x, y, w = rl_batch([roll], 16, "cpu")  # type: ignore[misc]
    assert x[0, :5].tolist() == [10, 11, 12, 40, 41] and x[0, 5:].eq(0).all()
    # The weight sits where the model predicts each context token: positions 2 and 3.
    assert w[0].nonzero().flatten().tolist() == [2, 3] and w[0, 2].item() == 0.25
    assert y[0, 2].item() == 40 and y[0, 3].item() == 41

    def logp() -> float:
        with torch.no_grad():
            lp = torch.log_softmax(model(x)[0], -1)
        return float(lp[2, 40] + lp[3, 41])

    for advantage, rises in ((0.5, True), (-0.5, False)):
        roll.advantage = advantage
        x, y, w = rl_batch([roll], 16, "cpu")  # type: ignore[misc]
        before = logp()
        loss = policy_loss(model(x), y, w)
        assert loss.item() == pytest.approx(-advantage * before / 2, rel=1e-4)
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.05 * p.grad
        assert (logp() > before) is rises
    roll.advantage = 0.0
    assert rl_batch([roll], 16, "cpu") is None  # nothing to learn from a try at the baseline


def test_the_controller_shows_a_phase3_step_with_its_reward_and_slowest_model() -> None:
    from labctl.train.launch import format_event

    step = {
        "event": "step",
        "step": 3,
        "steps": 8,
        "loss": 5.5,
        "lr": 1e-3,
        "tokens_per_s": 200,
        "restart": 0,
    }
    plain = format_event(step)
    assert "reward" not in plain  # phases 1, 2 and 4 read as before
    p3 = dict(step, reward=0.25, exec_success_rate=0.5, answers_failed=0, rotation_wait_s=0.0)
    p3["orchestra_ms"] = {
        "a": {"p50": 500.0, "p95": 900.0, "n": 2},
        "b": {"p50": 600.0, "p95": 1100.0, "n": 2},
    }
    line = format_event(p3)
    assert line.startswith(plain) and "reward 0.250" in line and "code ran 50%" in line
    assert "2 models p95 1,100 ms" in line and "rotation wait" not in line
    waited = format_event(dict(p3, rotation_wait_s=0.31, answers_failed=1))
    assert "rotation wait 0.31 s" in waited and "1 answers failed" in waited


def test_steps_inside_a_rotations_window_are_timed_against_the_others() -> None:
    from labctl.phase3.bench import window_rates

    # steps every 1 s, but the two that overlap the window [10.5, 12.5] took 2 s
    times = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 15, 16]
    steps = [
        {"step": i + 1, "time": float(t), "answers_failed": 0, "reward": 0.0} for i, t in enumerate(times)
    ]
    r = window_rates(steps, 10.5, 12.5)
    assert (r["steps_inside"], r["steps_outside"]) == (2, 11)
    assert (
        r["steps_per_s_inside"] == 0.5 and r["steps_per_s_outside"] == 1.0 and r["inside_over_outside"] == 0.5
    )
    assert r["failed_steps"] == 0 and r["window_s"] == 2.0
    # A step that lost an answer, or judged none, is a failed step.
    steps[5]["answers_failed"], steps[6]["reward"] = 1, None
    assert window_rates(steps, 10.5, 12.5)["failed_steps"] == 2
    # No step inside the window: no ratio, not a made-up one.
    assert window_rates(steps, 100.0, 101.0)["inside_over_outside"] is None


def test_the_measured_runs_checkpoints_are_removed_and_a_failure_is_said_not_raised(tmp_path: Any) -> None:
    import io

    from rich.console import Console

    from labctl.hosts.context import Context
    from labctl.phase3.bench import _remove

    inv = tmp_path / "lab.yaml"
    inv.write_text(
        "lab: t\nhosts:\n  here:\n    address: 127.0.0.1\n    connection: local\n    roles: [train]\n"
    )
    folder = tmp_path / "bench-phase3-x"
    (folder / "step-1").mkdir(parents=True)
    ctx = Context(console=Console(file=io.StringIO()), inventory_path=inv)
    said: list[str] = []
    try:
        _remove(ctx, str(folder), [], said.append)
        assert not folder.exists() and said == []
        # Called from a `finally`: a --limit that names no host is said, never raised.
        _remove(ctx, str(folder), ["--limit", "nosuch"], said.append)
        _remove(ctx, str(folder), ["--limit", "nosuch"], None)
    finally:
        ctx.close()
    assert len(said) == 1 and said[0].startswith(
        f"{folder} is left on nosuch (--limit 'nosuch' matches no host"
    )
