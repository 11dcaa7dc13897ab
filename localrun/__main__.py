from localrun.cli import main

main()
