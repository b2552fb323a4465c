"""`SSHConnection.run(env=...)` over real SSH to a simulated host: a variable's name is never
shell text, and a value reaches the command as it was given (issue 25, round two)."""

from __future__ import annotations

from typing import Any

import pytest

from labctl.inventory.load import load_inventory
from labctl.output.errors import InputError
from labctl.transport.ssh import SSHConnection

pytestmark = pytest.mark.integration


def test_an_env_name_that_is_not_a_shell_name_never_runs_on_the_host(lab: Any) -> None:
    host = load_inventory(lab.inventory_path).hosts["m5"]
    conn = SSHConnection(host)
    try:
        for bad in ("A;echo INJECTED;B", "A=$(echo INJECTED)", "1A", "A\nB"):
            with pytest.raises(InputError, match="not an environment variable name"):
                conn.run("true", env={bad: "1"})
        res = conn.run('printf %s "$A|$B_2"', env={"A": "it's $(echo no)", "B_2": "a\nb"})
        assert res.ok and res.stdout == "it's $(echo no)|a\nb"
    finally:
        conn.close()
