"""One verification-spec type: a knowledge-base entry's [verification] is the remediation's
VerificationSpec, and what an action stores reads back as the same spec."""

from __future__ import annotations

from dataclasses import replace

from knowledge_base.loader import load_kb
from remediation.verify import Criterion, VerificationSpec, parse_spec, spec_to_dict


def test_kb_entries_hold_the_remediation_spec_and_it_round_trips() -> None:
    kb = load_kb()
    for e in kb:
        v = e.verification
        assert isinstance(v, VerificationSpec), e.id
        assert all(isinstance(c, Criterion) for c in (*v.features, *v.guards))
        stored = v.spec(["gpu3"])
        back = parse_spec(stored)  # what the verifier reads from the queue
        assert spec_to_dict(back) == stored, e.id
        host_wide = [c for c in v.features if not c.per_device]
        assert [c.name for c in back.features if "@" not in c.name] == [c.name for c in host_wide], e.id


def test_per_device_criteria_expand_and_host_wide_ones_do_not() -> None:
    spec = VerificationSpec(features=(Criterion("gpu.power_limit_ratio", "up", at_least=0.99, per_device=True),
                                      Criterion("mem.hugepage_coverage", "up", min_change=0.05)),
                            guards=(Criterion("gpu.sm_util", "down", per_device=True),), within_s=60.0)
    d = spec.spec(["gpu0", "gpu1"])
    assert [f["name"] for f in d["features"]] == ["gpu.power_limit_ratio@gpu0", "gpu.power_limit_ratio@gpu1",
                                                  "mem.hugepage_coverage"]
    assert [g["name"] for g in d["guards"]] == ["gpu.sm_util@gpu0", "gpu.sm_util@gpu1"]
    assert parse_spec(spec.spec([])) == replace(spec, features=tuple(replace(c, per_device=False) for c in spec.features),
                                                guards=tuple(replace(c, per_device=False) for c in spec.guards))
