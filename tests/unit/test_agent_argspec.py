"""The agent's argument specs (`takes` of @command, labctl/agent/core/spec.py): every command's args are checked once,
before its handler runs, so a bad call is refused as bad_args naming the command and the
argument instead of failing deep in the handler with a KeyError or TypeError."""

from __future__ import annotations

import json
from typing import Any

import pytest

from labctl.agent import __main__ as agent_main
from labctl.agent import commands
from labctl.agent.core.errors import AgentError
from labctl.agent.core.spec import NUMBER_OR_NULL, Opt, Or, Takes, command


def refused(command: str, args: dict[str, Any]) -> str:
    with pytest.raises(AgentError) as info:
        commands.call(command, args)
    assert info.value.kind == "bad_args"
    assert info.value.message.startswith(f"{command}: ")
    return info.value.message


@pytest.mark.parametrize(
    ("command", "args", "named"),
    [
        ("ping", {"verbose": True}, "verbose"),
        ("cache.evict", {"cache": "/c", "model": ["m"]}, "model"),
        ("ckpt.lib_list", {"lib": "/l", "run": "r"}, "run"),
        ("train.ps", {"run_id": "r", "stop": True, "grace_s": 3}, "grace_s"),
    ],
)
def test_an_unknown_argument_is_refused_by_name(command: str, args: dict[str, Any], named: str) -> None:
    message = refused(command, args)
    assert f"unknown argument(s) {named}" in message


@pytest.mark.parametrize(
    ("command", "args", "named"),
    [
        ("cache.state", {"size_gb": 4}, "cache"),
        ("netbench.send", {"address": "127.0.0.1"}, "port"),
        ("ckpt.lib_commit", {"lib": "/l", "run_id": "r"}, "step"),
        ("modelload.read_cold", {}, "path"),
    ],
)
def test_a_missing_required_argument_is_refused_by_name(
    command: str, args: dict[str, Any], named: str
) -> None:
    assert f"argument {named!r} is required" in refused(command, args)


@pytest.mark.parametrize(
    ("command", "args", "named"),
    [
        ("netbench.send", {"address": "127.0.0.1", "port": "9000"}, "port"),
        ("cache.verify", {"cache": "/c", "repair": "yes"}, "repair"),
        ("ckpt.newest", {"dir": "/d", "step": 1.5}, "step"),
        ("facts.collect", {"timeout_s": "soon"}, "timeout_s"),
        ("modelload.load_stages", {"path": "/m", "seq": True}, "seq"),
        ("network.txn_begin", {"id": "t", "files": ["/etc/x"]}, "files"),
    ],
)
def test_a_wrongly_typed_argument_is_refused_by_name(command: str, args: dict[str, Any], named: str) -> None:
    assert f"argument {named!r} must be" in refused(command, args)


def test_the_agent_answers_a_refusal_as_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert agent_main.main(["cache.evict", json.dumps({"cache": "/c", "force": 1})]) == 1
    answer = json.loads(capsys.readouterr().out)
    assert answer == {
        "error": "cache.evict: argument 'force' must be true or false, got 1",
        "kind": "bad_args",
    }


def test_defaults_are_applied_as_the_old_reads_did() -> None:
    spec = Takes(
        {
            "need": "str",
            "plain": Opt("int", 3),
            "maybe": Opt("str?", None),
            "empty_is_default": Or("int", 8),
            "seconds": Opt("num", 1.0),
            "size": Opt(NUMBER_OR_NULL, None),
            "items": Or(["any"], []),
        }
    )
    got = spec.apply({"need": "x", "empty_is_default": 0, "seconds": 2, "size": 4, "maybe": None})
    assert got == {
        "need": "x",
        "plain": 3,
        "maybe": None,
        "empty_is_default": 8,
        "seconds": 2.0,
        "size": 4,
        "items": [],
    }
    assert isinstance(got["seconds"], float) and isinstance(got["size"], int)
    # an explicit null is a value for Opt (refused unless allowed), the default for Or
    with pytest.raises(AgentError, match="'plain' must be an integer, got None"):
        spec.apply({"need": "x", "plain": None})
    assert spec.apply({"need": "x", "items": None})["items"] == []


