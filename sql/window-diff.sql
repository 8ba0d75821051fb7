-- window-diff: what changed between two windows of one host (PCP pmdiff style).
--
-- For every feature (channel) of the host: its mean over window A and over window B,
-- the difference, the ratio B/A and the relative change (B - A) / max(|A|, floor), sorted
-- by its size; floor is the smallest change of the feature worth noticing (analytics
-- catalog), so a channel moving from 0 by a rounding error does not top the list. Windows are [start, end) in UTC (ISO-8601 or a
-- relative time such as 2h). Features come from the sweep's features table, so sweep
-- both windows first. Run with --since/--until around both windows (or none) so the
-- scan covers them.
--
-- @param host str              the host
-- @param a_start timestamp     start of window A (e.g. the healthy period)
-- @param a_end timestamp       end of window A
-- @param b_start timestamp     start of window B (e.g. the slow period)
-- @param b_end timestamp       end of window B
-- @param min_change float = 0.0  only features whose |relative change| is at least this
-- @param limit int = 50        how many features to return
WITH a AS (
    SELECT feature, family, device, subsystem, max(floor) AS floor, avg(value) AS mean_a, count(value) AS windows_a
    FROM feature_values
    WHERE host = :host AND window_start >= :a_start AND window_start < :a_end
    GROUP BY feature, family, device, subsystem
),
b AS (
    SELECT feature, avg(value) AS mean_b, count(value) AS windows_b
    FROM feature_values
    WHERE host = :host AND window_start >= :b_start AND window_start < :b_end
    GROUP BY feature
),
d AS (
    SELECT a.feature, a.family, a.device, a.subsystem, a.windows_a, b.windows_b, a.mean_a, b.mean_b,
           b.mean_b - a.mean_a AS diff,
           CASE WHEN a.mean_a = 0 THEN NULL ELSE b.mean_b / a.mean_a END AS ratio,
           (b.mean_b - a.mean_a) / greatest(abs(a.mean_a), coalesce(a.floor, 0.0), 1e-9) AS rel_change
    FROM a JOIN b ON a.feature = b.feature
    WHERE a.mean_a IS NOT NULL AND b.mean_b IS NOT NULL
)
SELECT feature, family, device, subsystem, windows_a, windows_b,
       round(mean_a, 6) AS mean_a, round(mean_b, 6) AS mean_b, round(diff, 6) AS diff,
       round(ratio, 4) AS ratio, round(rel_change, 4) AS rel_change
FROM d
WHERE abs(rel_change) >= :min_change
ORDER BY abs(rel_change) DESC, feature
LIMIT :limit
