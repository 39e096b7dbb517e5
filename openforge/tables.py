"""The store's tables: SQLModel classes, one per table, in the schema a person can query with `sqlite3`.

Lists and objects (token ids, logprobs, request bodies, configs) live in `JSON` columns: TEXT holding
JSON that `sqlite3`'s json functions read (PostgreSQL: its `json` type, the text kept as written and
read with `->`/`->>`), and Python lists/dicts on the model. No caller encodes or
decodes them. `openforge.store` holds the write paths and migrations; import the tables from either.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from datetime import UTC, datetime
from typing import Any

import orjson
from pydantic import PrivateAttr
from sqlalchemy import Column, Index, Text
from sqlalchemy.types import TypeDecorator, UserDefinedType
from sqlmodel import Field, SQLModel

from openforge.errors import StoreError

# Rollout states. pending -> running -> one of the final states.
ROLLOUT_FINAL = ("scored", "failed", "timed_out", "cancelled", "interrupted")
RUN_FINAL = ("finished", "failed", "stopped", "interrupted")
# Why a rollout did not end on an answer: the harness broke or the infrastructure (sandbox, engine,
# proxy) broke (both `failed`, no reward), it ran out of time (`timed_out`, 0), or the harness stopped
# on the policy's own failure (`scored`, 0: its turn limit, a context it filled). Null on a graded answer.
# `config`: the run's settings cannot run the harness (its own prompt is over the context): `failed`, masked.
FAILURE_KINDS = ("harness", "infra", "timeout", "policy", "config")
# Call states: in_flight until the engine answered, then ok or error; in_flight calls found on
# start-up belong to a proxy that died and become interrupted. `refused`: the proxy refused its prompt
# as over the context (a 400 "prompt is too long"), before any engine call.
CALL_STATES = ("in_flight", "ok", "error", "interrupted", "refused")
# The `error` of a call whose client (the harness) left before the answer was complete: no fault of the
# engine or the proxy. The agent can cause it (kill its harness mid-answer), so the runner never counts
# it as the infrastructure's failure.
CALL_CLIENT_LEFT = "the client disconnected before the response completed"


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id(prefix: str) -> str:
    """Sortable-enough, human-typable ids: `run-20261202-1f3a9c04be` (any unique prefix finds a run).

    40 random bits: a day's ids in one store never collide in practice (24 bits did, at a few
    thousand rollouts: the birthday bound)."""
    return f"{prefix}-{utcnow():%Y%m%d}-{secrets.token_hex(5)}"


def new_rollout_key() -> str:
    """A fresh rollout credential (192 random bits). Only its `hash_key` is ever stored."""
    return f"forge-{secrets.token_urlsafe(24)}"


# The proxy's judge route (proxy/judge.py), as the runner (rollouts/tasks/judge.py) calls it: a judge key
# (never a policy route's), the caller's limit in a header, the judgement row's id in the response's.
JUDGE_KEY_PREFIX = "forge-judge-"
JUDGE_ROUTE = "/judge/v1"
JUDGEMENT_HEADER = "x-forge-judgement"
JUDGE_DEADLINE_HEADER = "x-forge-timeout-s"


def new_judge_key() -> str:
    """A rollout's judge credential, made by the runner once the agent is gone (the rollout's key is
    replaced by it): 192 random bits the agent never saw, which the proxy takes on its judge route only."""
    return f"{JUDGE_KEY_PREFIX}{secrets.token_urlsafe(24)}"


def hash_key(key: str) -> str:
    """What the store keeps of a credential: sha256 hex. Keys are random, so no salt or slow hash
    is needed: a hash cannot be turned back into a key that works."""
    return hashlib.sha256(key.encode()).hexdigest()


def encode_json(value: Any) -> str:
    """A JSON column's text. A `str` is taken as JSON text already (a request body exactly as the
    client sent it). orjson writes a 2,048-id list ~15x faster than `json`; NaN and infinities
    become `null` (valid JSON, unlike `json`'s `NaN`, which `sqlite3`'s json functions refuse)."""
    if isinstance(value, str):
        return value
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except orjson.JSONEncodeError:  # a lone surrogate, an int past 64 bits: json escapes them
        return json.dumps(value)


def decode_json(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(text)  # rows written before orjson may hold NaN / Infinity
    except ValueError:
        raise StoreError(f"a JSON column of the store holds text that is not JSON: {text[:80]!r}") from None


class _PGJSON(UserDefinedType):  # type: ignore[type-arg]
    """PostgreSQL's `json` (not `jsonb`: it keeps the text exactly as written, a request body as sent),
    bound as the text `encode_json` made."""

    cache_ok = True

    def get_col_spec(self, **_kw: Any) -> str:
        return "JSON"


class JSON(TypeDecorator):
    """TEXT in the file (PostgreSQL: json), a list or dict in Python."""

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Any) -> Any:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(_PGJSON())
        return dialect.type_descriptor(Text())

    def process_bind_param(self, value: Any, dialect: Any) -> str | None:
        return None if value is None else encode_json(value)

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        # psycopg hands a json column over decoded already (with orjson: see openforge.db)
        return None if value is None else decode_json(value) if isinstance(value, str) else value


def _json_col() -> Any:
    return Field(default=None, sa_column=Column(JSON))


def _text_col() -> Any:
    return Field(default=None, sa_column=Column(Text))


class Run(SQLModel, table=True):
    id: str = Field(primary_key=True)
    name: str = ""
    kind: str = "train"  # train | eval | proxy
    status: str = "created"  # created | running | paused | finished | failed | stopped | interrupted
    config_json: dict[str, Any] | None = _json_col()
    summary_json: dict[str, Any] | None = _json_col()  # eval tables, final metrics
    owner_pid: int | None = None  # the process driving the run; dead owner + running = interrupted
    current_adapter: str | None = None  # the adapter name rollouts are served with now
    # The trainer's policy version served now (the weights after step v-1; 0 the base or init_from
    # adapter), whatever the update kind: full fine-tuning serves no adapter name to tell it by.
    policy_version: int | None = None
    error: str | None = None
    isolation: str | None = None  # what kept its rollouts in: bwrap | docker | kubernetes | none
    created_at: datetime = Field(default_factory=utcnow)
    started_at: datetime | None = None
    ended_at: datetime | None = None


class Task(SQLModel, table=True):
    __table_args__ = (Index("ix_task_run_key", "run_id", "task_id", unique=True),)
    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(foreign_key="run.id", index=True)
    task_id: str
    instruction: str = ""
    spec_json: dict[str, Any] | None = _json_col()


class Rollout(SQLModel, table=True):
    __table_args__ = (Index("ix_rollout_run_status", "run_id", "status"),)
    id: str = Field(primary_key=True)
    run_id: str = Field(foreign_key="run.id", index=True)
    task_id: str = Field(index=True)
    step: int = 0  # the train step (or eval round) that sampled it
    sample_index: int = 0  # position within its group
    sandbox: str = ""  # backend: local | docker | kubernetes
    sandbox_id: str | None = None
    harness: str = ""
    adapter: str | None = None  # the adapter the engine served this rollout with
    # The policy version it was created under (its run's, when created for the run's current adapter).
    # A partial rollout moved onto newer adapters keeps it: its oldest version (trainer/resume.py).
    policy_version: int | None = None
    # sha256 hex of the rollout's credential for the proxy. The plain key is never stored (a sandbox
    # that reads the store must not find keys to write into other rollouts); see `key` below.
    key_hash: str | None = Field(default=None, index=True, unique=True)
    status: str = "pending"  # pending | running | scored | failed | timed_out | cancelled | interrupted
    reward: float | None = None
    attempts: int = 0  # sandbox start attempts (infrastructure retries)
    exit_code: int | None = None
    stdout: str | None = _text_col()
    stderr: str | None = _text_col()
    verifier_output: str | None = _text_col()
    error: str | None = None
    failure_kind: str | None = None  # harness | infra | timeout | policy (FAILURE_KINDS); null on an answer
    n_calls: int = 0
    n_tokens: int = 0
    n_segments: int = 0  # trajectory segments (history rewrites start a new one)
    n_extends: int = 0  # calls whose prompt extended the previous call exactly
    created_at: datetime = Field(default_factory=utcnow)
    started_at: datetime | None = None
    ended_at: datetime | None = None

    _key: str | None = PrivateAttr(default=None)

    @property
    def key(self) -> str | None:
        """The plain credential: held in memory on the object `Store.create_rollout` returned, and
        nowhere else (a rollout read back from the store has only its `key_hash`)."""
        private = self.__pydantic_private__  # None on rows SQLAlchemy loaded
        return private.get("_key") if private else None


class Call(SQLModel, table=True):
    # Unique: two proxies on one store must never hand out the same number (see AsyncStore.write_calls).
    __table_args__ = (Index("ix_call_rollout_seq", "rollout_id", "seq", unique=True),)
    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(index=True)
    rollout_id: str = Field(index=True)
    seq: int = 0  # order of the call within its rollout
    api: str = ""  # openai_chat | openai_responses | anthropic_messages
    model: str = ""
    adapter: str | None = None
    stream: bool = False
    status: str = "in_flight"  # in_flight | ok | error | interrupted
    request_json: dict[str, Any] | None = _json_col()  # the request body as the client sent it
    response_json: dict[str, Any] | None = _json_col()
    prompt_ids: list[int] | None = _json_col()  # JSON list[int]: exactly what the engine was given
    completion_ids: list[int] | None = _json_col()  # JSON list[int]: exactly what the engine sampled
    logprobs: list[float | None] | None = _json_col()  # JSON list[float], one per completion id (null: NaN)
    tool_calls_json: list[dict[str, Any]] | None = _json_col()
    tool_parse_error: bool = False  # a malformed tool call was returned as text
    reused_tokens: int = 0  # prompt tokens spliced from earlier completions (no re-tokenisation)
    finish_reason: str | None = None
    temperature: float | None = None  # the sampling parameters the engine was given
    top_p: float | None = None
    top_k: int | None = None
    break_reason: str | None = None  # why this call's prompt did not extend the previous call's tokens
    policy_turns: int | None = None  # the policy's answers in its prompt (0: the harness's own text and the task's)
    side: str | None = None  # a harness's own background call (a title, a summary), as its spec names it; null: main
    images: list[str] | None = _json_col()  # JSON list[str]: sha256 ids of its images, in prompt order
    retokenized: bool = False  # a teacher's call (engine.kind = "remote"): the ids are the student's tokenisation
    upstream_retries: int = 0  # a teacher's call: failed tries of the upstream before this row's outcome
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float | None = None
    started_at: datetime = Field(default_factory=utcnow)
    ended_at: datetime | None = None


class Judgement(SQLModel, table=True):
    """One call of a task's judge (rollouts/tasks/judge.py), made by the runner after the agent is gone.
    Not a `call` row: the judge's tokens are no part of the policy's trajectory."""

    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(index=True)
    rollout_id: str = Field(index=True)
    model: str = ""
    prompt_json: list[dict[str, Any]] | None = _json_col()  # the chat messages sent, as sent
    reply: str | None = _text_col()  # the judge's text, as it came (null when no reply came)
    score: float | None = None  # the parsed score in [0, 1]; null when the judgement failed
    error: str | None = None  # why it failed (timeout, HTTP error, unparseable reply); null on a score
    latency_ms: float | None = None
    created_at: datetime = Field(default_factory=utcnow)


class Trajectory(SQLModel, table=True):
    __table_args__ = (Index("ix_traj_rollout_seg", "rollout_id", "segment", unique=True),)
    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(index=True)
    rollout_id: str = Field(index=True)
    segment: int = 0
    token_ids: list[int] | None = _json_col()  # JSON list[int]
    loss_mask: list[int] | None = _json_col()  # JSON list[int], 1 on sampled tokens
    logprobs: list[float] | None = _json_col()  # JSON list[float], the sampling logprob (0.0 where mask is 0)
    call_ids: list[int] | None = _json_col()  # JSON list[int]: the calls merged into this segment
    images: list[str] | None = _json_col()  # JSON list[str]: sha256 ids of the images in token_ids, in order
    n_tokens: int = 0
    created_at: datetime = Field(default_factory=utcnow)


class TrainStep(SQLModel, table=True):
    __table_args__ = (Index("ix_step_run_step", "run_id", "step", unique=True),)
    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(foreign_key="run.id", index=True)
    step: int
    loss: float | None = None
    reward_mean: float | None = None
    reward_std: float | None = None
    pass_rate: float | None = None
    kl: float | None = None
    clip_frac: float | None = None
    mismatch_mean: float | None = None  # mean |engine logprob - trainer logprob| on sampled tokens
    mismatch_max: float | None = None
    grad_norm: float | None = None
    tokens_per_s: float | None = None
    n_tokens: int = 0
    n_rollouts: int = 0
    t_rollout_s: float | None = None
    t_train_s: float | None = None
    t_sync_s: float | None = None
    adapter: str | None = None
    metrics_json: dict[str, Any] | None = _json_col()  # anything else
    created_at: datetime = Field(default_factory=utcnow)


class Checkpoint(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(foreign_key="run.id", index=True)
    step: int
    kind: str = "adapter"  # adapter | full
    path: str
    adapter_name: str | None = None
    loaded: bool = False  # hot-loaded into the engine
    created_at: datetime = Field(default_factory=utcnow)


class SchemaMigration(SQLModel, table=True):
    __tablename__ = "schema_migrations"
    version: int = Field(primary_key=True)
    name: str
    applied_at: datetime = Field(default_factory=utcnow)
