from pipguard.cli import main

main()
