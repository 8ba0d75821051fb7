-- anomaly-rate-per-host: windows scored, flagged and matched per host (fleet overview).
--
-- From the sweep's scores (combined detector, the worse of the references per window),
-- findings and incidents: how noisy each host is and how much of it is explained by the
-- knowledge base. flagged_share is the host's anomaly rate; matched_incidents vs
-- unmatched_incidents shows what is known and what is not.
SELECT s.host, s.windows, s.flagged, round(cast(s.flagged AS double) / s.windows, 4) AS flagged_share,
       round(s.max_score, 2) AS max_score,
       coalesce(i.matched, 0) AS matched_incidents, coalesce(i.unmatched, 0) AS unmatched_incidents
FROM (
    SELECT host, count(*) AS windows, sum(CASE WHEN flagged THEN 1 ELSE 0 END) AS flagged, max(score) AS max_score
    FROM (
        SELECT host, window_start, max(score) AS score, max(cast(flagged AS int)) = 1 AS flagged
        FROM scores WHERE detector = 'combined'
        GROUP BY host, window_start
    ) AS w
    GROUP BY host
) AS s
LEFT JOIN (
    SELECT host, sum(CASE WHEN status = 'matched' THEN 1 ELSE 0 END) AS matched,
           sum(CASE WHEN status = 'unmatched' THEN 1 ELSE 0 END) AS unmatched
    FROM incidents GROUP BY host
) AS i ON s.host = i.host
ORDER BY flagged_share DESC, s.host
