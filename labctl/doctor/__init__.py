"""`labctl doctor`: seed 004's infrastructure validation and seed 003's scale tiers.

gather.py asks the hosts (facts, a clock read, sandbox images, a short network probe) through
the existing agent commands; checks.py and tiers.py judge what came back without touching a
host, so every verdict is testable from a fixture; render.py prints the lines.
"""
