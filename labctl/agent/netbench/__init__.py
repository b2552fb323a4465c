"""Host side of `labctl bench network`: a sink and a sender that time a TCP stream between hosts."""

COMMANDS = {
    "sink": ".transfer:sink_command",
    "send": ".transfer:send_command",
}
