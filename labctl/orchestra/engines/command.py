"""A server of the user's own, from the orchestra file's `server.command` template: labctl
knows nothing of its formats or cards, so it checks only that it answers the OpenAI API."""

from labctl.orchestra.engines.base import Engine

ENGINE = Engine(
    name="command",
    title="the server.command template",
    formats=("*",),
    min_cap=None,
    command="",  # the file's own template replaces it (spec.py)
    cuda_check=None,
)
