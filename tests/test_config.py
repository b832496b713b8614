"""The configuration loader: a value of the wrong type stops the process at start, naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

import detectors.windows  # noqa: F401  (a section's module, imported once at collection)
from rocewatch.config import config_from_dict, load_config
from rocewatch.core.errors import ConfigError


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        ({"window": {"step_s": "abc"}}, "window.step_s"),
        ({"window": {"step_s": True}}, "window.step_s"),
        ({"metrics_port": "x"}, "metrics_port"),
        ({"metrics_port": 9464.5}, "metrics_port"),
        ({"state_dir": 5}, "state_dir"),
        ({"kafka": {"bootstrap_servers": 5}}, "kafka.bootstrap_servers"),
        ({"kafka": {"ssl_check_hostname": "no"}}, "kafka.ssl_check_hostname"),
    ],
)
def test_a_value_of_the_wrong_type_is_a_config_error_naming_its_key(
    doc: dict[str, object], key: str
) -> None:
    with pytest.raises(ConfigError, match=rf"{key}: .* is not of type"):
        config_from_dict(doc)


def test_numbers_from_environment_variables_are_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RW_TEST_PORT", "9500")
    monkeypatch.setenv("RW_TEST_STEP", "0.2")
    p = tmp_path / "c.yaml"
    p.write_text("metrics_port: ${RW_TEST_PORT}\nwindow: {step_s: '${RW_TEST_STEP}'}\n")
    cfg = load_config(p)
    assert cfg.metrics_port == 9500 and isinstance(cfg.metrics_port, int)
    assert cfg.window.step_s == pytest.approx(0.2)


def test_replay_with_a_wrongly_typed_setting_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rocewatch.cli import main

    (tmp_path / "scn").mkdir()
    cfg = tmp_path / "c.yaml"
    cfg.write_text("window: {step_s: abc}\n")
    argv = ["replay", str(tmp_path / "scn"), "--out", str(tmp_path / "o"), "--config", str(cfg)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"rocewatch: error: {cfg}.window.step_s: 'abc' is not of type float"]
