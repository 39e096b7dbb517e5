"""The error tree. The CLI turns any `ForgeError` into one clear line and exit code 1."""


class ForgeError(Exception):
    """Base class of every error OpenForge reports to a user."""


class ConfigError(ForgeError):
    """A config file or flag is missing, unreadable or invalid."""


class StoreError(ForgeError):
    """The run store cannot be opened, is locked, is full, or lacks a record."""


class NotFoundError(StoreError):
    """A run, rollout or call id that the store does not hold."""


class EngineError(ForgeError):
    """The inference engine is unreachable, failed a request, or cannot load a model."""


class EngineTimeout(EngineError):
    """The engine did not answer (or a stream stalled) within the client's timeout."""


class EngineUnavailable(EngineError):
    """The engine cannot be reached, dropped the connection, or failed on its side (HTTP 5xx)."""


class EngineRejected(EngineError):
    """The engine refused the request itself (HTTP 4xx): retrying the same request cannot help."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class SandboxError(ForgeError):
    """A sandbox could not be created, reached, or cleaned up."""


class HarnessError(ForgeError):
    """A harness is unknown or cannot be installed/found in its sandbox."""


class TaskError(ForgeError):
    """A task file or task set is invalid."""


class TrainerError(ForgeError):
    """Training cannot proceed (bad trajectories, a checkpoint that cannot be resumed, ...)."""
