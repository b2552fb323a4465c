"""Host side of `labctl status` and `labctl metrics`: one read of a host's load, GPUs, memory,
the RAM cache and running jobs (`monitor.status`)."""

COMMANDS = {
    "status": ".status:status_command",
}
