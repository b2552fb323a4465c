"""Host side of `labctl bench network`: a sink and a sender that time a TCP stream between hosts."""

COMMANDS = {
    "net_sink": ".transfer:sink_command",
    "net_send": ".transfer:send_command",
}
