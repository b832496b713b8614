"""The slurmrestd backend against a stand-in built from the v0.0.39 / v0.0.41 OpenAPI schemas
(tests/support/slurmrestd.py): no slurmrestd that can update nodes is packaged here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.slurmrestd import SlurmRestStandIn

from actions.executors import DRAINED_BY_OTHER
from actions.routing import ExecutorsConfig, RoutingExecutor
from actions.slurmrest import SlurmRestConfig, SlurmRestExecutor
from rocewatch.config import config_from_dict
from rocewatch.core.errors import ConfigError

TOKEN = "jwt-for-tests"


@pytest.fixture(params=["v0.0.39", "v0.0.41"])
def rest(request: pytest.FixtureRequest) -> Iterator[tuple[SlurmRestStandIn, SlurmRestExecutor]]:
    with SlurmRestStandIn((request.param,), "rocewatch", TOKEN) as srv:
        srv.add_node("gpu-01", ["IDLE"])
        srv.add_node("gpu-02", ["MIXED", "DRAIN"], "bad DIMM, ticket 42", "alice")
        cfg = SlurmRestConfig(url=srv.url, api_version=request.param, user="rocewatch", token=TOKEN)
        yield srv, SlurmRestExecutor(cfg)


def test_drain_and_resume(rest: tuple[SlurmRestStandIn, SlurmRestExecutor]) -> None:
    srv, ex = rest
    v = ex.config.api_version
    assert ex.drain("gpu-01", "slurm", "rocewatch: PFCStorm origin mlx5_3") == "done"
    assert srv.nodes["gpu-01"]["state"] == ["IDLE", "DRAIN"]
    assert srv.nodes["gpu-01"]["reason"] == "rocewatch: PFCStorm origin mlx5_3"
    posts = [r for r in srv.requests if r[0] == "POST"]
    assert posts == [
        (
            "POST",
            f"/slurm/{v}/node/gpu-01",
            {"state": ["DRAIN"], "reason": "rocewatch: PFCStorm origin mlx5_3"},
        )
    ]
    assert ex.drain("gpu-01", "slurm", "rocewatch: PFCStorm origin mlx5_3") == "done"
    assert len([r for r in srv.requests if r[0] == "POST"]) == 1  # the retry changed nothing
    assert ex.resume("gpu-01", "slurm") == "done"
    assert srv.nodes["gpu-01"]["state"] == ["IDLE"] and srv.nodes["gpu-01"]["reason"] == ""
    assert ex.resume("gpu-01", "slurm") == "done"


def test_other_peoples_drain_left_alone(rest: tuple[SlurmRestStandIn, SlurmRestExecutor]) -> None:
    srv, ex = rest
    assert ex.drain("gpu-02", "slurm", "rocewatch: FlakyLink mlx5_0") == DRAINED_BY_OTHER
    assert ex.resume("gpu-02", "slurm") == DRAINED_BY_OTHER
    assert srv.nodes["gpu-02"]["reason"] == "bad DIMM, ticket 42"
    assert not [r for r in srv.requests if r[0] == "POST"]


def test_errors_become_failed_outcomes(rest: tuple[SlurmRestStandIn, SlurmRestExecutor]) -> None:
    srv, ex = rest
    assert ex.drain("gpu-77", "slurm", "rocewatch: x") == (
        "failed: slurmrestd 404: Unable to query node gpu-77: Invalid node name specified"
    )
    bad = SlurmRestExecutor(
        SlurmRestConfig(url=srv.url, api_version=ex.config.api_version, user="rocewatch", token="x")
    )
    assert (
        bad.drain("gpu-01", "slurm", "rocewatch: x")
        == "failed: slurmrestd 401: Authentication failure"
    )
    other = "v0.0.41" if ex.config.api_version == "v0.0.39" else "v0.0.39"
    wrong = SlurmRestExecutor(
        SlurmRestConfig(url=srv.url, api_version=other, token=TOKEN, user="rocewatch")
    )
    assert wrong.drain("gpu-01", "slurm", "rocewatch: x").startswith("failed: slurmrestd 404")
    gone = SlurmRestExecutor(SlurmRestConfig(url="http://127.0.0.1:9", token=TOKEN))
    assert gone.drain("gpu-01", "slurm", "rocewatch: x").startswith(
        "failed: slurmrestd unreachable"
    )
    assert srv.nodes["gpu-01"]["state"] == ["IDLE"]


def test_backend_chosen_by_config() -> None:
    with SlurmRestStandIn(("v0.0.39",), "rocewatch", TOKEN) as srv:
        srv.add_node("gpu-01", ["IDLE"])
        cfg = config_from_dict(
            {
                "executors": {
                    "slurm": {
                        "backend": "slurmrestd",
                        "slurmrestd": {
                            "url": srv.url,
                            "api_version": "v0.0.39",
                            "user": "rocewatch",
                            "token": TOKEN,
                        },
                    }
                }
            }
        )
        assert TOKEN not in repr(cfg)  # the token never reaches a log line through repr
        ex = RoutingExecutor(cfg.executors)
        assert ex.drain("gpu-01", "slurm", "rocewatch: x") == "done"
        assert srv.nodes["gpu-01"]["state"] == ["IDLE", "DRAIN"]
        assert ex.drain("gpu-01", "kubernetes", "rocewatch: x") == (
            "failed: no executors.kubernetes configured"
        )
    assert config_from_dict({}).executors == ExecutorsConfig()
    for bad in (
        {"slurm": {"backend": "pyxis"}},
        {"slurm": {"backend": "slurmrestd"}},
        {"slurm": {"slurmrestd": {"url": "http://x:1", "api_version": "v0.0.38"}}},
        {"slurm": {"scontrol": {"timeout_s": 0}}},
        {"kubernetes": {"taint_effect": "PreferNoSchedule"}},
        {"pbs": {}},
    ):
        with pytest.raises(ConfigError):
            config_from_dict({"executors": bad})
