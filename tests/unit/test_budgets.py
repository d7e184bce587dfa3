"""The three GSM8K configs (Mu-GRPO, standard GRPO, the naive high-staleness ablation) are one experiment: they
differ only in the algorithm and the schedule, never in model, data, sampling, optimizer, reward or budget."""

from __future__ import annotations

from pathlib import Path

from bench.real_lm import LORA_VARIANT
from mugrpo.config import load_config
from mugrpo.orchestration.runs import evaluates_stage, policy_version
from mugrpo.schedules.stages import stage_plan, total_updates

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
#: Keys a baseline may change: the algorithm (the loss), the schedule and how the run is executed.
SCHEDULE = {"run.num_stages", "generation.prompts_per_stage", "train.updates_per_stage", "eval.every_n_stages"}
ALGORITHM_PREFIXES = ("loss.", "replay.")
EXECUTION_PREFIXES = ("orchestration.",)


def _flat(node, prefix: str = "") -> dict:
    if isinstance(node, dict):
        return {k: v for key, child in node.items() for k, v in _flat(child, f"{prefix}{key}.").items()}
    return {prefix[:-1]: node}


def _diff(a, b) -> set[str]:
    fa, fb = _flat(a.to_json_dict()), _flat(b.to_json_dict())
    return {k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k)} - {"run.id"}


def _budget(cfg) -> dict:
    k = cfg.run.num_stages
    plans = [stage_plan(cfg, s) for s in range(k)]
    return {
        "updates": total_updates(cfg),
        "rollouts": sum(p.num_prompts for p in plans) * cfg.generation.sampling.n,
        "rollouts_per_update": cfg.train.rollouts_per_update,
        "prompt_range": (plans[0].prompt_start, plans[-1].prompt_start + plans[-1].num_prompts),
        "evaluated_versions": sorted({policy_version(cfg, s) for s in range(k) if evaluates_stage(cfg, s)})
        + [total_updates(cfg)],
    }


def test_baselines_differ_from_the_main_config_only_in_algorithm_and_schedule():
    main = load_config(CONFIGS / "gsm8k-smollm2.yaml")
    grpo = load_config(CONFIGS / "gsm8k-smollm2-grpo.yaml")
    naive = load_config(CONFIGS / "gsm8k-smollm2-naive.yaml")
    replay = load_config(CONFIGS / "gsm8k-smollm2-replay.yaml")

    extra = {
        k for k in _diff(main, grpo) if k not in SCHEDULE and not k.startswith(ALGORITHM_PREFIXES + EXECUTION_PREFIXES)
    }
    assert not extra, f"gsm8k-smollm2-grpo.yaml differs from the main config outside algorithm/schedule: {extra}"
    extra = {k for k in _diff(main, naive) if not k.startswith(ALGORITHM_PREFIXES)}
    assert not extra, f"gsm8k-smollm2-naive.yaml differs from the main config outside the loss: {extra}"

    # replay GRPO runs like the GRPO baseline; only the loss knobs and the replay section differ from it
    # (and recompute_behavior_logprobs, which replay refuses: a replayed row keeps its birth behavior log-probs)
    assert {k for k in _diff(grpo, replay) if not k.startswith(ALGORITHM_PREFIXES)} == {
        "train.recompute_behavior_logprobs"
    }
    assert replay.replay.enabled and replay.orchestration == grpo.orchestration

    # the budgets those keys leave: equal (replay: same FRESH rollouts per update and updates; replayed rollouts are
    # extra compute per update, never extra generation)
    assert _budget(main) == _budget(grpo) == _budget(naive) == _budget(replay)
    assert _budget(main)["updates"] == 32 and _budget(main)["rollouts"] == 512

    # and the algorithms are the ones the paper compares
    assert main.loss.name == "mu_grpo" and main.train.updates_per_stage == 8
    assert grpo.train.updates_per_stage == 4  # staleness mu = 4: standard GRPO
    assert grpo.orchestration.execution == "warm" and main.orchestration.execution == "cold"
    for baseline in (grpo, naive):
        assert baseline.loss.name == "grpo" and (baseline.loss.eps_low, baseline.loss.eps_high) == (0.2, 0.2)
    assert naive.run.num_stages == main.run.num_stages  # mu large, like Mu-GRPO
    # the re-implementation's GRPO (arXiv 2606.04560): clip-higher 0.2/0.28, dual-clip 10, token-mean, no KL
    assert (replay.loss.name, replay.loss.eps_low, replay.loss.eps_high) == ("grpo", 0.2, 0.28)
    assert (replay.loss.dual_clip_c, replay.loss.agg_mode, replay.loss.kl_coef) == (10.0, "token-mean", 0.0)


def test_the_budget_check_catches_a_changed_budget():
    main = load_config(CONFIGS / "gsm8k-smollm2.yaml")
    for override in ("train.lr=1e-5", "generation.sampling.max_new_tokens=128", "generation.sampling.n=4"):
        other = load_config(CONFIGS / "gsm8k-smollm2-grpo.yaml", [override])
        changed = {k for k in _diff(main, other) if k not in SCHEDULE and not k.startswith(("loss.", "orchestration."))}
        assert changed == {override.split("=")[0]}
    longer = load_config(CONFIGS / "gsm8k-smollm2-grpo.yaml", ["run.num_stages=16"])
    assert _budget(longer) != _budget(main)  # a schedule key may change, the budget it implies may not


LAB = CONFIGS / "lab"
LAB_ALGORITHM_PREFIXES = ("loss.", "replay.", "advantage.", "agpo")


