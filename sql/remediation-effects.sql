-- remediation-effects: every remediation with its incident, latest state and measured effect.
--
-- From the remediations table, which follows the remediation queue (one row each time an
-- action changed: proposed, approved, applied, verified, rolled back, an incident attached);
-- each action's latest row is shown, joined with the incident it was proposed for.
-- verdict / effect_before / effect_after are filled once the action ran and was verified
-- (effects are JSON: verification feature -> median over the windows before / after the
-- apply). attached_incidents: later fragments of the same cause; recurrence_of and
-- came_back_after_s: the succeeded fix this fault came back after, and how long after.
--
-- @param state str = ''        only actions in this state (proposed, approved, succeeded, failed, unverifiable, ...; '' = all)
SELECT DISTINCT r.action_id, r.host, r.entry_id, r.incident_id, i.start AS incident_start, i.title,
       r.script_id, r.params, r.mode, r.state, r.executed, r.approved_by,
       r.created, r.started, r.finished, r.verdict, r.effect_before, r.effect_after,
       r.attached_incidents, r.recurrence_of, r.came_back_after_s
FROM remediations AS r
JOIN (SELECT action_id, MAX(updated) AS last_update FROM remediations GROUP BY action_id) AS l
  ON r.action_id = l.action_id AND r.updated = l.last_update
LEFT JOIN incidents AS i ON r.incident_id = i.incident_id AND r.host = i.host
WHERE :state = '' OR r.state = :state
ORDER BY r.created, r.action_id
