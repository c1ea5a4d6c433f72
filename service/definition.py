"""An experiment as stored: its definition (spec, policy, arms, keys) and the helpers every
room of the service reads it with (:mod:`service.experiments` composes the rooms)."""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import hmac
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from policies import PolicyConfig, State
from policies.config import stored_config
from service import keys
from service.codec import assemble_state
from service.domain import ArmSpec, ExperimentSpec
from service.errors import DomainError, Forbidden, InvalidInput, NotFound
from service.folding import fold_into


@dataclass(frozen=True)
class ArmRecord:
    id: str
    index: int
    active: bool
    features: tuple[float, ...] | None
    added: str | None = None  # added under an Idempotency-Key: IdempotencyKey.marker()


@dataclass(frozen=True)
class Definition:
    """An experiment as stored in its meta and arms hashes."""

    spec: ExperimentSpec
    config: PolicyConfig
    key_hash: str
    incarnation: str  # random per creation: decisions of a deleted namesake do not count
    created_at: float
    version: int
    arms: tuple[ArmRecord, ...]  # registration order
    features: np.ndarray | None = None  # stochastic: one row per arm, in ``arms`` order
    previous_key_hash: str | None = None  # valid too, after a rotation, until revoked
    # The last rotation's: what its key was made with (IdempotencyKey), and when.
    key_nonce: str | None = None
    key_rotated_at: float | None = None

    def accepts(self, key_hash: str) -> bool:
        """``key_hash`` is the hash of a key this experiment takes (current or previous)."""
        return one_of(key_hash, (self.key_hash, self.previous_key_hash))

    @functools.cached_property
    def active_arms(self) -> list[ArmRecord]:
        return [a for a in self.arms if a.active]

    @functools.cached_property
    def active_features(self) -> np.ndarray:
        """Stochastic: the active arms' features, one row each."""
        assert self.features is not None
        return self.features[[a.index for a in self.active_arms]]

    @functools.cached_property
    def active_rows(self) -> tuple[int, ...]:
        return rows_of(self.active_arms)

    @functools.cached_property
    def arm_positions(self) -> dict[str, int]:
        """Each arm's stats field, to its position in the state's arm axis (a view
        adding outcomes looks their arms up here)."""
        return positions_of(self.arms)

    @functools.cached_property
    def by_id(self) -> dict[str, ArmRecord]:
        return {a.id: a for a in self.arms}

    @functools.cached_property
    def record_heads(self) -> dict[str, bytes]:
        """Each arm's start of a pending decision's record: the stats fields a reward of
        it adds to (:func:`field_names`) and its id, each ending in a newline (made once
        per definition, not per decision: ``service.decisions._slots``)."""
        shared = self.config.shared
        return {a.id: "".join(f"{name}\n" for name in (*field_names(shared, a.id).values(), a.id)
                              ).encode() for a in self.arms}

    @functools.cached_property
    def active_ranges(self) -> str:
        """The active arms' indexes as the decision log writes them (:func:`index_ranges`)."""
        return index_ranges(self.active_rows)


def rows_of(arms: Sequence[ArmRecord]) -> tuple[int, ...]:
    return tuple(a.index for a in arms)


WRONG_KEY = "the API key is not valid for this experiment"


def missing_experiment(key: str | None) -> DomainError:
    """No such experiment. A caller with a key is told what a wrong key is told
    (no key fits a missing experiment), so ids cannot be probed without one;
    ``key`` None is a trusted in-process caller."""
    return NotFound("no experiment with this id") if key is None else Forbidden(WRONG_KEY)


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


