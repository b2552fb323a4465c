"""Host side of `labctl provision`: each resource's probe and apply (`commands`), and the
PyTorch environment builder (`torch_env`)."""

COMMANDS = {
    "probe": ".commands:probe_command",
    "apply": ".commands:apply_command",
}
