-- top-incidents: the incidents of the interval, worst (highest peak anomaly score, then longest) first.
--
-- One row per incident (consecutive anomalous windows of one host) with its
-- knowledge-base match, or status 'unmatched' with the fingerprint it left; an incident
-- still under way has state 'open' and is shown as of its latest update. One cause is
-- one incident: the other entries that matched its windows are its alternatives, each
-- with the evidence it was ranked lower on ('; ' between them). A lasting incident is
-- one row: the parts the scheduler cuts it into (every max_incident, 15 min) are joined
-- (view lasting_incidents; parts = how many; its id, explanation and alternatives are
-- its first part's; the table incidents has each part).
-- Prune with --since/--until/--hosts (incidents are stored at their start time: --since
-- keeps the parts that start after it).
--
-- @param limit int = 20        how many incidents to return
-- @param status str = ''       only 'matched' or 'unmatched' incidents ('' = both)
SELECT
    incident_id,
    host,
    start,
    "end",
    extract(epoch FROM "end") - extract(epoch FROM start) AS duration_s,
    parts,
    n_windows,
    state,
    updated,
    status,
    entry_id,
    title,
    round(confidence, 3) AS confidence,
    round(peak_score, 2) AS peak_score,
    array_to_string(devices, ',') AS devices,
    array_to_string(alternatives, '; ') AS alternatives,
    explanation
FROM lasting_incidents
WHERE :status = '' OR status = :status
ORDER BY peak_score DESC, n_windows DESC, start, host  -- equal peaks (infinite ones: a reference with no spread): the longer first
LIMIT :limit
