"""Host side of `labctl cron`: the jobs labctl installed in /etc/cron.d and their last runs."""

COMMANDS = {
    "cron_list": ".cronjobs:list_command",
}
