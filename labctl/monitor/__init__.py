"""Watching the lab: one `monitor.status` sample per host (collect.py), the alerts judged from it
(alerts.py), and what shows or exports them (`labctl status`, `labctl metrics`, `labctl doctor`)."""
