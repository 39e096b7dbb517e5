"""Agent evaluation data models."""

from .content import AudioBlock, ContentBlock, ImageBlock, TextBlock, ToolResultBlock, ToolUseBlock, VideoBlock
from .message import Message
from .scoring import compute_pass_at_k, compute_pass_hat_k, compute_task_score, is_pass
from .task import TaskDefinition
from .tool import ToolEndpoint, ToolSpec
from .task import ExpectedAction
from .trace import (
    AuditSnapshot,
    DimensionScores,
    MediaLoad,
    TokenUsage,
    ToolDispatch,
    TraceEnd,
    TraceEvent,
    TraceMessage,
    TraceStart,
)

__all__ = [
    "AuditSnapshot",
    "AudioBlock",
    "ContentBlock",
    "DimensionScores",
    "ImageBlock",
    "MediaLoad",
    "ExpectedAction",
    "Message",
    "TaskDefinition",
    "TextBlock",
    "TokenUsage",
    "ToolDispatch",
    "ToolEndpoint",
    "ToolResultBlock",
    "ToolSpec",
    "ToolUseBlock",
    "TraceEnd",
    "TraceEvent",
    "TraceMessage",
    "TraceStart",
    "VideoBlock",
    "compute_pass_at_k",
    "compute_pass_hat_k",
    "compute_task_score",
    "is_pass",
]
