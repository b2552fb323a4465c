"""Host side of `labctl train`: the reference trainer (`trainer`, its entry point, built from
`setup`, the step `loop` and `metrics`, with its `settings`, `corpus`, `ckpt`, `events` and time
`limit`), and the agent commands that check, start and watch a run (`host`)."""

COMMANDS = {
    "preflight": ".host:preflight_command",
    "spawn": ".host:spawn_command",
    "ps": ".host:ps_command",
    "status": ".host:status_command",
}
