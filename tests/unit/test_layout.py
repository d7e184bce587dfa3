"""The test tree's layout (README, "Tests"): every test module sits in a tier folder, so `make test` and
`make test-all` select what they promise; a module elsewhere under tests/ would escape the tiers' markers."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TIERS = ("unit", "integration", "e2e")


def test_every_test_module_sits_in_a_tier_folder():
    modules = sorted(p.relative_to(TESTS) for p in TESTS.rglob("test_*.py"))
    assert len(modules) > 60  # the glob did find the suite
    stray = [str(p) for p in modules if len(p.parts) != 2 or p.parts[0] not in TIERS]
    assert stray == [], f"move these into tests/unit, tests/integration or tests/e2e (git mv): {stray}"


def test_test_module_names_are_unique_across_tiers():
    """pytest imports test modules by basename (rootdir-relative, no packages): two tiers holding test_x.py would
    collide at collection."""
    names = [p.name for p in TESTS.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
