"""`python -m flows.cli`: the `ratchet` command."""

from flows.cli import main

main()
