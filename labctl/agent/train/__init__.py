"""Host side of `labctl train`: the reference trainer (`trainer`, its entry point, built from
`setup`, the step `loop` and `metrics`, with its `settings`, `corpus`, `ckpt`, `events` and time
`limit`), and the agent commands that check, start and watch a run (`host`)."""

COMMANDS = {
    "train_preflight": ".host:preflight_command",
    "train_spawn": ".host:spawn_command",
    "train_ps": ".host:ps_command",
    "train_status": ".host:status_command",
}
