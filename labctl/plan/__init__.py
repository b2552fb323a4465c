"""`labctl plan week`: a week of time-boxed training sessions over free cloud GPU quotas (seed 001)
and the lab's own GPUs: `spec.py` (the plan file), `throughput.py` (tokens/s per job and GPU:
measured, given or scaled), `schedule.py` (pure), `gantt.py` (the PNG), `render.py` (the table)."""
