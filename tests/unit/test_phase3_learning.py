"""Phase 3's REINFORCE learns, with no server: a judge that rewards a context holding the byte
'q' stands in for the warm models and the sandbox, and the trainer's own parts (tinylm,
sample_context, rl_batch, policy_loss, Phase3, AdamW as setup.py makes it) must take a random
CET from rarely writing a 'q' to nearly always, within a bounded, seeded number of updates."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from labctl.agent.models.prompting import HINT  # noqa: E402
from labctl.agent.models.tasks import TASKS  # noqa: E402
from labctl.agent.models.tinylm import build_model, make_config  # noqa: E402
from labctl.agent.orchestra.client import Answer  # noqa: E402
from labctl.agent.train.phase3 import Phase3, policy_loss, rl_batch, sample_context  # noqa: E402
from labctl.agent.train.settings import min_seq_len, resolve_rl  # noqa: E402

WANTED = "q"
CONTEXT = 16  # bytes per context: a random CET writes a given byte in about 6% of them
MAX_UPDATES = 100  # seeds 0-9 reach 0.8 within 50 updates in both settings below
CHECK_EVERY = 10


def judge_ask(endpoints: list[str], prompt: str, **kw: Any) -> list[Answer]:
    """One "model" that writes a program printing the wanted byte when the CET's hint holds it."""
    hint = prompt.rsplit(HINT, 1)[1]
    a = Answer(endpoints[0])
    a.text, a.latency_s = (f"print({WANTED!r})" if WANTED in hint else "print()"), 0.001
    return [a]


def judge_run(programs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The "sandbox": one test, passed by a program that prints the wanted byte."""
    out = []
    for p in programs:
        ok = WANTED in p["source"]
        test = {"ok": ok, "exit_code": 0, "timed_out": False}
        out.append({"lang": "python", "passed": int(ok), "total": 1, "tests": [test]})
    return out


@pytest.fixture
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize(
    ("group_size", "tasks_per_step", "tasks"),
    [
        (8, 1, len(TASKS)),  # the group baseline: every task's contexts against each other
        (1, 4, 4),  # the per-task moving average, on 4 tasks so that each comes back every step
    ],
)
def test_reinforce_teaches_the_cet_to_write_what_the_judge_rewards(
    one_thread: None, group_size: int, tasks_per_step: int, tasks: int
) -> None:
    rl = resolve_rl(
        {
            "context_tokens": CONTEXT,
            "group_size": group_size,
            "tasks_per_step": tasks_per_step,
            "temperature": 1.0,
        }
    )
    assert rl is not None
    seq_len = min_seq_len(rl)  # the CET sees every task's whole prompt, as the settings demand
    torch.manual_seed(0)
    config = make_config(vocab=256, d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq=seq_len, dtype="fp32")
    model = build_model(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)

    def sample(prompt: list[int], n: int) -> list[int]:
        return sample_context(model, prompt, n, rl["temperature"], gen, "cpu", contextlib.nullcontext)

    p3 = Phase3(rl, endpoints=lambda: ["judge"], ask=judge_ask, run=judge_run)
    p3.tasks = TASKS[:tasks]
    # The mean reward of 64 fresh contexts, judged the same way, that teach nothing.
    judge = Phase3(
        resolve_rl({"context_tokens": CONTEXT, "group_size": 64}) or {},
        endpoints=lambda: ["judge"],
        ask=judge_ask,
        run=judge_run,
    )

    def mean_reward() -> float:
        rolls = judge.rollouts(1, sample, seq_len)
        return sum(float(r.reward or 0.0) for r in rolls) / len(rolls)

    started = time.monotonic()
    first = mean_reward()
    assert first <= 0.2, first
    reached, updates = first, 0
    for step in range(1, MAX_UPDATES + 1):
        rolls = p3.rollouts(step, sample, seq_len)
        batch = rl_batch(rolls, seq_len, "cpu")
        if batch is not None:
            x, y, w = batch
            loss = policy_loss(model(x), y, w, rl["temperature"])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        updates = step
        if step % CHECK_EVERY == 0:
            reached = mean_reward()
            if reached >= 0.8:
                break
    seconds = time.monotonic() - started
    print(
        f"group_size {group_size}: mean reward {first:.2f} -> {reached:.2f} in {updates} updates, {seconds:.1f} s"
    )
    assert reached >= 0.8, f"mean reward {first:.2f} -> {reached:.2f} after {updates} updates"
    flushed = p3.window.flush()
    assert flushed["tries"] == updates * group_size * tasks_per_step and flushed["baseline"] is not None
