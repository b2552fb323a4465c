from labctl.cli.app import main

main()
