"""Every built-in resource; importing this package registers them all."""

from labctl.provision.resources import (  # noqa: F401
    controller,
    cron,
    files,
    model_cache,
    network,
    package,
    sandbox,
    torch_env,
)
