"""`python -m forgetwatch.cli`: the `forgetwatch` command."""

import sys

from . import main

sys.exit(main())
