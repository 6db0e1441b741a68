"""The run's random seed: ACKMQ_TEST_SEED when set (to replay a failure), else the clock,
so the randomised tests (kill points, moving crash-simulator seeds) differ from run to run."""

from __future__ import annotations

import os
import time


def run_seed() -> int:
    return int(os.environ.get("ACKMQ_TEST_SEED", time.time()))
