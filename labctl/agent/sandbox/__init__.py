"""Host side of `labctl sandbox` (standard library only, Python 3.8): the image builder
(`image`), a Docker Engine client over its unix socket (`docker`), the warm pool (`pool`),
running programs (`runner`; all of a program's tests in one container: `batch`), the
service that keeps the pools open for the training hosts (`service`, started by `serve`), the host check (`hostcheck`), the daemon's settings (`daemon`) and
the docker command line (`dockercli`), and each language's recipe (`languages`: data the
controller's provision resource reads too).

The names every part shares (the controller imports them from here too): one image per
language, `labctl-sandbox/LANG:latest`, labelled with its recipe's hash and its language.
"""

from ..core.ops import OpKind, ProbeKind

IMAGE_PREFIX = "labctl-sandbox/"
LABEL_RECIPE = "labctl.recipe"
LABEL_LANG = "labctl.lang"
LABEL_LAB = "labctl.lab"  # a pool container's lab: the inventory's lab name


def image_name(lang: str) -> str:
    """The image a language's containers run: `labctl-sandbox/LANG:latest`."""
    return f"{IMAGE_PREFIX}{lang}:latest"


COMMANDS = {
    "images": ".image:images_command",
    "build": ".image:build_command",
    "run": ".runner:run_command",
    "bench": ".runner:bench_command",
    "hostcheck": ".hostcheck:hostcheck_command",
    "serve": ".serve:start_command",
    "serve_stop": ".serve:stop_command",
    "serve_state": ".serve:state_command",
    "token": ".serve:token_command",
    "client": ".serve:client_command",
    "client_remove": ".serve:client_remove_command",
}

# What `provision.probe` reads and `provision.apply` runs for the sandbox resource (core/ops.py).
PROBES = (ProbeKind("sandbox", ".daemon:probe", "Docker's daemon, its settings and the sandbox images"),)
OPS = (
    OpKind("dockerd", ".daemon:dockerd_op", "Docker's daemon settings written, the daemon restarted"),
    OpKind("sandbox_image", ".image:build_op", "one language's sandbox image built"),
)
