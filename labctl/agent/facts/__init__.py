"""Host side of `labctl facts`: what a host has (CPU, memory, GPUs, NICs, disks, storage mounts)."""

COMMANDS = {
    "facts": ".collect:facts_command",
}
