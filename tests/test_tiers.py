"""The suite's tiers (tests/support/tiers.py): a test is marked by the services its fixtures
need, every such test is slow, and under CI a skipped test fails the run."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

# a throwaway suite: its own stand-ins for the service fixtures (named as the real ones); its
# modules' names are unique (pytester runs in this process, where tests/ is imported)
CONFTEST = """
import pytest

@pytest.fixture
def kafka_bootstrap():
    return "127.0.0.1:9"

@pytest.fixture
def postgres_url():
    return "postgresql://nowhere"

@pytest.fixture
def broker_user(kafka_bootstrap):  # needs Kafka only through another fixture
    return kafka_bootstrap
"""

TESTS = """
import pytest

def test_fast():
    pass

def test_kafka(kafka_bootstrap):
    pass

def test_kafka_through_another_fixture(broker_user):
    pass

@pytest.mark.slow
def test_marked_slow():
    pass

def test_postgres(postgres_url):
    pass

def test_skips():
    pytest.skip("nothing to do here")
"""


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_tiersample_suite=TESTS)
    return pytester.runpytest("-p", "tests.support.tiers", "--strict-markers", "-rs", *args)


def test_the_fast_tier_leaves_out_services_and_slow_tests(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI", raising=False)
    res = run(pytester, "-m", "not slow", "-v")
    res.assert_outcomes(passed=1, skipped=1, deselected=4)
    res.stdout.fnmatch_lines(["*::test_fast PASSED*"])
    # the service markers are registered and set from the fixtures (--strict-markers knows them)
    res = run(pytester, "-m", "kafka", "-v")
    res.assert_outcomes(passed=2, deselected=4)
    res.stdout.fnmatch_lines(["*::test_kafka PASSED*", "*::test_kafka_through_another_fixture *"])


def test_a_missing_service_skips_with_what_starts_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("ROCEWATCH_TEST_PG_URL", raising=False)
    res = run(pytester, "-m", "postgres")
    res.assert_outcomes(skipped=1, deselected=5)
    res.stdout.fnmatch_lines(["*needs the test PostgreSQL server*scripts/services.sh start*"])
    assert res.ret == pytest.ExitCode.OK


def test_under_ci_a_skipped_test_fails_the_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.delenv("ROCEWATCH_TEST_PG_URL", raising=False)
    res = run(pytester)
    # the test that skips itself and the one whose service is missing both fail
    res.assert_outcomes(passed=4, failed=1, errors=1)
    res.stdout.fnmatch_lines(["*skipped under CI*nothing to do here*"])
    assert res.ret == pytest.ExitCode.TESTS_FAILED


def test_under_ci_a_module_skipped_at_collection_fails_the_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(
        test_tiersample_gone=(
            "import pytest\npytest.skip('no module today', allow_module_level=True)\n"
        ),
        test_tiersample_here="def test_ok():\n    pass\n",
    )
    res = pytester.runpytest("-p", "tests.support.tiers")
    res.assert_outcomes(passed=1, skipped=1)
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    # ... and outside CI a skip is only reported
    monkeypatch.setenv("CI", "false")
    assert pytester.runpytest("-p", "tests.support.tiers").ret == pytest.ExitCode.OK


def test_under_ci_a_fast_tier_test_far_over_its_budget_fails_the_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("ROCEWATCH_FAST_LIMIT_S", "0.2")
    pytester.makepyfile(
        test_tiersample_slowish="""
import time
import pytest

def test_forgot_its_mark():
    time.sleep(0.3)  # stands for minutes of work

@pytest.mark.slow
def test_marked():
    time.sleep(0.3)
"""
    )
    res = pytester.runpytest("-p", "tests.support.tiers")
    res.assert_outcomes(passed=2)
    res.stdout.fnmatch_lines(["*test_forgot_its_mark took*outside the slow tier*"])
    assert "test_marked took" not in res.stdout.str()
    assert res.ret == pytest.ExitCode.TESTS_FAILED


def test_every_test_named_slow_elsewhere_exists() -> None:
    """A renamed or deleted test left in the list would mark nothing: the list must be true."""
    import ast
    from pathlib import Path

    from tests.support.tiers import SLOW_ELSEWHERE

    here = Path(__file__).parent
    for module, names in SLOW_ELSEWHERE.items():
        tree = ast.parse((here / module).read_text())
        tests = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert names - {"*"} <= tests, (module, sorted(names - tests - {"*"}))
