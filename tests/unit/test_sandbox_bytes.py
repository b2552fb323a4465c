"""A sandbox program's source, stdin and output as bytes on both sides of the agent call, without
Docker: what the controller sends (labctl/sandbox/api.py) and what the runner reads and answers
(labctl/agent/sandbox/runner.py). The real runs are in tests/integration/test_sandbox_bytes.py."""

from __future__ import annotations

import base64
import json

import pytest

from labctl.agent.core.errors import AgentError
from labctl.agent.sandbox import runner
from labctl.output.errors import InputError
from labctl.sandbox.api import check_program
from labctl.sandbox.limits import Limits

LATIN1 = b'# -*- coding: latin-1 -*-\nprint("caf\xe9")\n'


def test_the_program_travels_as_its_bytes_through_json() -> None:
    sent = check_program({"lang": "python", "source": LATIN1, "stdin": b"\xff\x00"}, Limits())
    arrived = json.loads(json.dumps(sent))  # the agent call is JSON
    assert runner._payload(arrived, "source") == LATIN1
    assert runner._payload(arrived, "stdin") == b"\xff\x00"
    # Text read with surrogateescape (a file in any encoding) gets its own bytes back.
    text = LATIN1.decode("utf-8", "surrogateescape")
    assert runner._payload(check_program({"lang": "python", "source": text}, Limits()), "source") == LATIN1
    # The self-test and bench still send text as such.
    assert runner._payload({"source": "print('é')"}, "source") == "print('é')".encode()


def test_output_that_is_not_utf8_comes_back_as_text_and_exact_bytes() -> None:
    out = runner._outcome(0, b"caf\xe9\n", "é".encode(), False, False, 0.0)
    assert out["stdout"] == "caf\ufffd\n" and base64.b64decode(out["stdout_b64"]) == b"caf\xe9\n"
    assert out["stderr"] == "é" and "stderr_b64" not in out


@pytest.mark.parametrize(
    "prog",
    [
        {"lang": "python", "source": 3},
        {"lang": "python"},
        {"source": "print(1)"},
        {"lang": "python", "source": "x", "timeout": "soon"},
        {"lang": "python", "source": "x", "memory_mb": float("inf")},
    ],
)
def test_a_malformed_program_is_an_input_error(prog: dict[str, object]) -> None:
    with pytest.raises(InputError):
        check_program(prog, Limits())


def test_the_agent_refuses_a_payload_it_cannot_read() -> None:
    with pytest.raises(AgentError, match="not base64"):
        runner._payload({"source_b64": "%%%"}, "source")
    with pytest.raises(AgentError, match="must be text"):
        runner._payload({"stdin": 5}, "stdin")
