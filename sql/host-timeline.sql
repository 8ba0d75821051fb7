-- host-timeline: everything that happened on one host, in time order.
--
-- Incidents (with their match), remediations (each change of an action: proposed,
-- incidents attached, run, verified; at the time of the change) and, on simulated
-- or labelled lakes, the ground-truth labels (injected inefficiencies), merged into one
-- timeline: time, end, kind (incident | remediation | label), name, state, detail. A
-- lasting incident is one row (its parts joined: view lasting_incidents).
--
-- @param host str              the host
SELECT * FROM (
    SELECT start AS time, "end", 'incident' AS kind,
           coalesce(entry_id, 'unmatched') AS name, status AS state,
           concat('peak score ', cast(round(peak_score, 2) AS varchar),
                  CASE WHEN parts > 1 THEN concat('; ', cast(parts AS varchar), ' parts') ELSE '' END,
                  '; ', explanation) AS detail
    FROM lasting_incidents WHERE host = :host
    UNION ALL
    SELECT updated AS time, finished AS "end", 'remediation' AS kind,
           concat(entry_id, ' -> ', script_id) AS name, state,
           concat('action ', cast(action_id AS varchar), ' for ', incident_id, ' params ', params,
                  CASE WHEN verdict IS NULL THEN '' ELSE concat('; verdict ', verdict) END) AS detail
    FROM remediations WHERE host = :host
    UNION ALL
    SELECT time, "end", 'label' AS kind, type AS name, 'injected' AS state,
           concat('devices ', coalesce(devices, ''), '; severity ', cast(severity AS varchar)) AS detail
    FROM labels WHERE host = :host
) AS t
ORDER BY time, kind, name
