"""`labctl bench phase3 --learn`'s pure parts (labctl/phase3/learn.py): the run's settings, with
the caller's --set winning, and the learning figure read from the rewards per step."""

from __future__ import annotations

import pytest

from labctl.phase3.learn import LEARN_SETTINGS, learn_args, learning_curve


def test_the_run_asks_the_trained_tasks_and_a_later_set_wins() -> None:
    args = learn_args(["--set", "lr=3e-3", "--limit", "m5"], ["sum_two", "product_two"], 30)
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    assert sets[:2] == ["steps=30", "rl.tasks=[sum_two,product_two]"]
    assert "rl.group_size=8" in sets and "lr=1e-2" in LEARN_SETTINGS
    # `labctl train` applies --set in order: the caller's come last, so they win.
    assert sets[-1] == "lr=3e-3" and args[-2:] == ["--limit", "m5"]


def test_the_figure_compares_the_first_and_last_steps_and_finds_where_it_doubled() -> None:
    rewards: list[float | None] = [0.1, 0.0, 0.2, None, 0.1, 0.1, 0.3, 0.4, 0.3, 0.5, 0.6, 0.5]
    fig = learning_curve(rewards, window=5)
    assert fig["window"] == 5 and fig["first_mean"] == pytest.approx(0.1)  # None is not a zero
    assert fig["last_mean"] == pytest.approx(0.46) and fig["ratio"] == pytest.approx(4.6)
    # The five judged steps ending at step 8 (3, 5, 6, 7, 8) average 0.22 >= 2 x 0.1; those
    # ending at step 7 (2, 3, 5, 6, 7) 0.14.
    assert fig["doubled_at_step"] == 8
    flat = learning_curve([0.2] * 10, window=5)
    assert flat["ratio"] == 1.0 and flat["doubled_at_step"] is None
    # A start at zero cannot double: "twice nothing" would be any first pass.
    assert learning_curve([0.0] * 5 + [0.5] * 5, window=5)["doubled_at_step"] is None
    short = learning_curve([0.1, 0.3, 0.5])
    assert short["window"] == 1 and short["first_mean"] == 0.1 and short["last_mean"] == 0.5
    assert learning_curve([None, None])["first_mean"] is None
