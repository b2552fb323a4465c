"""Host side of `labctl provision`: each resource's probe and apply (`commands`), and the
PyTorch environment builder (`torch_env`), llama.cpp's server builder (`llama_cpp`)."""

from ..core.ops import OpKind, ProbeKind

COMMANDS = {
    "probe": ".commands:probe_command",
    "apply": ".commands:apply_command",
    "llama_cpp_build": ".llama_cpp:build_command",
    "llama_cpp_probe": ".llama_cpp:probe_command",
    "host_lock": ".hostlock:lock_command",
}

# Provisioning's own probes and ops: files, mounts, users, commands, and the two builds it runs.
# Other features declare theirs in their own package; commands.py dispatches over all of them.
PROBES = (
    ProbeKind("llama_cpp", ".llama_cpp:probe", "llama.cpp's installed build"),
    ProbeKind("authorized_keys", ".commands:authorized_keys_probe", "a user's ~/.ssh/authorized_keys"),
    ProbeKind("ids", ".commands:ids_probe", "a user's and a group's ids"),
    ProbeKind("file", "..core.fsutil:file_state", "a file's or folder's state, and its text when asked"),
    ProbeKind("mount", ".commands:mount_probe", "what is mounted at a path, and its size"),
    ProbeKind("meminfo", ".commands:meminfo_probe", "total and available memory"),
    ProbeKind("command", ".commands:command_probe", "a command's exit code and output"),
    ProbeKind("which", ".commands:which_probe", "where a program is on PATH"),
    ProbeKind("system", ".commands:system_probe", "systemd, apt and the agent's uid"),
)
OPS = (
    OpKind("llama_cpp", ".llama_cpp:build_op", "llama.cpp's server built and installed"),
    OpKind("torch_env", ".torch_env:build_op", "a PyTorch environment built"),
    OpKind("install_tree", ".commands:install_tree_op", "a release of a file tree swapped in"),
    OpKind("remove_tree", ".commands:remove_tree_op", "a folder removed with what it holds"),
    OpKind("write_file", ".commands:write_file_op", "a file replaced atomically"),
    OpKind("chmod", ".commands:chmod_op", "a path's mode and owner set"),
    OpKind("mkdir", ".commands:mkdir_op", "a folder made"),
    OpKind("remove", ".commands:remove_op", "a file removed"),
    OpKind("run", ".commands:run_op", "a command run, failing the apply when it fails"),
)
