"""`labctl train`: phases, preflight, torchrun launch over SSH, and hand-off to Slurm / Kubeflow."""
