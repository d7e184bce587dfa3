"""Support code for the tests and benchmarks, not part of the installed package: the chaos harness (:mod:`.chaos`)
and synthetic committed rollout stages for trainer tests (:mod:`.synthetic`). Import it from the repository root
(``python -m pytest``, ``python bench/....py``)."""
