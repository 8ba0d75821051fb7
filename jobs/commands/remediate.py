"""``unveil remediate``: list, show, approve, reject, run (dry-run unless --execute), rollback."""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import json
import os
from pathlib import Path

from ingest import lake as lake_mod
from jobs import config
from jobs.commands import verb_options
from remediation.errors import RemediationError
from remediation.executor import Executor
from remediation.queue import STATES, Action, Queue, default_path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("remediate", help="review, approve, run and roll back queued remediations")

    def where(q: argparse.ArgumentParser) -> None:
        q.add_argument("--queue", metavar="DB",
                       help="queue file (default: [remediation] queue, or <lake>/_remediation/queue.db)")
        q.add_argument("--lake", metavar="DIR", help="lake directory (default: $UNVEIL_LAKE or [lake] path in config)")

    after = verb_options(p, where)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    ls = verbs.add_parser("list", parents=[after], help="list actions")
    ls.add_argument("--state", choices=STATES)
    ls.add_argument("--host")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    show = verbs.add_parser("show", parents=[after], help="one action with its audit trail")
    show.add_argument("id", type=int)
    ap = verbs.add_parser("approve", parents=[after], help="approve a proposed action")
    ap.add_argument("id", type=int)
    ap.add_argument("--by", help="approver (default: the login name)")
    rj = verbs.add_parser("reject", parents=[after], help="reject a proposed or approved action")
    rj.add_argument("id", type=int)
    rj.add_argument("--reason", default="")
    rj.add_argument("--by")
    run = verbs.add_parser("run", parents=[after], help="dry-run an action (default) or really apply it (--execute)")
    run.add_argument("id", type=int)
    run.add_argument("--execute", action="store_true", help="really change the host (needs approval)")
    run.add_argument("--by")
    vf = verbs.add_parser("verify", parents=[after], help="judge a verifying action now from the lake's features "
                          "(succeeded, or rolled back and failed; unverifiable without data)")
    vf.add_argument("id", type=int)
    vf.add_argument("--by")
    rb = verbs.add_parser("rollback", parents=[after], help="restore the state recorded before an action")
    rb.add_argument("id", type=int)
    rb.add_argument("--by")
    p.set_defaults(func=main)


class _NoQueue(FileNotFoundError):
    def __init__(self, path: Path) -> None:
        super().__init__(f"no remediation queue at {path}: nothing has been proposed in this lake "
                         f"(check --lake or --queue)")


def _open(args: argparse.Namespace) -> tuple[Queue, Executor]:
    cfg = config.load(getattr(args, "config", None), analysis=False)
    exec_cfg = cfg.remediation
    if args.queue:
        qpath = Path(args.queue)
    elif exec_cfg.queue:
        qpath = Path(exec_cfg.queue)
    else:
        lake = config.resolve_lake(args.lake, cfg)
        lake_mod.require(lake)  # a mistyped --lake is an error, not an empty queue
        qpath = default_path(lake)
    if args.verb == "verify":  # judged from the lake's features
        args.lake_dir = config.resolve_lake(args.lake, cfg)
    if not qpath.exists():  # every verb reads it: never create one where the user mistyped a path
        raise _NoQueue(qpath)
    queue = Queue(qpath)
    return queue, Executor(queue, exec_cfg)


def _who(args: argparse.Namespace) -> str:
    return getattr(args, "by", None) or os.environ.get("SUDO_USER") or getpass.getuser()


def _ts(us: int) -> str:
    return dt.datetime.fromtimestamp(us / 1e6, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _line(a: Action) -> str:
    params = " ".join(f"{k}={v}" for k, v in a.params.items())
    return f"{a.id:>5}  {a.state:<11} {a.mode:<6} {a.host:<20} {a.entry_id:<28} {a.script_id} {params}"


def main(args: argparse.Namespace) -> int:
    try:
        queue, ex = _open(args)
    except _NoQueue as exc:
        if args.verb != "list":
            raise
        print(exc)  # nothing to list is an answer, not an error
        return 0
    try:
        return _dispatch(args, queue, ex)
    except RemediationError as exc:
        if isinstance(exc, ValueError):
            raise
        print(f"unveil remediate {args.verb}: {exc}")
        return 1
    finally:
        queue.close()


def _dispatch(args: argparse.Namespace, queue: Queue, ex: Executor) -> int:
    if args.verb == "list":
        actions = queue.actions(state=args.state, host=args.host)
        if args.json:
            for a in actions:
                print(json.dumps(a.__dict__, sort_keys=True))
        else:
            print(f"{'id':>5}  {'state':<11} {'mode':<6} {'host':<20} {'entry':<28} script params")
            for a in actions:
                print(_line(a))
        return 0
    if args.verb == "show":
        a = queue.get(args.id)
        print(json.dumps({k: v for k, v in a.__dict__.items() if k != "output"}, indent=2, sort_keys=True))
        print("audit trail:")
        for e in queue.audit(args.id):
            print(f"  {_ts(e.time_us)}  {e.actor:<16} {e.event:<20} {json.dumps(e.details, sort_keys=True)[:400]}")
        return 0
    if args.verb == "approve":
        a = queue.approve(args.id, by=_who(args))
        print(f"action {a.id} approved by {a.approved_by}; run it with: unveil remediate run {a.id} --execute")
        return 0
    if args.verb == "reject":
        a = queue.reject(args.id, by=_who(args), reason=args.reason)
        print(f"action {a.id} rejected")
        return 0
    if args.verb == "run":
        if not args.execute:
            res = ex.dry_run(args.id, actor=_who(args))
            print("DRY RUN: nothing was changed. With --execute this would run:")
            print("  " + " ".join(ex.command(queue.get(args.id), "apply")))
            print(json.dumps(res.result, indent=2, sort_keys=True))
            return 0 if res.ok else 1
        a = ex.execute(args.id, actor=_who(args))
        out = a.output or {}
        print(f"action {a.id}: {a.state}")
        print(json.dumps(out.get("result") or out, indent=2, sort_keys=True))
        return 0 if a.state in ("verifying", "succeeded") else 1
    if args.verb == "verify":
        from jobs.verification import conclude

        o = conclude(Path(args.lake_dir), ex, queue.get(args.id), now=dt.datetime.now(dt.UTC), actor=_who(args),
                     force=True)
        print(f"action {o.action_id}: {o.state} ({o.reason})")
        a = queue.get(args.id)
        if a.effect:
            print(json.dumps({k: a.effect.get(k) for k in ("verdict", "before", "after")}, indent=2, sort_keys=True))
        return 0 if o.state in ("succeeded", "verifying") else 1
    if args.verb == "rollback":
        res = ex.rollback(args.id, actor=_who(args))
        print(f"action {args.id}: rolled back")
        print(json.dumps(res.result, indent=2, sort_keys=True))
        return 0
    raise ValueError(f"unknown verb {args.verb!r}")
