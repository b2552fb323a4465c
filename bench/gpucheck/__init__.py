"""Sections of `make gpu-check` (bench/gpu_check.py): one module per GPU claim."""
