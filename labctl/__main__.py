from labctl.cli.app import entry

entry()
