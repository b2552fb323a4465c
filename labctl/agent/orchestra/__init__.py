"""The orchestra on a serving host: labctl's own model server (`server`) and the agent commands
that start, watch, stop and record the warm set's servers (`host`). Stdlib only, Python 3.8;
the server imports torch inside its functions."""

COMMANDS = {
    "state": ".host:state_command",
    "start": ".host:start_command",
    "health": ".host:health_command",
    "stop": ".host:stop_command",
    "commit": ".host:commit_command",
    "publish": ".host:publish_command",
}
