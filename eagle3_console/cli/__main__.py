"""`python -m eagle3_console.cli`: the command line, as the `eagle3-console` script."""

from eagle3_console.cli import main

raise SystemExit(main())
