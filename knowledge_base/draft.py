"""Turn an unmatched incident's fingerprint into a new entry skeleton to edit.

The draft is valid TOML that :func:`knowledge_base.loader.load_entry` accepts as it is (so
``unveil kb validate`` passes before any editing): every fingerprint factor becomes a signal
(the strongest one required, the others supporting) with the observed direction and a
min_change of half the observed change; the subsystem profile's main shares become
``subsystems``; texts say TODO. Review thresholds before committing it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from analytics.attribution import SHARE_COLUMNS
from analytics.catalog import FAMILIES, SUBSYSTEMS, split_feature


def _q(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _num(x: float) -> str:
    return f"{x:.6g}" if "e" not in f"{x:.6g}" else f"{x:.3e}"


def draft_entry(incident: Mapping[str, Any], entry_id: str | None = None) -> str:
    """TOML text of a new entry from one ``incidents`` row (a dict)."""
    inc_id = str(incident.get("incident_id") or "incident")
    eid = entry_id or "draft_" + re.sub(r"[^a-z0-9_]", "_", inc_id.lower()).strip("_")
    factors = [f for f in (incident.get("top_factors") or []) if f and f.get("family") in FAMILIES]
    if not factors:
        raise ValueError(f"incident {inc_id}: its fingerprint has no factor of a known feature family "
                         "(imported metrics cannot be matched by the knowledge base yet)")
    shares = {c.removeprefix("share_"): float(incident.get(c) or 0.0) for c in SHARE_COLUMNS}
    subs = [s for s, v in sorted(shares.items(), key=lambda kv: (-kv[1], kv[0])) if v >= 0.2 and s in SUBSYSTEMS
            and s != "other"]
    if not subs:
        subs = sorted({str(f["subsystem"]) for f in factors if f.get("subsystem") in SUBSYSTEMS and f["subsystem"] != "other"})
    lines = [
        f"# Drafted from {'incident' if incident.get('entry_id') else 'unmatched incident'} {inc_id} "
        f"on host {incident.get('host')} "
        f"({incident.get('start')} .. {incident.get('end')}).",
        "# Review every threshold and text, rename the file to <id>.toml, then `unveil kb validate`.",
        f"id = {_q(eid)}",
        f"title = {_q('TODO: short name of the inefficiency')}",
        f"explanation = {_q('TODO: what happens, why it costs throughput, how to recognise it. Fingerprint: ' + (incident.get('explanation') or ''))}",
        f"impact = {_q('TODO: typical throughput cost')}",
        f"subsystems = [{', '.join(_q(s) for s in subs)}]",
        f"references = [{_q('incident ' + inc_id)}]",
        "",
    ]
    seen: set[tuple[str, str]] = set()
    for i, f in enumerate(factors):
        fam, _dev = split_feature(str(f["feature"]))
        direction = "down" if f.get("direction") == "down" else "up"
        if (fam, direction) in seen:
            continue
        seen.add((fam, direction))
        value, ref = f.get("value"), f.get("reference")
        change = abs(float(value) - float(ref)) / 2 if value is not None and ref is not None else 0.0
        where = f.get("device") or "host"
        note = f"observed {value!r} vs reference {ref!r} on {where}, share {float(f.get('contribution') or 0):.2f}"
        lines += [
            "[[signals]]",
            f"feature = {_q(fam)}",
            f"direction = {_q(direction)}",
            f"role = {_q('required' if i == 0 else 'supporting')}",
            "min_z = 3.0",
            f"min_change = {_num(change)}",
            f"note = {_q(note)}",
            "",
        ]
    lines += [
        "[remediation]",
        'mode = "manual"',
        f"guidance = {_q('TODO: what an operator should do')}",
        "",
    ]
    return "\n".join(lines)
