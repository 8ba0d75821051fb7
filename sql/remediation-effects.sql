-- remediation-effects: every queued remediation with its incident, state and measured effect.
--
-- From the remediations table (a snapshot of the remediation queue) joined with the
-- incident it answers. verdict / effect_before / effect_after are filled once the action
-- ran and was verified (effects are JSON: feature -> median before / after).
--
-- @param state str = ''        only actions in this state (proposed, approved, succeeded, failed, ...; '' = all)
SELECT r.action_id, r.host, r.entry_id, r.incident_id, i.start AS incident_start, i.title,
       r.script_id, r.params, r.mode, r.state, r.executed, r.approved_by,
       r.created, r.started, r.finished, r.verdict, r.effect_before, r.effect_after
FROM remediations AS r
LEFT JOIN incidents AS i ON r.incident_id = i.incident_id AND r.host = i.host
WHERE :state = '' OR r.state = :state
ORDER BY r.created, r.action_id
