"""Service settings: one pydantic-settings class, ``LINREBOOT_`` prefix.

``REDIS_URL`` (or ``LINREBOOT_REDIS_URL``) selects a Redis server; without it
the service starts an embedded Redis persisting to ``data_dir``.
:meth:`Settings.load` is how the service reads them: a wrong setting is one
line naming it (:class:`StartupError`), not a traceback.
"""

from __future__ import annotations

import difflib
import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self
from urllib.parse import urlsplit

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.errors import StartupError

DEFAULT_PORT = 8000
DEFAULT_ADMIN_TOKEN = "change-me"
MIN_ADMIN_TOKEN_CHARS = 16  # on an address other machines can reach
LogLevel = Literal["debug", "info", "warning", "error", "critical"]
_REDIS_SCHEMES = ("redis", "rediss", "unix")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LINREBOOT_", extra="ignore")

    redis_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("LINREBOOT_REDIS_URL", "REDIS_URL"),
        description="redis://host:port/db of the state store; empty starts an embedded Redis",
    )
    redis_cluster: bool | None = Field(
        default=None,
        description="REDIS_URL is a node of a Redis Cluster (any node, a replica included): "
        "true or false; unset asks the server (INFO cluster)",
    )
    data_dir: Path = Field(default=Path("data"), description="embedded Redis data (AOF) directory")
    admin_token: SecretStr = Field(
        default=SecretStr(DEFAULT_ADMIN_TOKEN),
        description="bearer token for experiment management",
    )
    admin_token_file: Path | None = Field(
        default=None,
        description="a file holding the admin token (a Docker or Kubernetes secret) instead of "
        "LINREBOOT_ADMIN_TOKEN; one token a line, each valid; read again when it changes, so "
        "tokens rotate without a restart",
    )
    host: str = "127.0.0.1"
    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535)
    workers: int = Field(default=1, ge=1, le=64)
    max_body_bytes: int = Field(default=1_000_000, ge=1_024)
    max_arms: int = Field(default=1_000, ge=1)
    max_dim: int = Field(default=64, ge=1, le=256)
    max_batch_rewards: int = Field(default=1_000, ge=1)
    feature_bound: float = Field(default=1e6, gt=0, description="bound on |x_i| and |reward|")
    redis_timeout_seconds: float = Field(default=2.0, gt=0)
    retry_after_seconds: int = Field(default=1, ge=1)
    default_reward_window_seconds: int = Field(default=3600, ge=1)
    max_reward_window_seconds: int = Field(default=7 * 24 * 3600, ge=1)
    default_reward_grace_seconds: int = Field(
        default=3600, ge=1,
        description="with a default reward, how long a decision is kept after its window: "
        "the default is still applied if the service was stopped for up to this long, and "
        "a reward this late is still recognised as late",
    )
    sweep_interval_seconds: float = Field(
        default=1.0, gt=0, le=60,
        description="how often (on average, jittered) each worker applies due default rewards",
    )
    default_log_max_entries: int = Field(
        default=100_000, ge=0,
        description="decision log length of an experiment that does not set log_max_entries "
        "(decisions and outcomes; 0: no log)",
    )
    default_log_max_age_seconds: int = Field(
        default=7 * 24 * 3600, ge=1,
        description="decision log age of an experiment that does not set log_max_age_seconds",
    )
    request_head_timeout_seconds: float = Field(
        default=10.0, gt=0, le=3600,
        description="a connection whose request line and headers take longer than this "
        "(from its opening, or from the first byte of its next request) is closed",
    )
    idempotency_seconds: int = Field(
        default=300, ge=1, le=7 * 24 * 3600,
        description="how long a /choose retried under the same decision_id gets the same "
        "decision (at most its reward window); each such decision keeps about 200 bytes in "
        "Redis for that long; also how long a creation or key rotation sent again under its "
        "Idempotency-Key gets its API key again",
    )
    log_page_max_bytes: int = Field(
        default=4_000_000, ge=10_000,
        description="a decision-log page holds entries up to about this many bytes of JSON "
        "(at least one entry), whatever its limit; its next_after says where to go on",
    )
    view_cache_bytes: int = Field(
        default=256 * 2**20, ge=0,
        description="per worker: statistics kept in memory for the most recently used "
        "experiments; the least recently used are read again when needed",
    )
    log_level: LogLevel = "info"

    @classmethod
    def load(cls, overrides: Mapping[str, Any] | None = None) -> Self:
        """The environment's settings with ``overrides`` (command-line flags) on top.

        Raises
        ------
        StartupError
            One line naming each wrong setting (its flag if it came from
            ``overrides``, else its variable) and what is wrong with it.
        """
        overrides = dict(overrides or {})
        try:
            return cls(**overrides)
        except ValidationError as exc:
            problems = [
                _name(str(e["loc"][0]), overrides) + ": " + e["msg"].removeprefix("Value error, ")
                if e["loc"] else e["msg"].removeprefix("Value error, ")
                for e in exc.errors(include_url=False)
            ]
            raise StartupError("; ".join(problems) + " (see README, Configuration)") from None

    @property
    def default_admin_token(self) -> bool:
        """True while the admin token is still the documented default."""
        return self.admin_token.get_secret_value() == DEFAULT_ADMIN_TOKEN

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
        except ValueError:
            raise ValueError("not a URL: give redis://host:port/db") from None
        if parts.scheme not in _REDIS_SCHEMES:
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_case_level(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _default_window_within_the_maximum(self) -> Self:
        if self.default_reward_window_seconds > self.max_reward_window_seconds:
            raise ValueError(
                "LINREBOOT_DEFAULT_REWARD_WINDOW_SECONDS: must be at most "
                f"LINREBOOT_MAX_REWARD_WINDOW_SECONDS ({self.max_reward_window_seconds})"
            )
        return self

    @model_validator(mode="after")
    def _token_from_its_file(self) -> Self:
        if self.admin_token_file is None:
            return self
        if not self.default_admin_token:
            raise ValueError("LINREBOOT_ADMIN_TOKEN_FILE: give the token or its file, not both "
                             "(unset LINREBOOT_ADMIN_TOKEN)")
        try:
            tokens = read_admin_tokens(self.admin_token_file)
        except ValueError as exc:
            raise ValueError(f"LINREBOOT_ADMIN_TOKEN_FILE: {exc}") from None
        self.admin_token = SecretStr(tokens[0])
        return self

    @model_validator(mode="after")
    def _secret_token_unless_loopback(self) -> Self:
        if is_loopback(self.host):
            return self
        if self.default_admin_token:
            raise ValueError(
                f"LINREBOOT_ADMIN_TOKEN: the default {DEFAULT_ADMIN_TOKEN!r} is refused on an "
                "address other machines can reach (LINREBOOT_HOST or --host): set a secret token"
            )
        if self.admin_token_file is not None:
            try:  # (every line of the file; app.auth reads it again with the same rule)
                read_admin_tokens(self.admin_token_file, MIN_ADMIN_TOKEN_CHARS)
            except ValueError as exc:
                raise ValueError(f"LINREBOOT_ADMIN_TOKEN_FILE: {exc}") from None
        elif len(self.admin_token.get_secret_value()) < MIN_ADMIN_TOKEN_CHARS:
            raise ValueError(f"LINREBOOT_ADMIN_TOKEN: {_too_short()}")
        return self

    def admin_token_minimum(self) -> int:
        """The fewest characters an admin token may have: MIN_ADMIN_TOKEN_CHARS where other
        machines can reach the service (they may guess at it: /ui's login form among the
        ways), else 1."""
        return 1 if is_loopback(self.host) else MIN_ADMIN_TOKEN_CHARS


def _too_short() -> str:
    return (f"a token shorter than {MIN_ADMIN_TOKEN_CHARS} characters is refused on an "
            "address other machines can reach; make one with: python -c "
            "'import secrets; print(secrets.token_urlsafe(32))'")


def read_admin_tokens(path: Path, min_chars: int = 1) -> tuple[str, ...]:
    """The admin tokens a token file holds, one per line (blank lines skipped), each of
    ``min_chars`` characters at least.

    Raises
    ------
    ValueError
        One line saying why the file cannot serve (unreadable, no token, a token
        with blank space in it, the documented default token, a token too short).
    """
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not text"
        raise ValueError(f"cannot read {path} ({reason})") from None
    tokens = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not tokens or any(len(t.split()) != 1 for t in tokens):
        raise ValueError(f"{path} must hold one token a line, without blank space in a token")
    if DEFAULT_ADMIN_TOKEN in tokens:
        # A file is how secrets are given; the documented default is no secret (and a
        # token added to the file later would otherwise slip past the start-up check).
        raise ValueError(f"{path} holds the documented default {DEFAULT_ADMIN_TOKEN!r}: set a "
                         "secret token")
    if any(len(t) < min_chars for t in tokens):
        raise ValueError(f"{path} holds {_too_short()}")
    return tokens


# LINREBOOT_* variables that are not settings but are read elsewhere: the tests'
# Redis, and the serve process's pid for its workers.
_OTHER_VARIABLES = frozenset({"LINREBOOT_TEST_REDIS_URL", "LINREBOOT_TEST_SHARDS",
                              "LINREBOOT_SERVE_PID"})


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """One line for each ``LINREBOOT_*`` variable that no setting reads (a misspelling
    is otherwise ignored in silence), with the closest setting's name when there is
    one: what the service warns of at start-up."""
    known = {f"LINREBOOT_{name.upper()}" for name in Settings.model_fields} | _OTHER_VARIABLES
    suffixes = sorted(k.removeprefix("LINREBOOT_") for k in known)  # the prefix matches all
    lines = []
    for name in sorted(environ):
        if name.startswith("LINREBOOT_") and name not in known:
            close = difflib.get_close_matches(name.removeprefix("LINREBOOT_"), suffixes, n=1,
                                              cutoff=0.75)
            hint = f"; did you mean LINREBOOT_{close[0]}?" if close else ""
            lines.append(f"{name} is not a setting and is ignored{hint} (see README, "
                         "Configuration)")
    return lines


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name to bind to) stays on this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # another name: it may resolve to any interface


def _name(field: str, overrides: Mapping[str, Any]) -> str:
    """How the operator gave a setting: its flag, or its environment variable.

    ``field`` is a field name, or the alias pydantic reports for an aliased field.
    """
    if field in overrides:
        return "--" + field.replace("_", "-")
    if field in Settings.model_fields:
        return f"LINREBOOT_{field.upper()}"
    return field.removeprefix("LINREBOOT_")  # an alias: REDIS_URL is the name people use