@dataclass(frozen=True)
class IdempotencyKey:
    """A change of an experiment sent under the caller's ``Idempotency-Key``: sent again
    (its reply lost, or a 503), it is answered as made.

    A creation and a key rotation answer with a new API key, which the service keeps
    only as its hash: the key is made from what the request sent again has too, so
    that it can be made again, for ``LINREBOOT_IDEMPOTENCY_SECONDS``. ``secret`` is the
    admin token the request came with (a retry under another token makes another key,
    and is refused as a change made by another request); the parts hold a random
    value the change stored (the experiment's incarnation, the rotation's nonce), so
    that each change makes a key of its own, which nobody makes without reading it."""

    key: str
    secret: str = dataclasses.field(repr=False)

    def marker(self) -> str:
        """What a record made under this key keeps of it, to know the request sent again."""
        return hashlib.sha256(self.key.encode()).hexdigest()[:16]

    def api_key(self, *parts: str) -> str:
        """An API key (the length and alphabet of ``secrets.token_urlsafe(32)``) that
        this key, the admin token and ``parts`` make, and make again."""
        message = "\n".join(("linreboot api key", *parts, self.key)).encode()
        mac = hmac.new(self.secret.encode(), message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def _seconds(text: str | None) -> float | None:
    """A time kept only to bound a retry: unreadable (a damaged field) is as none, not an
    experiment that cannot be read."""
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def reward_text(reward: float) -> str:
    """The shortest decimal that round-trips: equal floats give equal strings.

    ``-0.0 + 0.0`` is ``0.0``: the one pair of equal floats with two spellings
    gets one (reward.lua compares the texts). The sums do not change: they
    start at +0.0, and adding -0.0 or +0.0 to a sum gives the same bits.
    """
    return repr(float(reward) + 0.0)


def one_of(key_hash: str, known: Sequence[str | None]) -> bool:
    """``key_hash`` is one of the ``known`` hashes (None: no such key), compared in
    constant time."""
    return any(hmac.compare_digest(key_hash, k) for k in known if k is not None)


def check_vector(values: Sequence[float], bound: float, what: str) -> None:
    if not all(math.isfinite(v) and abs(v) <= bound for v in values):
        raise InvalidInput(f"{what} must be finite numbers with |value| <= {bound:g}")


def state_for(
    config: PolicyConfig, arms: list[ArmRecord], stats: dict[str, bytes],
    unfolded: Sequence[bytes],
) -> State:
    """The statistics of ``arms`` (every arm), batch of one: the stored sums with the
    ``unfolded`` outcomes added (:mod:`service.folding`), not aged.

    An experiment that forgets is scored with every slot at the clock of its
    latest outcome (:func:`policies.discounted` of this), so a request that
    names a few arms is scored at the experiment's clock, not at theirs.
    """
    if config.shared:
        model_blobs = [stats.get(keys.model_field(None))]
    else:
        model_blobs = [stats.get(keys.model_field(a.id)) for a in arms]
    arm_blobs = [stats.get(keys.arm_field(a.id)) for a in arms]
    state = assemble_state(config, model_blobs, arm_blobs)
    fold_into(config, state, positions_of(arms), unfolded)
    return state


def positions_of(arms: Sequence[ArmRecord]) -> dict[str, int]:
    """Each arm's stats field, to its position in the state's arm axis."""
    return {keys.arm_field(a.id): k for k, a in enumerate(arms)}


def field_names(shared: bool, arm_id: str) -> dict[str, str]:
    """The stats fields a reward of ``arm_id`` adds to (kept with each decision)."""
    return {
        "model_field": keys.model_field(None if shared else arm_id),
        "arm_field": keys.arm_field(arm_id),
    }


def index_ranges(indexes: Sequence[int]) -> str:
    """Increasing arm indexes as ranges, "0-16,18-99": a few bytes for the usual all-arms case."""
    parts: list[str] = []
    start = previous = -2
    for i in indexes:
        if i != previous + 1:
            if previous >= 0:
                parts.append(str(start) if start == previous else f"{start}-{previous}")
            start = i
        previous = i
    if previous >= 0:
        parts.append(str(start) if start == previous else f"{start}-{previous}")
    return ",".join(parts)


def parse_index_ranges(text: str) -> list[int]:
    """The indexes of :func:`index_ranges`' text."""
    indexes: list[int] = []
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        indexes.extend(range(int(first), int(last or first) + 1))
    return indexes


def ranges_count(text: str) -> int:
    """How many indexes ``index_ranges`` text ("0-4,7,9-12") holds, without listing them."""
    total = 0
    for part in filter(None, text.split(",")):
        start, _, end = part.partition("-")
        total += int(end) - int(start) + 1 if end else 1
    return total


def spec_to_json(spec: ExperimentSpec) -> dict[str, object]:
    data = dataclasses.asdict(spec)
    data.pop("arms")
    if spec.propensities:  # the default, left out: a worker of the version before reads it
        data.pop("propensities")
    if spec.shards == 1:  # likewise
        data.pop("shards")
    if spec.position_weights is None:  # likewise
        data.pop("position_weights")
    return data


def parse_definition(meta: dict[str, str], arms_raw: dict[str, str]) -> Definition:
    spec_data = json.loads(meta["spec"])
    if spec_data.get("position_weights") is not None:
        spec_data["position_weights"] = tuple(spec_data["position_weights"])
    config = stored_config(json.loads(meta["config"]))
    arms = []
    for arm_id, text in arms_raw.items():
        data = json.loads(text)
        features = tuple(data["features"]) if data.get("features") is not None else None
        arms.append(ArmRecord(arm_id, int(data["index"]), bool(data["active"]), features,
                              data.get("added")))
    arms.sort(key=lambda a: a.index)
    spec = ExperimentSpec(
        arms=tuple(ArmSpec(a.id, a.features) for a in arms), **spec_data
    )
    return Definition(
        spec=spec,
        config=config,
        key_hash=meta["key_hash"],
        previous_key_hash=meta.get("key_hash_old"),
        key_nonce=meta.get("key_nonce"),
        key_rotated_at=_seconds(meta.get("key_rotated_at")),
        incarnation=meta["incarnation"],
        created_at=float(meta["created_at"]),
        version=int(meta["version"]),
        arms=tuple(arms),
        features=(
            np.array([a.features for a in arms], dtype=np.float64)
            if spec.setting == "stochastic" else None
        ),
    )
