"""Phase 3's loop (labctl/agent/train/phase3.py) with the lab's parts stood in by functions:
what a step asks, how it judges, what it reports, its baselines, what it counts and when it
stops, what the CET reads, and that its gradient points the right way at the sampling
temperature; and the trainer's step (loop.py) making a step's tries once, OOM retry or not.
(That REINFORCE learns: test_phase3_learning.py.)"""

from __future__ import annotations

import time
from typing import Any

import pytest

from labctl.agent.models.prompting import HINT
from labctl.agent.models.tasks import TASKS
from labctl.agent.orchestra.client import Answer
from labctl.agent.sandbox.client import SandboxError
from labctl.agent.train.phase3 import (
    Phase3,
    Rollout,
    cet_prompt,
    context_text,
    longest_cet_prompt,
    policy_loss,
    program_of,
    rl_batch,
)
from labctl.agent.train.settings import RL_DEFAULTS, TrainerError, min_seq_len, resolve_rl, resolve_settings


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
        self.result_error: str | None = None  # every program's result carries this "error"
        self.finish_reason: str | None = "stop"

    def list_endpoints(self) -> list[Any]:
        return self.endpoints.pop(0) if len(self.endpoints) > 1 else self.endpoints[0]

    def ask(self, endpoints: list[str], prompt: str, **kw: Any) -> list[Answer]:
        self.prompts.append(prompt)
        task = by_name(prompt)
        hint = prompt.rsplit(HINT, 1)[1]
        good = f"```python\n{task.solution}```\n"
        # "hinted" writes the solution when the CET's hint holds a 'q', else nothing useful.
        texts = {"good": good, "bad": "print()", "slow": None, "hinted": good if "q" in hint else "print()"}
        return [
            answer(
                e,
                texts[e],
                retried=e == "bad",
                waited_s=0.5 if e == "bad" else 0.0,
                finish_reason=self.finish_reason if texts[e] is not None else None,
            )
            for e in endpoints
        ]

    def run(self, programs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.run_errors:
            raise self.run_errors.pop(0)
        self.batches.append(programs)
        out: list[dict[str, Any]] = []
        for p in programs:
            if self.result_error is not None:
                out.append(
                    {"lang": "python", "error": self.result_error, "tests": [], "passed": 0, "total": 1}
                )
                continue
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


def alternating_sampler() -> Any:
    """Contexts of 'q's and of 'a's in turn: the "hinted" model solves the task after a 'q'."""
    calls: list[int] = []

    def sample(prompt: list[int], n: int) -> list[int]:
        calls.append(n)
        return [ord("q" if len(calls) % 2 else "a")] * n

    return sample


def test_rl_settings_are_checked_with_the_key_named() -> None:
    assert resolve_rl(None) is None and resolve_rl({}) == RL_DEFAULTS
    with pytest.raises(TrainerError, match=r"unknown keys \['contxt'\]"):
        resolve_rl({"contxt": 3})
    with pytest.raises(TrainerError, match=r"rl\.context_tokens must be an integer >= 1"):
        resolve_rl({"context_tokens": 0})
    with pytest.raises(TrainerError, match=r"rl\.group_size must be an integer >= 1, got 0"):
        resolve_rl({"group_size": 0})
    with pytest.raises(TrainerError, match=r"rl\.max_unjudged_steps must be an integer >= 0, got -1"):
        resolve_rl({"max_unjudged_steps": -1})
    assert resolve_rl({"max_unjudged_steps": 0})["max_unjudged_steps"] == 0  # type: ignore[index]
    need = longest_cet_prompt() + 16
    assert resolve_settings({"seq_len": need, "rl": {"tasks_per_step": 2}})["rl"]["tasks_per_step"] == 2


def test_the_sampling_temperature_must_be_above_zero() -> None:
    # The policy gradient takes the context's log-probabilities at the temperature it was sampled
    # at: greedy decoding (0) has none, so the settings refuse it and say what to set instead.
    with pytest.raises(TrainerError, match=r"rl\.temperature must be above 0, got 0: .*set it to 1\.0"):
        resolve_rl({"temperature": 0})
    assert resolve_rl({"temperature": 0.3, "answer_temperature": 0})["temperature"] == 0.3  # type: ignore[index]


def test_the_cet_reads_the_shared_instruction_first_and_its_task_last() -> None:
    from labctl.agent.models.tasks import prompt_text

    task = TASKS[0]
    view, models = cet_prompt(task), prompt_text(task)
    instruction = models.splitlines()[-1]
    assert instruction.startswith("# Write a Python 3 program")
    assert view == instruction + "\n" + models[: -len(instruction) - 1]  # the same lines, reordered
    assert view.startswith(instruction) and view.endswith(task.prompt.splitlines()[-1] + "\n")
    assert f"\n# Task: {task.name}\n" in view
    # What the CET reads at the old default (seq_len 64, 16 bytes of context): the end of its
    # task's statement, not the line every task shares (which was all of its 48 bytes before).
    p3 = phase3(Lab())
    views = {tuple(p3.prompt_ids(t, 64 - 16)) for t in TASKS}
    assert len(views) > len(TASKS) * 9 // 10  # a family's tasks may end alike (caesar_3, caesar_13)
    assert bytes(p3.prompt_ids(task, 48)) == view.encode()[-48:]
    # With the room the settings demand, the whole view: every task its own.
    full = [bytes(p3.prompt_ids(t, longest_cet_prompt())) for t in TASKS]
    assert full == [cet_prompt(t).encode() for t in TASKS] and len(set(full)) == len(TASKS)
    # The models' prompt is what it was: the statement, the instruction, then the hint.
    lab = Lab()
    phase3(lab).rollouts(1, counting_sampler, need_for(16))
    assert lab.prompts[0].startswith(models) and lab.prompts[0].endswith("# Hint: " + "a" * 16 + "\n")


def need_for(context_tokens: int) -> int:
    return min_seq_len({"context_tokens": context_tokens})


def test_seq_len_must_hold_the_longest_task_and_the_context_naming_the_minimum() -> None:
    longest = max(len(cet_prompt(t).encode()) for t in TASKS)
    assert longest_cet_prompt() == longest and need_for(16) == longest + 16
    with pytest.raises(TrainerError, match=rf"seq_len \(64\) is too short .* at least {longest + 16}$"):
        resolve_settings({"seq_len": 64, "rl": {}})
    with pytest.raises(TrainerError, match=rf"set seq_len to at least {longest + 32}"):
        resolve_settings({"seq_len": longest + 31, "rl": {"context_tokens": 32}})
    assert resolve_settings({"seq_len": longest + 32, "rl": {"context_tokens": 32}})["rl"] is not None
    assert resolve_settings({"seq_len": 16})["rl"] is None  # no loop, no minimum


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
    w = p3.window.flush()
    assert w["reward"] == 0.5 and w["answers_failed"] == 2 and w["answers_retried"] == 2
    # Neither task was judged before and the run expects nothing yet: both judged against 0.
    assert w["tries"] == w["tries_judged"] == 2 and w["baseline"] == 0.0 and w["unjudged_steps"] == 0
    assert [r.advantage for r in rolls] == [0.5, 0.5]
    assert w["answers_cut"] == 0 and w["sandbox_errors"] == 0
    assert w["answer_errors"] == {"slow": "timed out"}  # why, per model, in the step event
    assert w["rotation_wait_s"] == pytest.approx(1.0, abs=0.05)  # bad's two retries lost 0.5 s each
    assert set(w["orchestra_ms"]) == {"good", "bad"} and w["orchestra_ms"]["good"]["p50"] == 100.0
    assert w["executions"] == sum(len(t.tests) for t in TASKS[:2]) * 2 and w["exec_success_rate"] == 1.0
    assert p3.window.flush()["reward"] is None  # flushed: the next window starts empty


def test_the_advantage_is_the_reward_above_its_tasks_moving_baseline() -> None:
    lab = Lab()
    p3 = phase3(lab, baseline_decay=0.5)
    task = TASKS[0]
    again = len(TASKS) + 1  # the step that comes back to the first task
    # The first try of the run: nothing is expected yet, so it teaches as well (a policy loss
    # from the first step on); its task's baseline and the run's move halfway to its reward.
    (r,) = p3.rollouts(1, counting_sampler, 64)
    assert r.reward == 0.5 and r.baseline == 0.0 and r.advantage == 0.5
    assert p3.baselines == {task.name: 0.25} and p3.run_baseline == 0.25
    lab.endpoints = [["good"]]
    (r,) = p3.rollouts(2, counting_sampler, 64)  # a new task starts from the run's level
    assert r.task == TASKS[1] and r.reward == 1.0 and r.baseline == 0.25 and r.advantage == 0.75
    assert p3.run_baseline == 0.625
    (r,) = p3.rollouts(again, counting_sampler, 64)  # the first task again: its own level
    assert r.task == task and r.reward == 1.0 and r.baseline == 0.25 and r.advantage == 0.75
    assert p3.baselines[task.name] == 0.625
    lab.endpoints = [["bad"]]
    (r,) = p3.rollouts(2 * again - 1, counting_sampler, 64)
    assert r.task == task and r.reward == 0.0 and r.advantage == -0.625


def test_an_easy_task_and_a_hard_one_are_each_judged_against_their_own_level() -> None:
    # "hinted" solves a task when the hint holds a 'q': the first task always gets one, the second
    # never. One baseline for both would call the first's every try good and the second's bad.
    # The hard one's tries are never called bad, and the easy one's good fades as its level rises.
    lab = Lab()
    lab.endpoints = [["hinted"]]
    p3 = phase3(lab, tasks_per_step=2, baseline_decay=0.5)
    p3.tasks = TASKS[:2]
    easy_advantages = []
    for step in (1, 2, 3):
        easy, hard = p3.rollouts(step, alternating_sampler(), 64)
        assert (easy.reward, hard.reward) == (1.0, 0.0)
        assert hard.advantage == 0.0 and hard.baseline == 0.0, step
        easy_advantages.append(easy.advantage)
    assert easy_advantages == [1.0, 0.5, 0.25]
    assert p3.baselines == {TASKS[0].name: 0.875, TASKS[1].name: 0.0}
    # The mean of the baselines the window's six tries were judged by (the event rounds to 4 places).
    assert p3.window.flush()["baseline"] == round((0 + 0 + 0.5 + 0 + 0.75 + 0) / 6, 4)


def test_a_group_of_contexts_per_task_is_judged_against_its_mean() -> None:
    lab = Lab()
    lab.endpoints = [["hinted"]]
    p3 = phase3(lab, tasks_per_step=2, group_size=4)
    rolls = p3.rollouts(1, alternating_sampler(), 64)
    assert len(rolls) == 8 and len(lab.prompts) == 8  # every context asked, all in one step
    assert [r.task for r in rolls] == [TASKS[0]] * 4 + [TASKS[1]] * 4 and [r.group for r in rolls[::4]] == [
        0,
        1,
    ]
    assert [r.reward for r in rolls] == [1.0, 0.0] * 4
    # Learning starts at the first step: no level to learn first, each try against its group's mean.
    assert [r.advantage for r in rolls] == [0.5, -0.5] * 4 and {r.baseline for r in rolls} == {0.5}
    assert p3.baselines == {}
    w = p3.window.flush()
    assert w["tries"] == w["tries_judged"] == 8 and w["baseline"] == 0.5
    # A group whose tries all failed to come back has nothing to be judged against, and no rows.
    lab.endpoints = [["slow"]]
    rolls = p3.rollouts(2, alternating_sampler(), 64)
    assert all(r.reward is None and r.advantage == 0.0 for r in rolls)
    assert p3.window.flush()["baseline"] is None


def test_a_program_the_sandbox_could_not_run_and_a_cut_answer_are_counted() -> None:
    lab = Lab()
    lab.endpoints = [["good", "bad"]]
    lab.result_error = "no image for python: run `labctl sandbox images`"
    lab.finish_reason = "length"
    p3 = phase3(lab, tasks_per_step=2)
    rolls = p3.rollouts(1, counting_sampler, 64)
    assert [r.reward for r in rolls] == [None, None]  # left out of the reward, not zero
    w = p3.window.flush()
    assert w["sandbox_errors"] == 4 and w["answers_cut"] == 4 and w["reward"] is None
    assert w["tries"] == 2 and w["tries_judged"] == 0 and w["unjudged_steps"] == 1
    lab.result_error, lab.finish_reason = None, "stop"
    p3.rollouts(2, counting_sampler, 64)
    w = p3.window.flush()
    assert w["sandbox_errors"] == 0 and w["answers_cut"] == 0 and w["unjudged_steps"] == 0


def test_steps_in_a_row_that_judge_nothing_stop_the_run_with_the_reason() -> None:
    lab = Lab()
    lab.endpoints = [["slow"]]
    p3 = phase3(lab, max_unjudged_steps=3)
    p3.rollouts(1, counting_sampler, 64)
    p3.rollouts(2, counting_sampler, 64)
    lab.endpoints = [["good"]]
    p3.rollouts(3, counting_sampler, 64)  # one judged step starts the count again
    assert p3.unjudged_steps == 0
    lab.endpoints = [["slow", "good"]]
    lab.result_error = "no image for python"
    p3.rollouts(4, counting_sampler, 64)
    p3.rollouts(5, counting_sampler, 64)
    with pytest.raises(TrainerError) as err:
        p3.rollouts(6, counting_sampler, 64)
    message = str(err.value)
    assert "nothing was judged for 3 steps in a row (rl.max_unjudged_steps is 3)" in message
    assert "answer from slow: timed out" in message and "sandbox: no image for python" in message
    # 0: never stop.
    p3 = phase3(lab, max_unjudged_steps=0)
    for step in range(1, 8):
        p3.rollouts(step, counting_sampler, 64)
    assert p3.unjudged_steps == 7


def test_a_rotation_that_lists_no_model_is_waited_for_and_counted() -> None:
    lab = Lab()
    lab.endpoints = [[], [], ["good"]]
    p3 = phase3(lab)
    t0 = time.monotonic()
    (r,) = p3.rollouts(1, counting_sampler, 64)
    assert r.reward == 1.0 and time.monotonic() - t0 >= 0.4
    assert p3.window.flush()["rotation_wait_s"] >= 0.4
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

    from labctl.agent.models.tinylm import build_model, make_config

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


def test_the_policy_loss_takes_log_probabilities_at_the_sampling_temperature() -> None:
    import torch

    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    targets = torch.randint(0, 7, (2, 5))
    weights = torch.rand(2, 5)

    def expected(t: float) -> float:
        logp = torch.log_softmax(logits / t, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return float(-(logp * weights).sum() / 2)

    assert policy_loss(logits, targets, weights).item() == pytest.approx(expected(1.0), rel=1e-6)
    for t in (0.5, 2.0):
        got = policy_loss(logits, targets, weights, t).item()
        assert got == pytest.approx(expected(t), rel=1e-6) and got != pytest.approx(expected(1.0), rel=1e-3)
    with pytest.raises(ValueError, match="temperature above 0"):
        policy_loss(logits, targets, weights, 0.0)
    # Its gradient is the sampling distribution's at that temperature: d/dlogits of
    # -log softmax(z / t)[k] is (softmax(z / t) - onehot(k)) / t.
    z = torch.randn(1, 1, 7, requires_grad=True)
    policy_loss(z, torch.tensor([[3]]), torch.ones(1, 1), 0.5).backward()
    want = (torch.softmax(z.detach() / 0.5, -1) - torch.nn.functional.one_hot(torch.tensor(3), 7)) / 0.5
    assert torch.allclose(z.grad, want, atol=1e-6)  # type: ignore[arg-type]


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
    assert "policy loss" not in line  # no try left its baseline: the RL term did not run
    learned = format_event(dict(p3, baseline=0.125, policy_loss=-0.0312))
    assert "reward 0.250 (baseline 0.125, policy loss -0.0312)" in learned


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
    from types import SimpleNamespace

    from rich.console import Console
    from rich.text import Text

    from labctl.hosts.context import Context
    from labctl.output.progress import QUIET, Shown
    from labctl.phase3.bench import _remove
    from labctl.phase3.render import PHASE3_PROGRESS

    inv = tmp_path / "lab.yaml"
    inv.write_text(
        "lab: t\nhosts:\n  here:\n    address: 127.0.0.1\n    connection: local\n    roles: [train]\n"
    )
    folder = tmp_path / "bench-phase3-x"
    (folder / "step-1").mkdir(parents=True)
    ctx = Context(console=Console(file=io.StringIO()), inventory_path=inv)
    said: list[str] = []
    # The lines a person reads, markup gone.
    lines = SimpleNamespace(print=lambda text, **kw: said.append(Text.from_markup(text).plain))
    progress = Shown(lines, PHASE3_PROGRESS)
    try:
        _remove(ctx, str(folder), [], progress)
        assert not folder.exists() and said == []
        # Called from a `finally`: a --limit that names no host is said, never raised.
        _remove(ctx, str(folder), ["--limit", "nosuch"], progress)
        _remove(ctx, str(folder), ["--limit", "nosuch"], QUIET)
    finally:
        ctx.close()
    assert len(said) == 1 and said[0].startswith(
        f"{folder} is left on nosuch (--limit 'nosuch' matches no host"
    )


def rl_trainer(monkeypatch: pytest.MonkeyPatch, lab: Lab, **over: Any) -> Any:
    """A CPU trainer in phase 3 with `lab` standing in for the orchestra and the sandbox."""
    import io

    from labctl.agent.train.trainer import Trainer

    monkeypatch.setattr(Phase3, "_sandbox_runner", staticmethod(lambda: lab.run))
    rl = {"group_size": 2, "tasks_per_step": 1, "context_tokens": 4, "temperature": 0.7}
    settings = {
        "steps": 1,
        "batch_size": 4,
        "seq_len": need_for(4),
        "model": {"vocab": 256, "d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32},
        "mixed_precision": False,
        "checkpoint_dir": None,
        "log_every": 1,
        "rl": rl,
    }
    settings.update(over)
    t = Trainer(settings, out=io.StringIO(), environ={})
    t.setup()
    t.phase3._endpoints, t.phase3._ask = lab.list_endpoints, lab.ask
    return t


def test_a_step_retried_after_an_oom_trains_on_the_tries_it_made_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import json

    import torch

    from labctl.agent.train import loop

    lab = Lab()
    lab.endpoints = [["hinted"]]
    t = rl_trainer(monkeypatch, lab, dynamic_batch_sizing=True)
    sampled: list[int] = []
    contexts = iter([[ord("q")] * 4, [ord("a")] * 4])  # one try rewarded, one not: two rows

    def sample(model: Any, prompt: list[int], n: int, *rest: Any) -> list[int]:
        sampled.append(n)
        return next(contexts)

    temperatures: list[float] = []

    class OutOfMemoryInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")

    def loss_at(logits: Any, targets: Any, weights: Any, temperature: float = 1.0) -> Any:
        temperatures.append(temperature)
        loss = policy_loss(logits, targets, weights, temperature)
        # The first attempt runs out of memory in its backward, after its loss was noted.
        return OutOfMemoryInBackward.apply(loss) if len(temperatures) == 1 else loss

    monkeypatch.setattr(loop, "sample_context", sample)
    monkeypatch.setattr(loop, "policy_loss", loss_at)
    forward = t.module.forward
    rows: list[int] = []

    def counted(x: Any) -> Any:
        rows.append(x.shape[0])
        return forward(x)

    monkeypatch.setattr(t.module, "forward", counted)
    window = t.phase3.window
    flush, noted = window.flush, []

    def flush_noting() -> Any:
        noted.append(list(window.policy_losses))
        return flush()

    monkeypatch.setattr(window, "flush", flush_noting)
    try:
        t.run()
    finally:
        t.close()
    events = [json.loads(line) for line in t.out.getvalue().splitlines()]
    assert [e["batch_size"] for e in events if e["event"] == "batch_resize"] == [2]
    assert rows == [6, 2, 4]  # 4 + 2 rows failed; then 2, and 2 + the same 2 rows
    # The models were asked once per try and the contexts sampled once, whatever the retry.
    assert len(lab.prompts) == 2 and sampled == [4, 4]
    (step,) = [e for e in events if e["event"] == "step"]
    assert step["tries"] == 2 and step["reward"] == 0.5 and step["baseline"] == 0.5
    # Both attempts' policy losses at the sampling temperature; the failed one's left out.
    assert temperatures == [0.7, 0.7] and len(noted) == 1 and len(noted[0]) == 1
    assert step["policy_loss"] == pytest.approx(noted[0][0], abs=1e-6)


def test_the_trainer_refuses_a_seq_len_too_short_for_its_tasks() -> None:
    import io

    from labctl.agent.train.trainer import Trainer

    with pytest.raises(TrainerError, match=rf"set seq_len to at least {longest_cet_prompt() + 16}"):
        Trainer({"seq_len": 256, "rl": {}}, out=io.StringIO(), environ={})


def test_a_warm_model_that_cannot_take_the_requests_stops_the_run_before_it_is_asked() -> None:
    from labctl.agent.orchestra.client import Endpoint

    lab = Lab()
    capped = Endpoint("demo-a", "http://m5:8101/v1", engine="labctl", max_tokens=256, context=4096)
    short = Endpoint("coder", "http://m5:8102/v1", engine="labctl", max_tokens=256, context=320)
    lab.endpoints = [[capped]]
    p3 = phase3(lab, answer_tokens=512)
    with pytest.raises(TrainerError) as e:
        p3.rollouts(1, counting_sampler, 64)
    assert "rl.answer_tokens 512 is above demo-a's cap 256" in str(e.value) and lab.prompts == []
    # The longest prompt (its bytes) and the answer must fit a model's served context too.
    lab.endpoints = [[short]]
    with pytest.raises(TrainerError, match="coder's context of 320"):
        phase3(lab, answer_tokens=64).rollouts(1, counting_sampler, 64)
    assert lab.prompts == []


def test_rl_tasks_names_the_tasks_asked_in_turn_and_refuses_unknown_ones() -> None:
    lab = Lab()
    names = [TASKS[5].name, TASKS[2].name]
    p3 = phase3(lab, tasks=names, tasks_per_step=3)
    assert [r.task.name for r in p3.rollouts(1, counting_sampler, 64)] == [names[0], names[1], names[0]]
    with pytest.raises(TrainerError, match=r"rl.tasks names \['nope'\], which are no phase-3 tasks"):
        resolve_rl({"tasks": [TASKS[0].name, "nope"]})
    for bad in ([], "sum_two", [TASKS[0].name, TASKS[0].name]):
        with pytest.raises(TrainerError, match=r"rl.tasks"):
            resolve_rl({"tasks": bad})
    from labctl.train.phases import Phase3Loop

    assert Phase3Loop(tasks=names).tasks == names
    with pytest.raises(ValueError, match=r"names \['nope'\], which are no phase-3 tasks"):
        Phase3Loop(tasks=["nope"])


def test_the_same_program_for_the_same_task_runs_once_and_judges_every_try_that_wrote_it() -> None:
    lab = Lab()
    lab.endpoints = [["good", "good", "bad"]]  # two servers of one model agree, as a group's tries do
    p3 = phase3(lab, tasks_per_step=2, group_size=3)
    rolls = p3.rollouts(1, counting_sampler, 64)
    (batch,) = lab.batches
    # 2 tasks x 3 contexts x 3 models = 18 programs, of which 2 tasks x 2 programs are distinct.
    assert len(batch) == 4 and len({(p["source"], str(p["tests"])) for p in batch}) == 4
    assert all(len(r.results) == 3 for r in rolls)
    assert [r.reward for r in rolls] == [2 / 3] * 6  # good's two answers pass, bad's fails
    w = p3.window.flush()
    assert w["programs_run"] == 4 and w["tries_judged"] == 6
    # Executions count the tests of every program judged, as before the runs were shared.
    assert w["executions"] == 3 * 3 * sum(len(t.tests) for t in TASKS[:2])
