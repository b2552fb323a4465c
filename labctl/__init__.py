"""labctl: run a small heterogeneous GPU lab from one YAML inventory."""

__version__ = "0.1.0"
