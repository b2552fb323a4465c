"""The command line: one Typer sub-app per command group; each parses, calls core, renders."""
