"""The orchestra on a serving host: labctl's own model server (`server`) and the agent commands
that start, watch, stop and record the warm set's servers (`host`). Stdlib only, Python 3.8;
the server imports torch inside its functions."""

COMMANDS = {
    "orch_state": ".host:state_command",
    "orch_start": ".host:start_command",
    "orch_health": ".host:health_command",
    "orch_stop": ".host:stop_command",
    "orch_commit": ".host:commit_command",
    "orch_publish": ".host:publish_command",
}
