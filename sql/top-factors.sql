-- top-factors: the features that carried most of the anomalies' attribution.
--
-- From the findings' top factors (view finding_factors): per host and feature, how many
-- anomalous windows it appeared in, its summed and mean contribution, and the direction it
-- moved (the one that carried most of its contribution: a feature that went up in most
-- windows and dipped in one went up). The quickest answer to "which metrics, which device".
--
-- @param host str = ''         only this host ('' = all)
-- @param limit int = 30        how many rows
SELECT host, feature, family, device, subsystem, count(*) AS windows,
       round(sum(contribution), 3) AS total_contribution, round(avg(contribution), 4) AS mean_contribution,
       CASE WHEN sum(CASE WHEN direction = 'up' THEN contribution ELSE 0.0 END)
                 >= sum(CASE WHEN direction = 'down' THEN contribution ELSE 0.0 END) THEN 'up' ELSE 'down' END
           AS direction, round(avg(value), 4) AS mean_value, round(avg(reference_value), 4) AS mean_reference
FROM finding_factors
WHERE :host = '' OR host = :host
GROUP BY host, feature, family, device, subsystem
ORDER BY total_contribution DESC, host, feature
LIMIT :limit
