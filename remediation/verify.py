"""Did the remediation help? Compare an action's verification features before and after.

A verification spec (the knowledge base writes it, the queue stores it) is a mapping::

    {"within_s": 300, "min_windows": 3, "regression_tolerance": 0.05,
     "features": [{"name": "mem.hugepage_coverage", "direction": "up", "at_least": 0.8,
                   "min_change": 0.2}],
     "guards":   [{"name": "cpu.iowait_share", "direction": "down"}]}

``features`` must return to normal: a feature *improves* when it moves in its ``direction`` and
reaches ``at_least`` (an absolute target; for "down", at most) OR improves by ``min_change``
relative to its before value; with neither, any move in the right direction counts. ``guards``
only must not regress. A feature or guard *regresses* when it moves the wrong way by more than
``regression_tolerance`` (relative). The verdict is ``regressed`` if anything regressed,
``improved`` if every feature improved, else ``not_improved``.

Values are the median over the windows given (robust to a stray window). Frames are wide (one
column per feature, one row per window) or long (``feature`` and ``value`` columns).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, cast

import polars as pl

from remediation.errors import VerificationError

if TYPE_CHECKING:
    from remediation.executor import Executor

Verdict = Literal["improved", "not_improved", "regressed"]


@dataclass(frozen=True)
class Criterion:
    """One feature that must move (``features``) or must not get worse (``guards``)."""

    name: str
    direction: Literal["up", "down"]
    at_least: float | None = None
    min_change: float | None = None
    #: ``name`` is a family measured per device (the knowledge base knows which): the spec
    #: of an incident has one criterion per device of it (:meth:`VerificationSpec.spec`)
    per_device: bool = False


@dataclass(frozen=True)
class VerificationSpec:
    """What must return to normal after a remediation: the one type of it, written in a
    knowledge-base entry's ``[verification]``, stored on an action, judged here."""

    features: tuple[Criterion, ...]
    guards: tuple[Criterion, ...] = ()
    within_s: float = 300.0
    min_windows: int = 3
    regression_tolerance: float = 0.05

    def spec(self, devices: Sequence[str] = ()) -> dict[str, Any]:
        """The mapping an action stores for an incident on ``devices`` (:func:`parse_spec`
        reads it back): a per-device criterion becomes one per device (``family@device``)
        when the incident names devices."""

        def expand(items: tuple[Criterion, ...]) -> tuple[Criterion, ...]:
            return tuple(c2 for c in items for c2 in (
                [replace(c, name=f"{c.name}@{d}", per_device=False) for d in devices]
                if c.per_device and devices else [c]))

        return spec_to_dict(replace(self, features=expand(self.features), guards=expand(self.guards)))


