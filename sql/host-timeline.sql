-- host-timeline: everything that happened on one host, in time order.
--
-- Incidents (with their match), remediations (proposed, run, verified) and, on simulated
-- or labelled lakes, the ground-truth labels (injected inefficiencies), merged into one
-- timeline: time, end, kind (incident | remediation | label), name, state, detail.
--
-- @param host str              the host
SELECT * FROM (
    SELECT start AS time, "end", 'incident' AS kind,
           coalesce(entry_id, 'unmatched') AS name, status AS state,
           concat('peak score ', cast(round(peak_score, 2) AS varchar), '; ', explanation) AS detail
    FROM incidents WHERE host = :host
    UNION ALL
    SELECT created AS time, finished AS "end", 'remediation' AS kind,
           concat(entry_id, ' -> ', script_id) AS name, state,
           concat('action ', cast(action_id AS varchar), ' for ', incident_id, ' params ', params,
                  coalesce(concat('; verdict ', verdict), '')) AS detail
    FROM remediations WHERE host = :host
    UNION ALL
    SELECT time, "end", 'label' AS kind, type AS name, 'injected' AS state,
           concat('devices ', coalesce(devices, ''), '; severity ', cast(severity AS varchar)) AS detail
    FROM labels WHERE host = :host
) AS t
ORDER BY time, kind, name