def _sampled(cfg) -> int:
    """Sampled responses of a run, AGPO's probes counted."""
    probes = 2 if cfg.agpo is not None and cfg.agpo.probe else 1
    return sum(stage_plan(cfg, s).num_prompts for s in range(cfg.run.num_stages)) * cfg.generation.sampling.n * probes


def test_lab_configs_are_one_experiment_on_one_budget():
    """configs/lab/: one config per algorithm; they differ only in the algorithm, the schedule and the execution, and
    the budget those keys leave (updates, rollouts per update, sampled responses with AGPO's probes, evaluated
    policy versions) is equal. The model and data are the lab recipe's (mugrpo.lab)."""
    from mugrpo.lab import LabRecipe

    names = sorted(p.stem for p in LAB.glob("*.yaml"))
    assert names == ["agpo", "conspo", "grpo", "mu-grpo", "naive", "replay"]
    cfgs = {n: load_config(LAB / f"{n}.yaml") for n in names}
    main = cfgs["mu-grpo"]
    for name, cfg in cfgs.items():
        allowed = SCHEDULE | {"train.group_minibatches", "train.recompute_behavior_logprobs"}
        extra = {
            k
            for k in _diff(main, cfg)
            if k not in allowed and not k.startswith(LAB_ALGORITHM_PREFIXES + EXECUTION_PREFIXES)
        }
        assert not extra, f"configs/lab/{name}.yaml differs from mu-grpo.yaml outside algorithm/schedule: {extra}"
        b, m = _budget(cfg), _budget(main)
        assert b["updates"] == m["updates"] == 64, name
        assert b["rollouts_per_update"] == m["rollouts_per_update"] == 128, name
        assert b["evaluated_versions"] == m["evaluated_versions"] == [0, 16, 32, 48, 64], name
        assert _sampled(cfg) == _sampled(main) == 8192, name
        if cfg.agpo is None:  # AGPO samples a probe group per prompt: half the prompts for the same responses
            assert b["prompt_range"] == m["prompt_range"] == (0, 1024), name
    # the algorithms the issue names, each as its paper runs it
    assert main.loss.name == "mu_grpo" and main.run.num_stages == 4 and main.orchestration.execution == "cold"
    grpo, naive = cfgs["grpo"], cfgs["naive"]
    assert grpo.loss.name == "grpo" and grpo.train.updates_per_stage == 4 and grpo.orchestration.execution == "warm"
    assert naive.loss.name == "grpo" and (naive.loss.eps_low, naive.loss.eps_high) == (0.2, 0.2)
    assert naive.train.updates_per_stage == main.train.updates_per_stage == 16  # mu large, PPO clip, no veto
    assert cfgs["replay"].replay.enabled and cfgs["conspo"].loss.name == "conspo"
    assert cfgs["agpo"].agpo.probe and cfgs["agpo"].loss.name == "agpo"
    # the lab policy's recipe: same task, params, seed, split and prompt as the policy was warm-started on
    recipe = LabRecipe()
    for cfg in cfgs.values():
        train = cfg.data.train
        assert cfg.model.source == "lab"
        assert (train.source, train.task, train.params, train.seed) == ("reasoning_gym", recipe.task, recipe.params, 0)
        assert train.heldout_fraction == recipe.heldout_fraction and train.split == "train"
        assert cfg.data.prompt == recipe.prompt()
        for bench in cfg.eval.benchmarks:
            assert bench.dataset.split == "heldout" and bench.dataset.params == recipe.params


def test_arithmetic_configs_are_one_experiment_on_one_budget():
    """The main job (smollm2-arithmetic.yaml, Mu-GRPO cold) and its GRPO-warm baseline share model, data and order,
    prompt, sampling, reward, budget and full fine-tuning (LoRA runs cold only); the baseline differs in the
    algorithm, the schedule, the execution and the lr, each method at the better of the two lrs measured for it on
    this budget (Mu-GRPO 5e-6, GRPO warm 1e-5; docs/benchmarks.md). The main job's LoRA variant (bench/real_lm.py's
    ``mu-lora`` arm) differs from it in the adapters and their lr only."""
    main = load_config(CONFIGS / "smollm2-arithmetic.yaml")
    grpo = load_config(CONFIGS / "smollm2-arithmetic-grpo.yaml")
    lora = load_config(CONFIGS / "smollm2-arithmetic.yaml", LORA_VARIANT)
    extra = {
        k for k in _diff(main, grpo) if k not in SCHEDULE and not k.startswith(ALGORITHM_PREFIXES + EXECUTION_PREFIXES)
    }
    assert extra == {"train.lr"}, extra
    assert {".".join(k.split(".")[:2]) for k in _diff(main, lora)} == {"train.lora", "train.lr"}
    assert _budget(main) == _budget(grpo) == _budget(lora)
    assert _budget(main)["updates"] == 32 and _budget(main)["rollouts"] == 512
    assert _budget(main)["evaluated_versions"] == [0, 8, 16, 24, 32]
    assert main.train.lora is None and grpo.train.lora is None and lora.train.lora.rank == 16
    assert (main.train.lr, grpo.train.lr, lora.train.lr) == (5.0e-6, 1.0e-5, 1.0e-4)
    assert main.loss.name == "mu_grpo" and main.orchestration.execution == "cold"
    assert grpo.loss.name == "grpo" and grpo.orchestration.execution == "warm" and grpo.train.updates_per_stage == 4
