"""The self-test's attack programs, one module per language (sources as data; the judging and
the table of attacks are in labctl/sandbox/attacks.py)."""

# The file a run leaves for the next one, which must never see it.
MARKER = "labctl-selftest-marker"
