"""Knowledge-base files: the shipped entries load; malformed entries are rejected with a
message naming the file and the field."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from jobs.cli import main
from knowledge_base import KBError, load_entry, load_kb
from knowledge_base.loader import ENTRIES_DIR
from remediation import registry

GOOD = (ENTRIES_DIR / "gpu_power_throttle.toml").read_text(encoding="utf-8")


def test_shipped_kb_loads_and_is_consistent() -> None:
    kb = load_kb()
    assert len(kb) >= 12
    for e in kb:
        assert Path(e.path).stem == e.id
        assert e.required, e.id
        assert e.explanation and e.impact and e.subsystems
        assert e.remediation is not None and e.remediation.guidance, e.id
        if e.remediation.script:
            assert e.remediation.script in registry.SCRIPTS
        assert e.verification is not None, e.id
    # the research's four are there
    assert {"gpu_nic_numa_misplacement", "irq_locality_miss", "thp_coverage_loss", "gpu_power_throttle"} <= set(kb.by_id)


def _write(tmp_path: Path, text: str, name: str = "gpu_power_throttle.toml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


@pytest.mark.parametrize(
    ("old", "new", "field", "says"),
    [
        ('feature = "gpu.power_limit_ratio"', 'feature = "gpu.power_limit_ratoi"', "signals[0].feature",
         "unknown feature family 'gpu.power_limit_ratoi'"),
        ('direction = "down"\nrole = "required"', 'direction = "sideways"\nrole = "required"', "signals[0].direction",
         "'sideways'"),
        ('role = "required"', 'role = "mandatory"', "signals[0].role", "'mandatory'"),
        ('min_z = 3.0\nmin_change = 0.03\nvalue_below', 'min_z = "high"\nmin_change = 0.03\nvalue_below',
         "signals[0].min_z", "expected a number"),
        ('title = "GPU power throttling (lowered power limit)"\n', "", "title", "missing"),
        ('subsystems = ["gpu"]\n', 'subsystems = ["gpu"]\nmin_duration_s = -5\n', "min_duration_s", "must be >= 0"),
        ('subsystems = ["gpu"]\n', 'subsystems = ["gpu"]\nmin_duration_s = "1m"\n', "min_duration_s",
         "expected a number"),
        ('id = "gpu_power_throttle"', 'id = "gpu_power_cap"', "id", "differs from the file name"),
        ('script = "gpu_power_limit"', 'script = "rm_rf"', "remediation.script", "not in the remediation allowlist"),
        ('mode = "manual"\nparams', 'mode = "auto"\nparams', "remediation.mode", "not safe for automatic execution"),
        ('params = { gpu = "{device_indices}", limit_w = "{fact:gpu.power_limit_default_w}" }',
         'params = { gpu = "{device_indices}", watts = 300 }', "remediation.params", "unknown parameter(s) watts"),
        ('params = { gpu = "{device_indices}", limit_w = "{fact:gpu.power_limit_default_w}" }',
         'params = { gpu = "{device_indices}", limit_w = "{fact:gpu.power_limit_default_w}; reboot" }',
         "remediation.params.limit_w", "bad template"),
        ('params = { gpu = "{device_indices}", limit_w = "{fact:gpu.power_limit_default_w}" }',
         'params = { gpu = 100, limit_w = 300 }', "remediation.params.gpu", "'100' does not match"),
        ('fact = "gpu.count"', 'fact = "gpu count"', "preconditions[0].fact", "neither a derived fact"),
        ('op = ">="', 'op = "~"', "preconditions[0].op", "'~'"),
        ("[[audit]]\ncheck = \"fact_ratio\"", "[[audit]]\ncheck = \"magic\"", "audit[0].check", "'magic'"),
        ('within_s = 120', 'within_s = 0', "verification.within_s", "must be >= 1"),
    ],
)
def test_malformed_entry_names_file_and_field(tmp_path: Path, old: str, new: str, field: str, says: str) -> None:
    assert old in GOOD, old
    p = _write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(KBError) as exc:
        load_entry(p)
    msg = str(exc.value)
    assert msg.startswith(f"{p}: {field}:"), msg
    assert says in msg, msg


def test_unknown_key_and_no_required_signal(tmp_path: Path) -> None:
    with pytest.raises(KBError, match=r"signals\[1\]: unknown key\(s\) colour"):
        load_entry(_write(tmp_path, GOOD.replace('feature = "gpu.throttle_power_share"',  # signals[1], not a gate
                                                 'feature = "gpu.throttle_power_share"\ncolour = "red"', 1)))
    text = (GOOD.replace('role = "required"', 'role = "supporting"').replace('group = "cap"\n', "")
            .replace("cause = true", ""))
    with pytest.raises(KBError, match=r"signals: at least one signal must have role = 'required'"):
        load_entry(_write(tmp_path, text))


def test_cause_only_on_a_required_absolute_signal(tmp_path: Path) -> None:
    assert [s.feature for s in load_entry(_write(tmp_path, GOOD)).signals if s.cause] == ["gpu.power_limit_ratio"]
    # the relative power-limit signal (z against history) reads a change, not the setting
    text = GOOD.replace('min_change = 0.03\nvalue_below = 0.97\n', 'min_change = 0.03\nvalue_below = 0.97\ncause = true\n', 1)
    with pytest.raises(KBError, match=r"signals\[0\]\.cause: only a required absolute signal reads the cause itself"):
        load_entry(_write(tmp_path, text))
    with pytest.raises(KBError, match=r"\.cause: expected true or false"):
        load_entry(_write(tmp_path, GOOD.replace("cause = true", 'cause = "yes"')))


def test_bad_toml_and_duplicate_ids(tmp_path: Path) -> None:
    p = _write(tmp_path, GOOD + "\n[[signals]\n")
    with pytest.raises(KBError, match=rf"^{p}: not valid TOML"):
        load_entry(p)
    d = tmp_path / "kb"
    d.mkdir()
    shutil.copy(ENTRIES_DIR / "gpu_power_throttle.toml", d / "gpu_power_throttle.toml")
    (d / "other.toml").write_text(GOOD.replace('id = "gpu_power_throttle"', 'id = "other"'), encoding="utf-8")
    assert len(load_kb(d)) == 2
    (d / "_draft.toml").write_text("not toml at all [", encoding="utf-8")  # skipped: starts with _
    assert len(load_kb(d)) == 2
    with pytest.raises(KBError, match="no such knowledge-base file or directory"):
        load_kb(tmp_path / "missing")


def test_cli_list_show_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kb", "list"]) == 0
    out = capsys.readouterr().out
    assert "gpu_nic_numa_misplacement" in out and "thp (auto)" in out
    assert main(["kb", "show", "irq_locality_miss"]) == 0
    out = capsys.readouterr().out
    assert "irq.locality ↓" in out and "irq_affinity (auto)" in out
    assert main(["kb", "show", "nope"]) == 2
    assert "no knowledge-base entry 'nope'" in capsys.readouterr().err
    assert main(["kb", "validate"]) == 0
    bad = _write(tmp_path, GOOD.replace('direction = "down"', 'direction = "left"', 1))
    assert main(["kb", "validate", str(bad)]) == 1
    assert f"invalid: {bad}: signals[0].direction" in capsys.readouterr().err


def test_a_gate_says_what_a_device_without_its_feature_gets(tmp_path: Path) -> None:
    gate = 'gate = { feature = "gpu.throttle_power_share", above = 0.05 }'
    assert gate in GOOD

    def gate_of(text: str) -> object:
        return next(s.gate for s in load_entry(_write(tmp_path, text)).signals if s.gate is not None)

    assert gate_of(GOOD).if_missing == "pass"  # type: ignore[attr-defined]
    failing = GOOD.replace(gate, gate[:-2] + ', if_missing = "fail" }')
    assert gate_of(failing).if_missing == "fail"  # type: ignore[attr-defined]
    with pytest.raises(KBError, match=r"gate\.if_missing: .*'maybe'"):
        load_entry(_write(tmp_path, GOOD.replace(gate, gate[:-2] + ', if_missing = "maybe" }')))
    with pytest.raises(KBError, match=r"gate\.if_missing: applies to a gate feature"):
        load_entry(_write(tmp_path, GOOD.replace(
            gate, 'gate = { fact = "thp.enabled", op = "==", value = "never", if_missing = "fail" }')))
