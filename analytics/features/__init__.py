"""Windowed features: telemetry LazyFrames -> one wide row per (host, window).

The same code serves sweeps, post-mortems and evaluation. :mod:`.plans` states what
every feature means (a registry of Polars expressions per measurement);
:mod:`.engine` executes the plans (Polars for the expressions, the two numpy kernels
of :mod:`.kernels` for the bucket and window aggregations).

Counters are stored as deltas (see :mod:`ingest.schema`), so "sum of deltas / window
duration" is a rate. A window that runs past the end of a host's data is normalised
by the covered duration and kept only when no full window exists (a host with less
than one window of data still gets one row). A ratio whose denominator is zero
(no interrupts, no I/O) is null, never a fake 0 or inf: detectors read null as
"no evidence" (see :mod:`analytics.detectors`).
"""

from analytics.features.engine import (
           KEYS,
           WINDOW_END,
           WINDOW_START,
           compute_features,
           concat_features,
           feature_columns,
)
from analytics.features.plans import HOST, SKIPPED, THROTTLE_BITS, TIME, WindowSpec

__all__ = ["HOST", "KEYS", "SKIPPED", "THROTTLE_BITS", "TIME", "WINDOW_END", "WINDOW_START", "WindowSpec",
           "compute_features", "concat_features", "feature_columns"]
