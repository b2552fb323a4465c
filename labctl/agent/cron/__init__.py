"""Host side of `labctl cron`: the jobs labctl installed in /etc/cron.d and their last runs."""

COMMANDS = {
    "list": ".cronjobs:list_command",
}
