"""Scheduled labctl jobs run on the orchestrator host (`labctl cron install|list|remove`)."""
