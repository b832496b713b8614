"""Acting on alerts: the drain policy and the executors that drain and resume nodes."""

from actions.executors import DryRunExecutor, Executor, SlurmConfig, SlurmExecutor
from actions.policy import DrainPolicy, PolicyConfig

__all__ = [
    "DrainPolicy",
    "DryRunExecutor",
    "Executor",
    "PolicyConfig",
    "SlurmConfig",
    "SlurmExecutor",
]