def _num(where: str, v: Any, *, positive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise VerificationError(f"{where}: expected a number, got {v!r}")
    if positive and v <= 0:
        raise VerificationError(f"{where}: must be > 0, got {v!r}")
    return float(v)


def _criterion(where: str, d: Any) -> Criterion:
    if not isinstance(d, Mapping):
        raise VerificationError(f"{where}: expected a table, got {d!r}")
    unknown = set(d) - {"name", "direction", "at_least", "min_change"}
    if unknown:
        raise VerificationError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    name, direction = d.get("name"), d.get("direction")
    if not isinstance(name, str) or not name:
        raise VerificationError(f"{where}.name: expected a feature name, got {name!r}")
    if direction not in ("up", "down"):
        raise VerificationError(f"{where}.direction: expected 'up' or 'down', got {direction!r}")
    at_least = _num(f"{where}.at_least", d["at_least"]) if d.get("at_least") is not None else None
    min_change = (_num(f"{where}.min_change", d["min_change"], positive=True)
                  if d.get("min_change") is not None else None)
    return Criterion(name, direction, at_least, min_change)


def parse_spec(obj: Mapping[str, Any], where: str = "verification") -> VerificationSpec:
    """Validate a spec mapping; VerificationError names the offending key."""
    if not isinstance(obj, Mapping):
        raise VerificationError(f"{where}: expected a table, got {type(obj).__name__}")
    unknown = set(obj) - {"features", "guards", "within_s", "min_windows", "regression_tolerance"}
    if unknown:
        raise VerificationError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    feats = obj.get("features")
    if not isinstance(feats, list | tuple) or not feats:
        raise VerificationError(f"{where}.features: expected a non-empty list")
    guards = obj.get("guards") or []
    if not isinstance(guards, list | tuple):
        raise VerificationError(f"{where}.guards: expected a list")
    min_windows = obj.get("min_windows", 3)
    if isinstance(min_windows, bool) or not isinstance(min_windows, int) or min_windows < 1:
        raise VerificationError(f"{where}.min_windows: expected an integer >= 1, got {min_windows!r}")
    return VerificationSpec(
        features=tuple(_criterion(f"{where}.features[{i}]", f) for i, f in enumerate(feats)),
        guards=tuple(_criterion(f"{where}.guards[{i}]", g) for i, g in enumerate(guards)),
        within_s=_num(f"{where}.within_s", obj.get("within_s", 300.0), positive=True),
        min_windows=min_windows,
        regression_tolerance=_num(f"{where}.regression_tolerance", obj.get("regression_tolerance", 0.05)),
    )


def spec_to_dict(spec: VerificationSpec) -> dict[str, Any]:
    """The stored form of a spec (``per_device`` is the knowledge base's, resolved by
    :meth:`VerificationSpec.spec` before anything is stored)."""
    out = asdict(spec)
    for key in ("features", "guards"):
        out[key] = [{k: v for k, v in c.items() if k != "per_device"} for c in out[key]]
    return out


def _medians(df: pl.DataFrame, names: list[str], which: str) -> tuple[dict[str, float], int]:
    if {"feature", "value"} <= set(df.columns):
        long = df.filter(pl.col("feature").is_in(names)).drop_nulls("value")
        got = dict(long.group_by("feature").agg(pl.col("value").median()).iter_rows())
        n = long.group_by("feature").len()["len"].min() if long.height else 0
    else:
        missing = [n for n in names if n not in df.columns]
        if missing:
            raise VerificationError(f"{which} windows lack feature column(s) {', '.join(missing)}")
        row = df.select(pl.col(names).cast(pl.Float64).median()).row(0, named=True)
        got = {k: v for k, v in row.items() if v is not None}
        n = df.select(pl.min_horizontal(pl.col(names).count())).item() if df.height else 0
    lacking = [n for n in names if n not in got]
    if lacking:
        raise VerificationError(f"{which} windows have no values for {', '.join(lacking)}")
    return {k: float(v) for k, v in got.items()}, int(cast(Any, n) or 0)


def _judge(c: Criterion, b: float, a: float, tol: float) -> dict[str, Any]:
    sign = 1.0 if c.direction == "up" else -1.0
    good = sign * (a - b)  # > 0: moved the right way
    rel = good / abs(b) if b != 0 else (math.inf if good > 0 else -math.inf if good < 0 else 0.0)
    target_met = c.at_least is not None and (a >= c.at_least if c.direction == "up" else a <= c.at_least)
    change_met = rel >= c.min_change if c.min_change is not None else False
    if c.at_least is None and c.min_change is None:
        change_met = good > 0
    return {
        "name": c.name, "direction": c.direction, "before": b, "after": a, "change": a - b,
        "rel_improvement": rel if math.isfinite(rel) else None,
        "improved": bool(target_met or change_met), "regressed": bool(rel < -tol),
    }


def evaluate(spec: VerificationSpec, before: pl.DataFrame, after: pl.DataFrame) -> dict[str, Any]:
    """The effect of an action: verdict, per-feature before/after medians and judgements."""
    names = [c.name for c in (*spec.features, *spec.guards)]
    b, nb = _medians(before, names, "before")
    a, na = _medians(after, names, "after")
    if na < spec.min_windows:
        raise VerificationError(f"only {na} window(s) after the change; the spec needs {spec.min_windows}")
    if nb < 1:
        raise VerificationError("no windows before the change")
    judged = [_judge(c, b[c.name], a[c.name], spec.regression_tolerance) for c in spec.features]
    guarded = [_judge(c, b[c.name], a[c.name], spec.regression_tolerance) for c in spec.guards]
    verdict: Verdict
    if any(j["regressed"] for j in (*judged, *guarded)):
        verdict = "regressed"
    elif all(j["improved"] for j in judged):
        verdict = "improved"
    else:
        verdict = "not_improved"
    return {
        "verdict": verdict, "before": b, "after": a, "features": judged, "guards": guarded,
        "windows_before": nb, "windows_after": na,
    }


def verify_action(
    executor: Executor, action_id: int, before: pl.DataFrame, after: pl.DataFrame, *, actor: str = "scheduler"
) -> dict[str, Any]:
    """Judge a ``verifying`` action: improved -> ``succeeded``; otherwise roll back -> ``failed``.

    The effect is stored on the action (remediations table) and in the audit trail. If the
    rollback itself fails, the action stays ``verifying`` (holding its host) and the error is
    raised, so an operator must look.
    """
    q = executor.queue
    action = q.get(action_id)
    if action.state != "verifying":
        raise VerificationError(f"action {action_id} is {action.state}, not verifying")
    if not action.verification:
        raise VerificationError(f"action {action_id} has no verification spec")
    effect = evaluate(parse_spec(action.verification), before, after)
    if effect["verdict"] == "improved":
        q.transition(action_id, "succeeded", actor=actor, event="verified", details=effect, effect=effect)
        return effect
    q.record(action_id, actor=actor, event="verification_failed", details=effect)
    executor.rollback(action_id, actor=actor, to="failed", effect=effect)
    return effect
