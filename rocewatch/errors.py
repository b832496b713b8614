"""The project's exceptions: one root, a few subclasses that say what the caller can do."""


class RocewatchError(Exception):
    """Root of every error rocewatch raises on purpose."""


class ConfigError(RocewatchError):
    """Configuration or topology is unusable; fix the file and start again."""


class BadInput(RocewatchError):
    """One record or message cannot be decoded; count it, skip it, keep the stream going."""


class RetryableError(RocewatchError):
    """A dependency (broker, database, receiver, scheduler) failed in a way worth retrying."""


class PermanentError(RocewatchError):
    """A dependency refused the request; retrying the same request will not help."""


class Fenced(RocewatchError):
    """This process no longer holds the right to act: another instance has taken its work over
    (rocewatch.scaleout.DetectWriter). Not an outcome to record: the work stops here."""


class ProducerFailed(RocewatchError):
    """A record this process sent did not reach Kafka: the broker refused it (kafka-python's
    idempotent producer treats that as fatal and fails every later batch too), or it was not
    delivered in time. The process stops here, before a checkpoint can commit offsets past
    what was lost; a restart (the supervisor's) resumes from the last checkpoint and writes
    it again."""
