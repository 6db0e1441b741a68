"""`python -m ackmq.bench ...` — the same as `ackmq bench ...`."""

import sys

from ackmq.bench.cli import main

sys.exit(main())
