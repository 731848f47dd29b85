from inferno.cli.app import main

main()