def test_a_default_list_is_not_shared_between_calls() -> None:
    @command(takes={"items": Or(["any"], [])}, answers={"items": ["int"]})
    def handler(args: dict[str, Any]) -> dict[str, Any]:
        args["items"].append(1)
        return {"items": args["items"]}

    assert handler({}) == {"items": [1]}
    assert handler({}) == {"items": [1]}


def test_a_handler_called_directly_applies_its_spec_and_dispatch_checks_once() -> None:
    seen: list[dict[str, Any]] = []

    @command(takes={"wait": Opt("num", 600.0)}, answers={})
    def handler(args: dict[str, Any]) -> dict[str, Any]:
        seen.append(args)
        return {}

    commands.register("_argspec_probe", handler)
    try:
        commands.call("_argspec_probe", {"wait": 5})
        handler({})
    finally:
        del commands.COMMANDS["_argspec_probe"]
    assert seen == [{"wait": 5.0}, {"wait": 600.0}]
    with pytest.raises(AgentError, match="argument 'wait' must be a number"):
        handler({"wait": "long"})


def test_an_argument_of_a_nested_shape_is_refused_where_it_is_wrong() -> None:
    # Arguments speak the answers' shape language: a wrong value inside one is named by its path.
    spec = Takes({"probes": {"*": {"kind": "str"}}, "ids": Opt(["int"], [])})
    assert spec.apply({"probes": {"pub": {"kind": "file"}}}) == {
        "probes": {"pub": {"kind": "file"}},
        "ids": [],
    }
    with pytest.raises(AgentError) as info:
        spec.apply({"probes": {"pub": {"kind": 3}}}, "x.probe")
    assert info.value.kind == "bad_args"
    assert info.value.message == "x.probe: argument 'probes', at pub.kind: expected a string, got int 3"
    with pytest.raises(AgentError, match=r"argument 'ids' must be a list, got 'seven'"):
        spec.apply({"probes": {}, "ids": "seven"})


def test_a_number_passes_as_sent_only_where_an_int_is_allowed_first() -> None:
    spec = Takes({"exact": Opt(NUMBER_OR_NULL, None), "seconds": Opt("num?", None)})
    got = spec.apply({"exact": 3, "seconds": 3})
    assert got == {"exact": 3, "seconds": 3.0}
    assert isinstance(got["exact"], int) and isinstance(got["seconds"], float)


def test_a_declaration_that_breaks_the_language_fails_at_import() -> None:
    with pytest.raises(ValueError, match="unknown type 'float'"):
        command(takes={"wait": "float"}, answers={})
    with pytest.raises(ValueError, match="unknown type 'string'"):
        command(takes={}, answers={"name": "string"})
    with pytest.raises(ValueError, match="per_asked"):
        command(takes={"paths": ["str"]}, answers={"models": {}}, per_asked=("results", "paths"))


def test_the_controller_checks_an_answer_against_what_its_handler_declares() -> None:
    @command(takes={"names": ["str"]}, answers={"found": {"*": "int"}}, per_asked=("found", "names"))
    def handler(args: dict[str, Any]) -> dict[str, Any]:
        return {"found": {n: len(n) for n in args["names"]}}

    commands.register("_answer_probe", handler)
    try:
        assert commands.answer_problem("_answer_probe", {"found": {"a": 1}}, {"names": ["a"]}) is None
        assert commands.answer_problem("_answer_probe", {"found": {"a": "1"}}) == (
            "at found.a: expected a whole number, got str '1'"
        )
        assert (
            commands.answer_problem("_answer_probe", {"found": {}}, {"names": ["b"]})
            == "at found: no answer for 'b'"
        )
    finally:
        del commands.COMMANDS["_answer_probe"]
    # a command the table lacks has no declared answer: nothing to check it against
    assert commands.answer_problem("_answer_probe", {"found": 7}) is None
