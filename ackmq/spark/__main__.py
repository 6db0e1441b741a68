"""`python -m ackmq.spark pipeline …|demo` until `ackmq pipeline`/`ackmq demo` are wired."""

import sys

from ackmq.spark.cli import main

sys.exit(main())
