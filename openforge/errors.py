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


class SandboxError(ForgeError):
    """A sandbox could not be created, reached, or cleaned up."""


class HarnessError(ForgeError):
    """A harness is unknown or cannot be installed/found in its sandbox."""


class TaskError(ForgeError):
    """A task file or task set is invalid."""


class TrainerError(ForgeError):
    """Training cannot proceed (bad trajectories, a checkpoint that cannot be resumed, ...)."""
