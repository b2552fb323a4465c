"""The one "Did you mean ...?" (labctl.documents.suggest), as each site words it."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from labctl.documents.suggest import LEADING, did_you_mean


def test_the_closest_known_name_after_a_sentence() -> None:
    assert did_you_mean("rolez", ["roles", "address", "gpus"]) == " Did you mean 'roles'?"


def test_nothing_when_no_name_is_close() -> None:
    assert did_you_mean("zzzz", ["roles", "address"]) == ""
    assert did_you_mean("roles", []) == ""


def test_before_a_sentence_and_with_a_prefix_inside_the_quotes() -> None:
    assert did_you_mean("qwen-7", ["qwen-7b", "llama-8b"], form=LEADING) == "Did you mean 'qwen-7b'? "
    assert did_you_mean("trian", ["train", "storage"], prefix="role:") == " Did you mean 'role:train'?"
    # A user's text in the prefix is not a format string.
    assert did_you_mean("lr", ["lr"], prefix="opt{0}.") == " Did you mean 'opt{0}.lr'?"


@pytest.mark.parametrize(
    "known",
    [["node1", "node2", "node1"], ("node2", "node1"), {"node1": 1, "node2": 2}, iter(["node2", "node1"])],
)
def test_any_iterable_of_names_repeats_and_order_aside(known: Iterable[str]) -> None:
    # node1 and node2 are as close to node3: the pick does not depend on the order given.
    assert did_you_mean("node3", known) == " Did you mean 'node2'?"


def test_a_word_that_is_not_text_is_compared_as_text() -> None:
    assert did_you_mean(5, ["5x", "name"]) == " Did you mean '5x'?"


def test_the_sites_keep_their_wording() -> None:
    from labctl.documents.validation import unknown_key
    from labctl.orchestra.choose import _unknown

    assert (
        unknown_key("rolez", ["roles"])
        == "unknown key 'rolez'. Did you mean 'roles'? Keys allowed here: roles."
    )
    err = _unknown("qwen-7", ["qwen-7b", "llama-8b"], "--in")
    assert (
        err.hint
        == "Did you mean 'qwen-7b'? Name one of: qwen-7b, llama-8b (the models: list of the orchestra file)."
    )
