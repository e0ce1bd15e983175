import sys

from lookahead.bench.cli import main

sys.exit(main())
