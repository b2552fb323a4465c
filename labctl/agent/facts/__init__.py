"""Host side of `labctl facts`: what a host has (CPU, memory, GPUs, NICs, disks, storage mounts)."""

COMMANDS = {
    "collect": ".collect:facts_command",
}
