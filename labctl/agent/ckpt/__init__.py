"""Host side of `labctl ckpt`: the checkpoint library on the storage host (`library`, its agent
commands in `library_cmds`) and pulls of a run's checkpoints into it (`pull`)."""

COMMANDS = {
    "ckpt_newest": ".library_cmds:newest_command",
    "ckpt_lib_list": ".library_cmds:list_command",
    "ckpt_lib_commit": ".library_cmds:commit_command",
    "ckpt_lib_remove": ".library_cmds:remove_command",
    "ckpt_lib_verify": ".library_cmds:verify_command",
    "ckpt_restore_commit": ".library_cmds:restore_commit_command",
    "ckpt_pull_state": ".pull:ckpt_state_command",
    "ckpt_pull_commit": ".pull:ckpt_commit_command",
    "model_publish_state": ".pull:model_state_command",
    "model_publish": ".pull:model_publish_command",
}
