"""Runs ``fa2gen tune``'s body with the cost-model evaluator (the documented test seam)
in a separate process, so tests can kill it or run two at once.

Usage: python tuner_driver.py DB STORAGE_URL TRIALS LIMIT SLEEP_S [GRID_OFFSET]
"""

import sys
import time

from fa2gen.cli import _run_tune
from fa2gen.generator.spec import TuningParams
from fa2gen.runtime.device import DeviceInfo
from fa2gen.tuner.evaluate import CostModelEvaluator


class SlowCostModel(CostModelEvaluator):
    def __init__(self, sleep_s):
        super().__init__(optimum=TuningParams(block_m=64, block_n=32, num_warps=4, num_stages=3, loads="tma_device"))
        self.sleep_s = sleep_s

    def measure(self, bucket, params):
        time.sleep(self.sleep_s)
        m = super().measure(bucket, params)
        print(f"measured {bucket.key} {params}", flush=True)
        return m


if __name__ == "__main__":
    db, storage, trials, limit, sleep_s = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        int(sys.argv[4]),
        float(sys.argv[5]),
    )
    offset = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    import fa2gen.tuner.grid as grid

    buckets = grid.default_buckets()[offset : offset + limit]
    grid.default_buckets = lambda *directions: buckets
    _run_tune(
        "sm90",
        DeviceInfo("TEST_GPU", (9, 0), "sm90", 132),
        SlowCostModel(sleep_s),
        None,
        trials,
        None,
        db,
        storage,
        "tpe",
        True,
        0,
        None,
    )
