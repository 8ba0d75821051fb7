-- hugepage-coverage: transparent huge-page coverage of anonymous memory per host over time.
--
-- coverage = AnonHugePages / AnonPages from /proc/meminfo (memory table), averaged per
-- bucket; thp_fallbacks = THP allocations that fell back to 4 KiB pages (vmstat
-- thp_fault_fallback deltas) in the bucket. A drop in coverage with fallbacks rising is
-- the footprint of thp_coverage_loss (THP disabled or memory fragmented).
--
-- @param bucket str = 'minute'   bucket width: second, minute, hour or day
WITH cov AS (
    SELECT host, date_trunc(:bucket, time) AS bucket,
           avg(cast(anon_huge_pages AS double) / nullif(cast(anon_pages AS double), 0)) AS coverage,
           min(cast(anon_huge_pages AS double) / nullif(cast(anon_pages AS double), 0)) AS min_coverage
    FROM memory
    GROUP BY host, date_trunc(:bucket, time)
),
fb AS (
    SELECT host, date_trunc(:bucket, time) AS bucket, sum(coalesce(thp_fault_fallback, 0)) AS thp_fallbacks,
           sum(coalesce(thp_fault_alloc, 0)) AS thp_allocs
    FROM vmstat
    GROUP BY host, date_trunc(:bucket, time)
)
SELECT cov.host, cov.bucket, round(cov.coverage, 4) AS coverage, round(cov.min_coverage, 4) AS min_coverage,
       fb.thp_allocs, fb.thp_fallbacks
FROM cov LEFT JOIN fb ON cov.host = fb.host AND cov.bucket = fb.bucket
ORDER BY cov.host, cov.bucket
