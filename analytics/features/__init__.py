"""Windowed features: telemetry LazyFrames -> one wide row per (host, window).

:mod:`.plans` states what every feature means (Polars expressions per measurement);
:mod:`.engine` executes the plans, with the two numpy kernels of :mod:`.kernels`. Counters
are deltas, so "sum of deltas / covered duration" is a rate. A ratio whose denominator is
zero is null, never a fake 0 or inf: detectors read null as "no evidence".
"""

from analytics.features.engine import (
    KEYS,
    WINDOW_END,
    WINDOW_START,
    compute_features,
    concat_features,
    feature_columns,
    features_by_host,
)
from analytics.features.plans import HOST, SKIPPED, THROTTLE_BITS, TIME, WindowSpec

__all__ = ["HOST", "KEYS", "SKIPPED", "THROTTLE_BITS", "TIME", "WINDOW_END", "WINDOW_START",
           "WindowSpec", "compute_features", "concat_features", "feature_columns",
           "features_by_host"]
