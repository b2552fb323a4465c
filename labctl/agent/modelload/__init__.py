"""Host side of `labctl bench model-load` and `bench make-model`: the safetensors loader
(`loader`), every load stage timed (`stages`), and the stdlib model writer (`modelgen`)."""

COMMANDS = {
    "read_cold": ".stages:read_cold_command",
    "load_stages": ".stages:load_stages_command",
    "make_model": ".modelgen:make_model_command",
    "describe": ".formats:model_describe_command",
}
