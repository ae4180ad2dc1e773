"""benchmarks.validate_study: the plan of the full study, its verdict, and a CPU smoke (deit_tiny, topk-l2, one
schedule, fp16-all, 3 images, the LayerNorm-eps mutant; exports in 2 processes) writing the result file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.validate_study import MODELS, SCHEDULES, StudyConfig, main, passed, plan, totals
from raggedvit.validators.mutants import MUTANTS


def test_the_full_plan_covers_every_case():
    clean, mutants = plan(StudyConfig(), Path("/w"), Path("/w/base.pth"))
    assert len(clean) == len(MODELS) * 4 * 2 * 2 and len({j.key for j in clean}) == len(clean)
    assert {j.model for j in clean} == set(MODELS) and {j.dtype for j in clean} == {"fp16", "fp16-all"}
    assert all(j.capacity == (j.spec["policy"] == "cls-mass") for j in clean)
    assert {json.dumps(j.spec, sort_keys=True) for j in clean} == {
        json.dumps(s, sort_keys=True) for specs in SCHEDULES.values() for s in specs
    }
    assert {j.key.split("_", 2)[2] for j in clean if j.spec["policy"] == "tome"} == {
        "tome_atall_r8_fp16",
        "tome_atall_r8_fp16-all",
        "tome_atall_r16_fp16",
        "tome_atall_r16_fp16-all",
    }
    assert [j.mutant for j in mutants] == [None, *(m.name for m in MUTANTS)] * 2
    assert all(j.checkpoint == "/w/base.pth" for j in mutants)


def test_the_verdict_counts_false_failures_and_missed_or_unnamed_mutants():
    ok = {"passed": True, "precision_ties": [{}]}
    mutant = {"caught": True, "named": True}
    t = totals([ok, {"passed": False, "precision_ties": []}], [mutant, {"caught": False, "named": False}], [])
    assert (t["false_failures"], t["precision_ties"], t["mutants_missed"], t["mutants_not_named"]) == (1, 1, 1, 0)
    assert not passed({"totals": t})
    assert passed({"totals": totals([ok], [mutant], [])})
    assert not passed({"totals": totals([ok], [{"caught": True, "named": False}], [])})
    assert not passed({"totals": totals([ok], [mutant], [{"error": "x"}])})


@pytest.mark.slow
def test_cpu_smoke_writes_the_result_file(tmp_path, capsys):
    argv = ["--out", str(tmp_path), "--device", "cpu", "--models", "deit_tiny_patch16_224", "--policies", "topk-l2"]
    argv += ["--schedules", "1", "--dtypes", "fp16-all", "--images", "3", "--mutants", "layernorm_eps_x100"]
    assert main([*argv, "--jobs", "2"]) == 0
    (path,) = tmp_path.glob("validate_study_cpu.json")
    assert f"wrote {path}" in capsys.readouterr().out
    res = json.loads(path.read_text())
    assert res["benchmark"] == "validate_study" and res["device"] == "cpu" and res["env"]["packages"]
    assert res["config"]["image_names"] == ["chelsea", "coffee", "rocket"]
    assert res["totals"] == {
        "exports": 2, "false_failures": 0, "precision_ties": res["totals"]["precision_ties"], "mutants": 1,
        "mutants_missed": 0, "mutants_not_named": 0, "export_errors": 0,
    }  # fmt: skip
    clean, control = res["exports"]
    assert clean["case"] == "deit_tiny_topk-l2_at3-6-9_keep0.5_fp16-all" and clean["passed"] and clean["judged"] >= 1
    assert "all match" in clean["structure"] and clean["export_s"] > 0 and control["case"] == "mutant_control_fp16-all"
    (mutant,) = res["mutants"]
    assert mutant["caught"] and mutant["named"] and mutant["first_failure"].startswith("structure: block 0: norm eps")
    assert set(res["timing"]) >= {"exports_s", "reference_s", "validate_s", "total_s"}
