"""``unveil schema``: print the telemetry schema (Markdown or JSON)."""

from __future__ import annotations

import argparse
import json

from ingest import schema


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schema", help="print the telemetry schema")
    p.add_argument("--format", choices=["markdown", "json"], default="markdown")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.format == "markdown":
        print(schema.markdown())
    else:
        doc = {
            m.name: {
                "tags": ["host", *m.tags],
                "tier": m.tier,
                "sparse": m.sparse,
                "fields": {
                    f.name: {"dtype": str(f.dtype), "unit": f.unit, "kind": f.kind, "subsystem": f.subsystem}
                    for f in m.fields
                },
            }
            for m in schema.MEASUREMENTS.values()
        }
        print(json.dumps(doc, indent=2))
    return 0
