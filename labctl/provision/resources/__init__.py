"""Every built-in resource; importing this package registers them all."""

from labctl.provision.resources import controller, cron, files, model_cache, package, torch_env  # noqa: F401
