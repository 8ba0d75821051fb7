"""``unveil kb``: list, show and validate knowledge-base entries; draft one from an incident."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import tomllib
from pathlib import Path

from ingest.atomic import write_atomic
from jobs.commands import verb_options
from knowledge_base.loader import KBError, KnowledgeBase, load_entry, load_kb, parse_entry


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("kb", help="the knowledge base of known inefficiencies",
                       description="List, show and validate knowledge-base entries (TOML files); draft a new "
                       "entry from an unmatched incident.")
    after = verb_options(p, lambda q: q.add_argument(
        "--kb", metavar="PATH", help="entries directory or file (default: the shipped knowledge base)"))
    s = p.add_subparsers(dest="kb_command", required=True, metavar="ACTION")
    s.add_parser("list", parents=[after], help="one line per entry")
    sh = s.add_parser("show", parents=[after], help="one entry in full")
    sh.add_argument("entry_id", metavar="ID")
    v = s.add_parser("validate", parents=[after], help="validate entry files (default: the knowledge base in use)")
    v.add_argument("paths", nargs="*", metavar="PATH", help="entry files or directories")
    d = s.add_parser("draft", parents=[after], help="write a new entry skeleton from an unmatched incident's fingerprint")
    d.add_argument("--incident", required=True, metavar="ID", help="incident_id from the lake's incidents table")
    d.add_argument("--lake", metavar="PATH", default=os.environ.get("UNVEIL_LAKE"),
                   help="lake root (default: $UNVEIL_LAKE)")
    d.add_argument("--id", dest="new_id", metavar="ENTRY_ID", help="id of the new entry (default: draft_<incident>)")
    d.add_argument("--out", metavar="FILE", help="write here (default: stdout); never overwrites an existing file")
    p.set_defaults(func=run)


def _kb(args: argparse.Namespace) -> KnowledgeBase:
    return load_kb(args.kb)


def _list(kb: KnowledgeBase) -> None:
    width = max(len(e.id) for e in kb)
    print(f"{'id'.ljust(width)}  {'subsystems':<22} {'signals':>7}  {'remediation':<28} title")
    for e in kb:
        rem = (e.remediation.script or "guidance") + f" ({e.remediation.mode})" if e.remediation else "-"
        print(f"{e.id.ljust(width)}  {','.join(e.subsystems):<22} {len(e.signals):>7}  {rem:<28} {e.title}")


def _show(kb: KnowledgeBase, entry_id: str) -> None:
    e = kb.get(entry_id)
    wrap = lambda t: textwrap.fill(" ".join(t.split()), 96, initial_indent="  ", subsequent_indent="  ")  # noqa: E731
    print(f"{e.id} — {e.title}\n  file: {e.path}\n  label type: {e.label_type}\n  subsystems: {', '.join(e.subsystems)}"
          f"\n  min confidence: {e.min_confidence:g}\n")
    print("explanation:\n" + wrap(e.explanation) + "\n\nimpact:\n" + wrap(e.impact) + "\n")
    print("signature:")
    for s in e.signals:
        bounds = "".join([f", value < {s.value_below:g}" if s.value_below is not None else "",
                          f", value > {s.value_above:g}" if s.value_above is not None else ""])
        grp = f" [group {s.group}]" if s.group else ""
        print(f"  {s.role:<10} {s.key:<36} z >= {s.min_z:g}, change >= {s.min_change:g}{bounds}, weight {s.weight:g}{grp}")
    if e.preconditions:
        print("\npreconditions:")
        for p in e.preconditions:
            print(f"  {p.fact} {p.op} {'' if p.op == 'exists' else repr(p.value)}  — {p.why}")
    if e.remediation:
        r = e.remediation
        print(f"\nremediation: {r.script or 'manual guidance only'} ({r.mode})")
        if r.params:
            print("  params: " + ", ".join(f"{k}={v}" for k, v in r.params.items()))
        print(wrap(r.guidance))
    if e.verification:
        v = e.verification
        print(f"\nverification (within {v.within_s:g} s): " + ", ".join(
            f"{f.name} {f.direction}" + (f" to {f.at_least:g}" if f.at_least is not None else "") for f in v.features))
    if e.audit:
        print("\nstatic audit: " + ", ".join(a.check + (f" {a.category}.{a.key}" if a.key else "") for a in e.audit))
    if e.references:
        print("\nreferences:\n" + "\n".join(f"  - {r}" for r in e.references))


def _validate(args: argparse.Namespace) -> int:
    targets = [Path(p) for p in args.paths] if args.paths else [Path(args.kb) if args.kb else None]
    errors = 0
    for t in targets:
        try:
            if t is not None and t.is_file():
                e = load_entry(t)
                print(f"ok: {t} ({e.id})")
            else:
                kb = load_kb(t)
                print(f"ok: {kb.source}: {len(kb)} entries")
        except KBError as exc:
            print(f"invalid: {exc}", file=sys.stderr)
            errors += 1
    return 1 if errors else 0


def _draft(args: argparse.Namespace) -> int:
    import polars as pl

    from ingest import lake
    from knowledge_base.draft import draft_entry

    if not args.lake:
        raise ValueError("kb draft: give --lake PATH (or set UNVEIL_LAKE)")
    if "incidents" not in lake.tables(args.lake):
        raise ValueError(f"lake {args.lake}: no incidents table (run a sweep with matching first)")
    rows = lake.scan(args.lake, "incidents").filter(pl.col("incident_id") == args.incident).collect()
    if rows.is_empty():
        raise ValueError(f"lake {args.lake}: no incident {args.incident!r}")
    from knowledge_base.incidents import latest_incidents

    inc = latest_incidents(rows).row(-1, named=True)  # an open incident has a row per update
    if inc.get("status") == "matched":
        print(f"note: incident {args.incident} already matched {inc.get('entry_id')}; drafting anyway", file=sys.stderr)
    text = draft_entry(inc, args.new_id)
    if not args.out:
        sys.stdout.write(text)
        return 0
    out = Path(args.out)
    if out.exists():
        raise ValueError(f"{out} exists; not overwriting it")
    # validate before anything becomes visible (the file may be named anything until renamed)
    try:
        parse_entry(tomllib.loads(text), "<draft>")
    except KBError as exc:
        raise ValueError(f"draft does not validate: {exc}") from None
    try:
        write_atomic(out, text, mode=0o600, overwrite=False)  # never over a file made meanwhile
    except FileExistsError:
        raise ValueError(f"{out} exists; not overwriting it") from None
    print(f"wrote {out}: edit it, name it <id>.toml, then `unveil kb validate {out}`")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.kb_command == "validate":
        return _validate(args)
    if args.kb_command == "draft":
        return _draft(args)
    kb = _kb(args)
    if args.kb_command == "list":
        _list(kb)
    elif args.kb_command == "show":
        try:
            _show(kb, args.entry_id)
        except KeyError as exc:
            raise ValueError(str(exc.args[0])) from None
    return 0
