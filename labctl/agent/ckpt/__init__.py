"""Host side of `labctl ckpt`: the checkpoint library on the storage host (`library`, its agent
commands in `library_cmds`) and pulls of a run's checkpoints into it (`pull`)."""

COMMANDS = {
    "newest": ".library_cmds:newest_command",
    "lib_list": ".library_cmds:list_command",
    "lib_commit": ".library_cmds:commit_command",
    "lib_remove": ".library_cmds:remove_command",
    "lib_verify": ".library_cmds:verify_command",
    "restore_commit": ".library_cmds:restore_commit_command",
    "pull_state": ".pull:ckpt_state_command",
    "pull_commit": ".pull:ckpt_commit_command",
    "publish_state": ".pull:model_state_command",
    "publish": ".pull:model_publish_command",
}
