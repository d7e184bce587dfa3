"""configs/gsm8k-smollm2-agpo.yaml is the main config's experiment with AGPO: same budget of sampled responses
(probes counted) and updates, and it differs only in the algorithm and the prompts per stage."""

from __future__ import annotations

from pathlib import Path

from test_budgets import _budget, _diff

from mugrpo.config import load_config
from mugrpo.schedules.stages import stage_plan

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _sampled(cfg) -> int:
    prompts = sum(stage_plan(cfg, s).num_prompts for s in range(cfg.run.num_stages))
    probe = cfg.agpo is not None and cfg.agpo.probe
    return prompts * cfg.generation.sampling.n * (2 if probe else 1)


def test_agpo_config_is_on_the_main_budget_with_probes_counted():
    main = load_config(CONFIGS / "gsm8k-smollm2.yaml")
    agpo = load_config(CONFIGS / "gsm8k-smollm2-agpo.yaml")
    changed = {k for k in _diff(main, agpo) if not k.startswith(("loss.", "advantage.", "agpo"))}
    assert changed == {"generation.prompts_per_stage"}
    assert _sampled(agpo) == _sampled(main) == 512
    a, m = _budget(agpo), _budget(main)
    assert a["updates"] == m["updates"] == 32 and a["rollouts_per_update"] == m["rollouts_per_update"]
    assert a["evaluated_versions"] == m["evaluated_versions"]
    assert agpo.loss.name == "agpo" and agpo.advantage.estimator == "agpo" and agpo.loss.kl_coef == 0.03
