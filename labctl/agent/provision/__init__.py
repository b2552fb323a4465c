"""Host side of `labctl provision`: each resource's probe and apply (`commands`), and the
PyTorch environment builder (`torch_env`), llama.cpp's server builder (`llama_cpp`)."""

COMMANDS = {
    "probe": ".commands:probe_command",
    "apply": ".commands:apply_command",
    "llama_cpp_build": ".llama_cpp:build_command",
    "llama_cpp_probe": ".llama_cpp:probe_command",
    "host_lock": ".hostlock:lock_command",
}
