"""Transport: how commands and files reach a host (SSH via paramiko, or this machine)."""
