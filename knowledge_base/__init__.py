"""The knowledge base of known inefficiencies and the fingerprint matcher.

Public API::

    kb = load_kb()                                        # knowledge_base/entries/*.toml, validated
    cands = match_findings(findings, features, host_facts, kb)   # ranked candidates per window
    incidents = build_incidents(cands, findings, kb)      # lake table ``incidents``
    report = audit(host_facts, kb)                        # lake table ``audit``
    matcher = as_eval_matcher(kb)                         # for analytics.evaluation
    det = detect(analysis_result, host_facts, kb)         # statistical OR signature verdict
"""

from __future__ import annotations

from knowledge_base.audit import AUDIT_SCHEMA, audit
from knowledge_base.detector import DetectionConfig, detect
from knowledge_base.draft import draft_entry
from knowledge_base.facts import HostFacts, check_preconditions, fill_params
from knowledge_base.incidents import INCIDENT_SCHEMA, build_incidents, incident_id, latest_incidents
from knowledge_base.loader import Entry, KBError, KnowledgeBase, load_entry, load_kb
from knowledge_base.matcher import (
    MATCH_SCHEMA,
    MatchConfig,
    as_eval_matcher,
    best_matches,
    eval_matcher,
    match_findings,
    match_windows,
)

__all__ = [
    "AUDIT_SCHEMA",
    "DetectionConfig",
    "INCIDENT_SCHEMA",
    "MATCH_SCHEMA",
    "Entry",
    "HostFacts",
    "KBError",
    "KnowledgeBase",
    "MatchConfig",
    "as_eval_matcher",
    "audit",
    "best_matches",
    "build_incidents",
    "check_preconditions",
    "detect",
    "draft_entry",
    "eval_matcher",
    "fill_params",
    "incident_id",
    "latest_incidents",
    "load_entry",
    "load_kb",
    "match_findings",
    "match_windows",
]
