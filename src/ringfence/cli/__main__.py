from ringfence.cli import main

main()
