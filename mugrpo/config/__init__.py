"""The configuration tree: one pydantic model, loaded from YAML, with dotted command-line overrides.

Every knob names the paper it comes from. Sections owned by a subsystem are defined next to it (the policy loss in
:mod:`mugrpo.losses.config`, rewards in :mod:`mugrpo.rewards`, advantages in :mod:`mugrpo.scoring.advantages`, sampling
in :mod:`mugrpo.engines.base`) and composed in :mod:`mugrpo.config.tree`.

    cfg = load_config("configs/gsm8k-smollm2.yaml", ["train.lr=1e-6", "run.num_stages=2"])

Modules: :mod:`~mugrpo.config.run` (run, model, data), :mod:`~mugrpo.config.jobs` (generation, train, eval),
:mod:`~mugrpo.config.operations` (orchestration, tracking), :mod:`~mugrpo.config.tree` (the composed
:data:`Config` and its cross-section checks), :mod:`~mugrpo.config.loading` (YAML, overrides, error messages) and
:mod:`~mugrpo.config.docs` (the Markdown reference, imported on its own by ``mugrpo config reference``).
"""

from mugrpo.config.jobs import BenchmarkConfig, EvalSection, GenerationSection, TrainSection
from mugrpo.config.loading import ConfigError, apply_overrides, config_from_dict, format_validation_error, load_config
from mugrpo.config.operations import OrchestrationSection, TrackingSection
from mugrpo.config.run import DataSection, ModelSection, RunSection
from mugrpo.config.tree import Config

__all__ = [
    "BenchmarkConfig",
    "Config",
    "ConfigError",
    "DataSection",
    "EvalSection",
    "GenerationSection",
    "ModelSection",
    "OrchestrationSection",
    "RunSection",
    "TrackingSection",
    "TrainSection",
    "apply_overrides",
    "config_from_dict",
    "format_validation_error",
    "load_config",
]
