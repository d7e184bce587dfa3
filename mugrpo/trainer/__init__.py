"""The trainer: many optimizer updates of a policy on a stage's static rollout set (Mu-GRPO, arXiv 2605.17570).

Modules, one job each, in the order a stage uses them:

==============  ======================================================================================
module          what
==============  ======================================================================================
``spec``        :data:`~mugrpo.trainer.spec.TrainSpec`, the job's spec
``data``        rollouts through the generation manifest; the deterministic minibatch order
``loop``        :class:`~mugrpo.trainer.loop.Trainer`: the stage lifecycle (skip, setup, updates, publish, commit)
``setup``       :func:`~mugrpo.trainer.setup.setup_stage`: from the spec to the frozen ``StageRun``, on one screen
``resume``      the resume point, AdamW / LR schedule / RNG, the algorithms' state
``stage``       :class:`~mugrpo.trainer.stage.StageRun`: model, LoRA, optimizer, data, plan, hooks, precision
``updates``     the update loop: compose, per-rollout inputs, step, record
``batch``       right-padded collation of rollouts into token tensors
``forward``     token log-probs of the policy via the chunked log-softmax
``step``        one optimizer update (micro-batches, clipping, the NaN/inf guard)
``optim``       AdamW and the LR schedule
``commit``      checkpoints, the published policy and the job manifest
``checkpoint``  the checkpoint folder format (atomic write, no-pickle read)
``records``     the train_steps table
``precision``   bf16 autocast helpers and the fp32-master check
==============  ======================================================================================

The algorithms that are more than a loss (:mod:`mugrpo.algorithms`) plug in through
:class:`~mugrpo.algorithms.TrainHooks`, called by ``setup``, ``resume``, ``updates`` and ``commit``; none of these
modules names an algorithm.
"""
