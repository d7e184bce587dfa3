"""The trainer: many optimizer updates of a policy on a stage's static rollout set (Mu-GRPO, arXiv 2605.17570).

Modules, one job each: :mod:`~mugrpo.trainer.spec` (the job spec), :mod:`~mugrpo.trainer.data` (rollouts through
the generation manifest, deterministic minibatch order), :mod:`~mugrpo.trainer.batch` (right-padded collation),
:mod:`~mugrpo.trainer.forward` (token log-probs via the chunked log-softmax), :mod:`~mugrpo.trainer.optim`
(AdamW, LR schedules), :mod:`~mugrpo.trainer.step` (one update), :mod:`~mugrpo.trainer.checkpoint`,
:mod:`~mugrpo.trainer.records` (the train_steps table) and :mod:`~mugrpo.trainer.loop` (the job).
"""
