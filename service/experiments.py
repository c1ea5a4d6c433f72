"""Experiments: create and manage them, choose arms, apply rewards exactly once.

The math is :mod:`policies` with a batch of one; the state is read from and
added to Redis through :class:`service.store.Store`.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import functools
import hashlib
import hmac
import json
import logging
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np

from policies import (
    POLICIES,
    SETTINGS,
    Choice,
    PolicyConfig,
    Ready,
    State,
    check_hyperparameters,
    discounted,
    draw,
    layout,
    paper_config,
    prepare,
)
from policies.config import stored_config
from policies.propensity import SERVICE, off_the_loop, propensities
from policies.ridge import ridge
from policies.state import Axis, Sums, inherit_kept
from service import keys
from service.codec import (
    RECORDED,
    assemble_state,
    legacy_recipe,
    recipe,
    stored_recipe,
    upgrade_blob,
)
from service.domain import (
    ArmSpec,
    ArmState,
    ChooseRequest,
    Decision,
    ExperimentSpec,
    ExperimentView,
    LogEntry,
    LogEntryType,
    RewardOutcome,
    RewardStatus,
    valid_arm_id,
    valid_experiment_id,
    with_service_defaults,
)
from service.embedded import EmbeddedRedis
from service.errors import (
    Conflict,
    DomainError,
    Forbidden,
    InvalidInput,
    NotFound,
    StartupError,
    StoreUnavailable,
)
from service.folding import FOLD_EVERY, FOLD_LIMIT, fold_into, folded_blobs
from service.settings import Settings
from service.store import Appended, Progress, Snapshot, Store, log_entry_json_bytes
from service.sweeper import Sweeper

logger = logging.getLogger("linreboot.service")

# A stale view costs one more attempt; a third means the experiment is being redefined.
_DECIDE_ATTEMPTS = 3


@dataclass(frozen=True)
class ArmRecord:
    id: str
    index: int
    active: bool
    features: tuple[float, ...] | None


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

    def accepts(self, key_hash: str) -> bool:
        """``key_hash`` is the hash of a key this experiment takes (current or previous)."""
        return _one_of(key_hash, (self.key_hash, self.previous_key_hash))

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
        return _rows(self.active_arms)

    @functools.cached_property
    def arm_positions(self) -> dict[str, int]:
        """Each arm's stats field, to its position in the state's arm axis (a view
        adding outcomes looks their arms up here)."""
        return _arm_positions(self.arms)

    @functools.cached_property
    def by_id(self) -> dict[str, ArmRecord]:
        return {a.id: a for a in self.arms}

    @functools.cached_property
    def active_ranges(self) -> str:
        """The active arms' indexes as the decision log writes them (:func:`index_ranges`)."""
        return index_ranges(self.active_rows)


@dataclass
class _Prepared:
    """The last request's arms (rows), their statistics, and, while the contexts stay
    the same, the prepared policy and the propensities computed from it (by position)."""

    rows: tuple[int, ...]
    state: State
    ready: Ready | None = None
    propensities: dict[int, float] = field(default_factory=dict)


@dataclass
class View:
    """What this worker last read of an experiment: its definition and statistics.

    ``version`` and ``rewards`` (the outcomes counter: rewards and default
    rewards applied) say when the statistics were read: ``decide.lua`` records
    a decision made from this view only while both are still current.
    """

    definition: Definition
    version: int
    rewards: int
    last_number: int  # the highest decision number this worker has seen
    state: State  # every arm, in registration order (ArmRecord.index)
    # outcomes (rewards, defaults) this worker applied since the statistics were read
    behind: int = 0
    # The records of those outcomes, while they are all of them and the next after
    # `rewards` (this worker's own rewards, nobody else's between): the view catches
    # up with them without reading. None once it cannot.
    own: list[bytes] | None = field(default_factory=list, repr=False)
    own_bytes: int = 0  # their size, counted in the worker's view budget with `nbytes`
    # The stored sums held `folded` outcomes, and the view added the next
    # `applied` (service.folding); `raw` is `state` before an experiment that
    # forgets is aged to its clock (None: `state` itself). What catching up
    # with the latest outcomes starts from (ExperimentService._caught_up).
    folded: int = 0
    applied: int = 0
    raw: State | None = None
    _last: _Prepared | None = field(default=None, repr=False)
    _inherited: _Prepared | None = field(default=None, repr=False)  # see inherit()

    @functools.cached_property
    def nbytes(self) -> int:
        """Memory it may hold: the statistics (and the sums before they were aged, for an
        experiment that forgets), as much again for a request's subset, and with a model
        per arm the solutions the subset keeps (``policies.state.kept_theta``)."""
        sums = sum(a.nbytes for a in self.state.values())
        raw = 0 if self.raw is None else sum(a.nbytes for a in self.raw.values())
        if self.definition.config.shared:
            return 2 * sums + raw
        # One kept solution per model: theta, with the inverse of X'X + reg I (LinUCB,
        # the pooled spread) or the draw basis W (the samplers, LinPHE and LinGIRO), and
        # the X'X and X'y it was solved from (policies.state.kept_theta,
        # kept_ridge_and_inverse, kept_draw_basis): at most 2 X'X and 2 X'y; counted
        # with room to spare.
        return 2 * sums + raw + 5 * self.state["xtx"].nbytes + 2 * self.state["xty"].nbytes

    @property
    def sums(self) -> State:
        """The statistics as stored, with the outcomes the view added: not aged."""
        return self.state if self.raw is None else self.raw

    def inherit(self, older: View) -> None:
        """Start from the solutions ``older``'s last request kept (of the same definition):
        with a model per arm a reward changes one model, and the first request on this
        view then solves that one instead of all (``policies.state.inherit_kept``; the
        same bits as solving all, as each model is solved alone)."""
        if older.definition is self.definition and self._last is None:
            # Copied when a request on this view asks for the same arms (most do).
            self._inherited = older._last if older._last is not None else older._inherited

    def _sliced(self, rows: tuple[int, ...]) -> Sums:
        """The statistics of the arms at ``rows``: a Sums, so that the requests on this
        view keep its solutions (``policies.state.kept_theta``)."""
        config = self.definition.config
        take = np.array(rows)
        return Sums({
            name: self.state[name][:, take] if spec.per_arm(config) else self.state[name]
            for name, spec in layout(config).items()
        })

    def ready(
        self, request: ChooseRequest, bound: float
    ) -> tuple[list[ArmRecord], np.ndarray, Ready]:
        """The arms a request may get, their contexts (K', d), and the prepared policy.

        Most requests name no arms, so the rows are those of the last request
        and their statistics are reused; with fixed contexts (stochastic) so is
        the prepared policy: then a decision costs only its random draw.
        """
        arms, contexts = _candidates(self.definition, request, bound)
        definition, config = self.definition, self.definition.config
        rows = definition.active_rows if arms is definition.active_arms else _rows(arms)
        if self._last is None or self._last.rows != rows:
            sliced = self._sliced(rows)
            inherited, self._inherited = self._inherited, None
            if inherited is not None and inherited.rows == rows:
                inherit_kept(sliced, inherited.state)
            self._last = _Prepared(rows, sliced)
        last = self._last
        if last.ready is not None:
            return arms, contexts, last.ready
        ready = prepare(config, last.state, contexts[None])
        if definition.features is not None:  # contexts follow from the rows
            last.ready = ready
        return arms, contexts, ready

    async def propensity(self, ready: Ready, position: int) -> float:
        """The probability that ``draw(ready)`` picks ``position``: it depends on the
        statistics, not on the draw, so it is kept with ``ready`` while the view keeps
        that (until a reward changes the statistics). A shared model's estimate and a
        Student t integral take milliseconds, so they run in a thread, not on the event
        loop (:func:`policies.propensity.off_the_loop`)."""
        last = self._last
        kept = last.propensities if last is not None and last.ready is ready else {}
        if position not in kept:
            def compute() -> float:
                arm = np.array([position])
                return float(propensities(ready, arm, accuracy=SERVICE)[0])
            kept[position] = (await asyncio.to_thread(compute) if off_the_loop(ready)
                              else compute())
        return kept[position]


class UnknownArm(InvalidInput):
    """A request names an arm the definition at hand does not have."""


def _rows(arms: Sequence[ArmRecord]) -> tuple[int, ...]:
    return tuple(a.index for a in arms)


_WRONG_KEY = "the API key is not valid for this experiment"
# A view keeps the records of at most this many of its worker's own outcomes (a few
# hundred bytes each); beyond, it reads what it lacks when it must catch up.
_OWN_RECORDS_KEPT = 256


def _missing(key: str | None) -> DomainError:
    """No such experiment. A caller with a key is told what a wrong key is told
    (no key fits a missing experiment), so ids cannot be probed without one;
    ``key`` None is a trusted in-process caller."""
    return NotFound("no experiment with this id") if key is None else Forbidden(_WRONG_KEY)


async def _connect(url: str, settings: Settings) -> Store:
    """A store on ``url`` that has answered a PING; else one line naming REDIS_URL."""
    store: Store | None = None
    try:
        store = await Store.connect(url, settings.redis_timeout_seconds, settings.redis_cluster)
        await store.ping()
    except StoreUnavailable as exc:
        if store is not None:
            await store.close()
        reason = str(exc.__cause__ or exc).strip().splitlines()[0]
        raise StartupError(
            f"REDIS_URL: Redis at {_public_url(url)} does not answer ({reason}): start it, "
            "or fix REDIS_URL", exit_code=3,
        ) from None
    return store


def _public_url(url: str) -> str:
    """``url`` without its credentials, for messages."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}{parts.path}"


def _hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


def _reward_text(reward: float) -> str:
    """The shortest decimal that round-trips: equal floats give equal strings.

    ``-0.0 + 0.0`` is ``0.0``: the one pair of equal floats with two spellings
    gets one (reward.lua compares the texts). The sums do not change: they
    start at +0.0, and adding -0.0 or +0.0 to a sum gives the same bits.
    """
    return repr(float(reward) + 0.0)


class ExperimentService:
    """The service's domain API; the app's routes call exactly these methods."""

    def __init__(self, store: Store, settings: Settings, embedded: EmbeddedRedis | None = None):
        self._store = store
        self._settings = settings
        self._embedded = embedded
        # Per experiment, what this worker last read; least recently used first.
        self._views: OrderedDict[str, View] = OrderedDict()
        self._view_bytes = 0
        self._rng = np.random.default_rng()  # unseeded experiments share one stream
        self.persistence_warnings: list[str] = []
        self.upgraded: list[str] = []  # experiments brought up to date at start-up
        self.upgrade_failures: list[str] = []  # "id: reason" for those that could not be
        self._background: set[asyncio.Task[None]] = set()  # folds no request waits for
        self._sweeper = Sweeper(store, settings.sweep_interval_seconds, self._defaults_applied,
                                settings.default_reward_grace_seconds)

    @classmethod
    async def open(cls, settings: Settings) -> ExperimentService:
        """Connect to ``settings.redis_url``, or start an embedded Redis without one.

        Raises
        ------
        StartupError
            One line, when the embedded Redis cannot start or Redis does not answer.
        """
        embedded = None
        url = settings.redis_url
        if url is None:
            embedded = EmbeddedRedis(settings.data_dir).start()  # this process owns it
            url = embedded.url
        try:
            store = await _connect(url, settings)
        except BaseException:
            if embedded is not None:
                embedded.stop()
            raise
        service = cls(store, settings, embedded)
        store.quiet_dropped_nodes()  # a cluster's failovers: a warning, not error storms
        try:
            service.persistence_warnings = await service._store.persistence_warnings()
            service.upgraded = await service._upgrade_stored()
        except StoreUnavailable as exc:  # e.g. out of memory while upgrading
            await service.close()
            raise StartupError(f"REDIS_URL: Redis at {_public_url(url)} failed during start-up "
                               f"({exc}): fix Redis, then start again", exit_code=3) from None
        except BaseException:
            await service.close()
            raise
        return service

    @staticmethod
    async def check_store(settings: Settings) -> None:
        """Start-up check of ``settings.redis_url``: :class:`StartupError` unless Redis answers."""
        assert settings.redis_url is not None
        await (await _connect(settings.redis_url, settings)).close()

    def start_sweeper(self) -> None:
        """Apply default rewards in the background, until :meth:`close` (see service.sweeper)."""
        self._sweeper.start()

    async def sweep(self) -> int:
        """Apply the default rewards that are due now, once (what the background sweeper
        does every tick); how many were applied."""
        return (await self._sweeper.sweep()).defaulted

    async def close(self) -> None:
        """Stop the sweeper, close the connections; stop the embedded Redis if this
        service started it."""
        try:
            await self._sweeper.stop()
            await self.drain()
            await self._store.close()
        finally:
            if self._embedded is not None:
                self._embedded.stop()

    @property
    def store_is_cluster(self) -> bool:
        """Whether the statistics live in a Redis Cluster (else one Redis)."""
        return self._store.cluster

    async def ping(self) -> None:
        await self._store.ping()

    async def ready(self) -> None:
        """Redis answers and accepts writes; StoreFull while it is out of memory."""
        await self._store.ready()

    # -- management -------------------------------------------------------

    async def create(self, spec: ExperimentSpec) -> tuple[ExperimentView, str]:
        spec = with_service_defaults(spec)
        config = self._validate_spec(spec)
        api_key = secrets.token_urlsafe(32)
        meta = {
            "spec": json.dumps(_spec_to_json(spec)),
            "config": json.dumps(dataclasses.asdict(config)),
            "key_hash": _hash_key(api_key),
            "incarnation": secrets.token_hex(8),
            "created_at": repr(time.time()),
            # Random, not 1: a worker that cached a deleted experiment of the
            # same id must see a different version and reload.
            "version": str(secrets.randbits(52) + 1),
            # What the stored sums hold (service.codec) and a context's size, fixed
            # for this incarnation, and how fast the sums forget (policies.state,
            # "Forgetting").
            **_stored_format(config),
            **({"discount": repr(config.discount)} if config.discounted else {}),
            # Read by the scripts: the default reward (settle.lua) and the
            # decision log's bounds (decide.lua, reward.lua, settle.lua).
            **({} if spec.default_reward is None
               else {"default_reward": _reward_text(spec.default_reward)}),
            **({} if spec.log_max_entries == 0
               else {"log_max_entries": str(spec.log_max_entries),
                     "log_max_age_seconds": str(spec.log_max_age_seconds)}),
        }
        arms = {
            a.id: json.dumps({"index": i, "active": True, "features": a.features})
            for i, a in enumerate(spec.arms)
        }
        if not await self._store.create(spec.id, meta, arms,
                                        default_reward=spec.default_reward is not None):
            raise Conflict("an experiment with this id already exists")
        # From what was written, not read back: a read that failed now (Redis
        # just out of memory, say) would leave the experiment without its key.
        return _view(_parse_definition(meta, arms), {}, ()), api_key

    async def get(self, experiment_id: str) -> ExperimentView:
        if not valid_experiment_id(experiment_id):
            raise NotFound("no experiment with this id")
        read = await self._store.read_experiment(experiment_id)
        if read is None:
            raise NotFound("no experiment with this id")
        meta, arms, snapshot = read
        return _view(_parse_definition(meta, arms), snapshot.stats, snapshot.unfolded)

    async def list(
        self, limit: int = 100, after: str | None = None
    ) -> tuple[builtins.list[ExperimentView], str | None]:
        """Up to ``limit`` experiments in id order, after ``after``; and the id to go on from.

        The second value is None on the last page.
        """
        ids = [i for i in await self._store.list_ids() if after is None or i > after]
        views = []
        for experiment_id in ids[:limit]:
            try:
                views.append(await self.get(experiment_id))
            except NotFound:
                await self._store.forget_id(experiment_id)
        more = len(ids) > limit
        return views, (ids[limit - 1] if more else None)

    async def delete(self, experiment_id: str) -> None:
        self._forget(experiment_id)
        if not await self._store.delete(experiment_id):
            raise NotFound("no experiment with this id")

    async def add_arms(self, experiment_id: str, arms: Sequence[ArmSpec]) -> ExperimentView:
        definition = await self._definition(experiment_id)
        self._validate_arms(definition.spec.setting, definition.spec.dim, arms)
        too_many = InvalidInput(f"an experiment may have at most {self._settings.max_arms} arms")
        if len(definition.arms) + len(arms) > self._settings.max_arms:
            raise too_many
        records = {a.id: json.dumps({"active": True, "features": a.features}) for a in arms}
        result = await self._store.add_arms(experiment_id, records, self._settings.max_arms)
        if result == 0:
            raise NotFound("no experiment with this id")
        if result == -2:  # arms added by another request meanwhile
            raise too_many
        if result < 0:
            raise Conflict("an arm with one of these ids already exists")
        return await self.get(experiment_id)

    async def update_settings(
        self, experiment_id: str, changes: Mapping[str, object]
    ) -> ExperimentView:
        """Change the live settings (:data:`LIVE_SETTINGS`) of an experiment: every worker's
        next decision reads them, and the change goes to the decision log.

        ``reward_window_seconds`` is the window of decisions made from now on;
        ``default_reward`` the default of decisions settled from now on (one cannot be
        added or removed: which decisions count would change); ``epsilon`` and
        ``max_stale_rewards`` hold for decisions made from now on; the log bounds
        at its next write.
        """
        unknown = sorted(set(changes) - set(LIVE_SETTINGS))
        if unknown or not changes:
            raise InvalidInput(
                "only these settings change on a live experiment: " + ", ".join(LIVE_SETTINGS)
                + "; the others would change what its statistics mean (create another)")
        for _ in range(_DECIDE_ATTEMPTS):
            definition = await self._definition(experiment_id)
            spec, config = self._changed(definition, changes)
            version = await self._store.update_settings(
                experiment_id, definition.version, json.dumps(_spec_to_json(spec)),
                json.dumps(dataclasses.asdict(config)),
                None if spec.default_reward is None else _reward_text(spec.default_reward),
                spec.log_max_entries, spec.log_max_age_seconds,
                json.dumps(dict(changes), sort_keys=True))
            if version == 0:
                raise NotFound("no experiment with this id")
            if version > 0:
                self._forget(experiment_id)
                return await self.get(experiment_id)
        raise StoreUnavailable("the experiment kept changing; retry")

    def _changed(self, definition: Definition, changes: Mapping[str, object]
                 ) -> tuple[ExperimentSpec, PolicyConfig]:
        """The spec and config with ``changes``, checked as at creation."""
        spec, s = definition.spec, self._settings
        fields = {k: v for k, v in changes.items() if k != "epsilon"}
        if "default_reward" in changes:
            if spec.default_reward is None or changes["default_reward"] is None:
                raise InvalidInput(
                    "default_reward can change its value only: one cannot be added to or "
                    "removed from a live experiment (which decisions count would change)")
            _check_vector([float(changes["default_reward"])],  # type: ignore[arg-type]
                          s.feature_bound, "default_reward")
        window = fields.get("reward_window_seconds", spec.reward_window_seconds)
        if not 1 <= int(window) <= s.max_reward_window_seconds:  # type: ignore[call-overload]
            raise InvalidInput(
                f"reward_window_seconds must be between 1 and {s.max_reward_window_seconds}")
        if spec.default_reward is not None and int(window) < spec.reward_window_seconds:  # type: ignore[call-overload]
            # The pending decisions wait in deadline order and the sweeper stops at the
            # first that is not due; a shorter window would put new deadlines before old
            # ones, and decisions behind them would miss their default.
            raise InvalidInput(
                "reward_window_seconds cannot shrink on an experiment with a default_reward "
                f"(now {spec.reward_window_seconds}): the decisions waiting for their default "
                "are kept in deadline order; it may stay or grow")
        hyperparameters = dict(spec.hyperparameters)
        if "epsilon" in changes:
            hyperparameters["epsilon"] = changes["epsilon"]  # type: ignore[assignment]
        new_spec = dataclasses.replace(spec, hyperparameters=hyperparameters,
                                       **fields)  # type: ignore[arg-type]
        if new_spec.log_all_contexts and new_spec.log_max_entries == 0:
            raise InvalidInput("log_all_contexts needs a decision log: log_max_entries must "
                               "stay above 0")
        epsilon = float(hyperparameters.get("epsilon", definition.config.epsilon))
        try:
            config = dataclasses.replace(definition.config, epsilon=epsilon)
        except ValueError as exc:
            raise InvalidInput(f"invalid hyperparameters: {exc}") from None
        return new_spec, config

    async def rotate_key(self, experiment_id: str) -> str:
        """A new API key for the experiment, shown once; the current one stays valid as
        its previous key until :meth:`revoke_previous_key` (one key before it is no
        longer valid: an experiment takes two at most)."""
        api_key = secrets.token_urlsafe(32)
        if not await self._store.rotate_key(experiment_id, _hash_key(api_key)):
            raise NotFound("no experiment with this id")
        return api_key

    async def revoke_previous_key(self, experiment_id: str) -> bool:
        """Revoke the key a rotation kept valid; False if there was none. Takes effect at
        once: every decision and reward script reads the keys."""
        result = await self._store.revoke_previous_key(experiment_id)
        if result == 0:
            raise NotFound("no experiment with this id")
        return result == 1

    async def retire_arms(self, experiment_id: str, arm_ids: Sequence[str]) -> ExperimentView:
        definition = await self._definition(experiment_id)
        if not arm_ids or len(set(arm_ids)) != len(arm_ids):
            raise InvalidInput("give one or more distinct arm ids to retire")
        every = InvalidInput("cannot retire every active arm")
        if not {a.id for a in definition.active_arms} - set(arm_ids):
            raise every
        result = await self._store.retire_arms(experiment_id, arm_ids)
        if result == 0:
            raise NotFound("no experiment with this id")
        if result == -2:  # the others retired by another request meanwhile
            raise every
        if result < 0:
            raise NotFound("unknown arm id")
        return await self.get(experiment_id)

    async def _upgrade_stored(self) -> builtins.list[str]:
        """Experiments written by an earlier version, brought up to date.

        Earlier versions stored no recipes (or the recipe of whole Gram
        matrices), pending decisions without field names, and Gram matrices
        whole. Each worker runs this at start-up; the store makes it happen
        once. An experiment that cannot be upgraded is reported in
        ``upgrade_failures`` (and answers 5xx until it is fixed or deleted);
        it does not stop the service.
        """
        upgraded = []
        for experiment_id in await self._store.list_ids():
            raw = await self._store.read_definition(experiment_id)
            if raw is None:
                continue
            try:
                config = stored_config(json.loads(raw[0]["config"]))
                if await self._store.upgrade(
                    experiment_id,
                    _stored_format(config),
                    functools.partial(_upgraded_stats, config),
                    functools.partial(_field_names, config.shared),
                    functools.partial(_decisions_behind, config),
                ):
                    upgraded.append(experiment_id)
            except (ValueError, TypeError, KeyError, RuntimeError) as exc:
                self.upgrade_failures.append(f"{experiment_id}: {exc}")
        return upgraded

    # -- decisions --------------------------------------------------------

    async def choose(
        self, experiment_id: str, request: ChooseRequest, api_key: str | None = None
    ) -> Decision:
        """Choose an arm from this worker's view of the statistics, and record it.

        The decision is recorded only if that view is still current, or at most
        the experiment's ``max_stale_rewards`` behind (one round trip then);
        otherwise the store replies with the current statistics, read after
        the request arrived, and the decision is made again from them. So a
        decision reflects every reward acknowledged before its request arrived
        (but the latest ``max_stale_rewards``); rewards that arrive while it is
        being made may or may not count. ``api_key`` is checked before the
        request is (403 first) and again by ``decide.lua``; a missing
        experiment is the same 403 (see :func:`_missing`). None is for
        trusted in-process callers only (a missing experiment is then 404).
        """
        if not valid_experiment_id(experiment_id):
            raise _missing(api_key)
        key_hash = None if api_key is None else _hash_key(api_key)
        view = await self._view_for(experiment_id, key_hash)
        if view.behind > view.definition.spec.max_stale_rewards:
            # decide.lua would refuse a decision from this view: catch up first, rather
            # than prepare, draw and compute a propensity twice.
            if view.own is not None and len(view.own) == view.behind:
                view = self._added(experiment_id, view, view.own, view.rewards + view.behind,
                                   view.folded, view.last_number)
            else:
                view = await self._caught_up(experiment_id, view, key_hash)
        bound = self._settings.feature_bound
        try:
            candidates = view.ready(request, bound)
        except UnknownArm:  # perhaps added since this worker read the experiment
            view = await self._read_view(experiment_id, key_hash)
            candidates = view.ready(request, bound)
        seeded = view.definition.spec.seed is not None
        seen: tuple[int, int] | None = (view.version, view.rewards)
        number, reserved = (view.last_number + 1 if seeded else None), False
        for attempt in range(_DECIDE_ATTEMPTS):
            if attempt:
                candidates = view.ready(request, bound)
            definition = view.definition
            arms, contexts, ready = candidates
            rng = self._rng if number is None else _decision_rng(definition.spec.seed, number)
            choice = draw(ready, [rng])
            picked = int(choice.arms[0])
            # The caller's id (idempotent), else as random as uuid4().hex, cheaper.
            decision_id = request.decision_id or secrets.token_hex(16)
            x = np.ascontiguousarray(contexts[picked], dtype="<f8").tobytes()
            propensity = (await view.propensity(ready, picked)
                          if definition.spec.propensities else None)
            record = _decision_record(view, arms[picked], x, propensity)
            every = contexts if definition.spec.log_all_contexts else None
            reply = await self._store.decide(
                experiment_id, decision_id, key_hash=key_hash,
                incarnation=definition.incarnation, seen=seen, number=number,
                reserved=reserved, ttl_seconds=definition.spec.reward_window_seconds,
                max_lag=definition.spec.max_stale_rewards,
                grace_seconds=self._settings.default_reward_grace_seconds,
                record=record,
                logged=_log_entry_fields(decision_id, arms, arms[picked], x, view, propensity,
                                         every),
                held=view.folded + view.applied,
                request=None if request.decision_id is None else (
                    request.digest(), _answer(arms[picked].id, choice, propensity),
                    self._settings.idempotency_seconds),
            )
            if reply.status == "repeat":  # answered before under the caller's id
                assert reply.answer is not None
                return _repeated(definition, decision_id, reply.number, reply.answer)
            if reply.status == "conflict":
                raise Conflict("this decision_id was used by another request (a different "
                               "context, eligible or excluded): choose a new id")
            if reply.status == "spent":
                raise Conflict(
                    "this decision_id was answered more than "
                    f"{self._settings.idempotency_seconds} s ago (LINREBOOT_IDEMPOTENCY_SECONDS) "
                    "and its decision is still live: its answer is no longer kept for a "
                    "retry; choose a new id")
            if reply.status == "recorded":
                view.last_number = max(view.last_number, reply.number)
                return _decision(definition, decision_id, arms[picked], choice, reply.number,
                                 propensity)
            if reply.status == "missing":
                self._forget(experiment_id)
                raise _missing(api_key)
            if reply.status == "forbidden":
                raise Forbidden(_WRONG_KEY)
            if reply.progress is not None:  # what this view lacks: catch up
                view = await self._caught_up(experiment_id, view, key_hash, reply.progress)
            else:
                assert reply.snapshot is not None
                view = await self._refresh_view(experiment_id, view, reply.snapshot)
            # Decide again from the statistics just read, and record that
            # decision whatever has changed since: under steady rewards a
            # check would fail again and again.
            seen, number, reserved = None, reply.reserved, True
            if number is None and view.definition.spec.seed is not None:
                # No number set aside: the definition changed (arms, or created
                # again) since the request was checked. Check it again (the next
                # attempt's ready()), so a refusal takes no number; then predict one.
                seen, number, reserved = (view.version, view.rewards), view.last_number + 1, False
        raise StoreUnavailable("the experiment changed while deciding; retry")

    async def reward(
        self, experiment_id: str, items: Sequence[tuple[str, float]], api_key: str | None = None
    ) -> builtins.list[RewardOutcome]:
        """Apply rewards exactly once, in one script that also checks ``api_key``.

        A missing experiment is the 403 of a wrong key. ``api_key=None`` is for
        trusted in-process callers only (a missing experiment is then 404).
        """
        if not items:
            raise InvalidInput("give at least one reward")
        bound = self._settings.feature_bound
        for _, value in items:
            if not (math.isfinite(value) and abs(value) <= bound):
                raise InvalidInput(f"rewards must be finite numbers with |reward| <= {bound:g}")
        if not valid_experiment_id(experiment_id):
            raise _missing(api_key)
        key_hash = None if api_key is None else _hash_key(api_key)
        texts = [(decision_id, _reward_text(value)) for decision_id, value in items]
        reply = await self._store.apply_rewards(experiment_id, key_hash, texts)
        if reply.statuses == ["missing"]:
            self._forget(experiment_id)
            raise _missing(api_key)
        if reply.statuses == ["forbidden"]:
            raise Forbidden(_WRONG_KEY)
        outcomes = []
        for (decision_id, _), text in zip(items, reply.statuses, strict=True):
            status = _status(text)
            outcomes.append(RewardOutcome(decision_id, status, _REWARD_MESSAGES[status]))
        applied = sum(outcome.status == "applied" for outcome in outcomes)
        view = self._views.get(experiment_id)
        if view is not None and applied:
            self._add_own(view, reply.appended, applied)
        self._fold_soon(experiment_id, reply.counter, applied)
        return outcomes

    def _add_own(self, view: View, appended: Appended | None, applied: int) -> None:
        """``view`` (this worker's current one) is ``applied`` outcomes behind more; it
        keeps their records (:attr:`View.own`, counted in the view budget) while they
        follow on from what it holds, and learns the decision numbers taken meanwhile
        (a seeded decision predicts the next)."""
        if view.own is not None:
            follows = (appended is not None and len(appended.records) == applied
                       and len(view.own) == view.behind
                       and appended.incarnation == view.definition.incarnation
                       and appended.version == view.version
                       and appended.outcomes - applied == view.rewards + view.behind)
            if follows and len(view.own) + applied <= _OWN_RECORDS_KEPT:
                assert appended is not None
                view.own.extend(appended.records)
                view.last_number = max(view.last_number, appended.decision_seq)
                self._count_own(view, sum(map(len, appended.records)))
            else:
                self._drop_own(view)
        view.behind += applied

    def _drop_own(self, view: View) -> None:
        """``view`` catches up by reading from now on."""
        view.own = None
        self._count_own(view, -view.own_bytes)

    def _count_own(self, view: View, change: int) -> None:
        view.own_bytes += change
        self._view_bytes += change
        self._within_budget(keep=view)

    def _fold_soon(self, experiment_id: str, counter: int, recorded: int) -> None:
        """:meth:`fold_if_due` in the background: the request that crossed a multiple
        of FOLD_EVERY does not wait for the sums to be written back (a read, a solve of
        the outcomes, a write: milliseconds at d = 20), which no reply depends on."""
        if not _fold_due(counter, recorded):
            return
        task = asyncio.get_running_loop().create_task(
            self.fold_if_due(experiment_id, counter, recorded), name=f"fold {experiment_id}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self) -> None:
        """Wait for the background folds started so far (:meth:`close` does; tests that
        read the stored sums after a reward do too)."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    async def _defaults_applied(self, experiment_id: str, counter: int, defaulted: int) -> None:
        """The sweeper applied ``defaulted`` default rewards: this worker's view is
        behind by as many (the next decision reads first), and the sums may be due
        to be written back."""
        view = self._views.get(experiment_id)
        if view is not None:
            view.behind += defaulted
            self._drop_own(view)  # their records are not at hand: catching up reads
        await self.fold_if_due(experiment_id, counter, defaulted)

    async def fold_if_due(self, experiment_id: str, counter: int, recorded: int) -> None:
        """Write the sums back (:mod:`service.folding`) when the ``recorded`` outcomes
        took the experiment's rewards (or defaulted) counter to ``counter``, past
        a multiple of FOLD_EVERY.

        Exactly one call crosses each multiple. A fold that fails is logged and
        left to the next (its records wait, counted in every view): the outcomes
        it would have folded are applied already.
        """
        if not _fold_due(counter, recorded):
            return
        try:
            view = self._views.get(experiment_id)
            definition = (view.definition if view is not None
                          else await self._definition(experiment_id))
            folded = await self._store.fold(experiment_id, definition.incarnation, FOLD_LIMIT,
                                            functools.partial(folded_blobs, definition.config))
            if folded is None and view is not None:  # created again since this worker read it
                self._forget(experiment_id)
                definition = await self._definition(experiment_id)
                await self._store.fold(experiment_id, definition.incarnation, FOLD_LIMIT,
                                       functools.partial(folded_blobs, definition.config))
        except (StoreUnavailable, NotFound) as exc:
            logger.warning("experiment %s: the sums were not written back (%s); the next "
                           "fold will", experiment_id, exc)
        except Exception:  # a damaged entry: the views that read it fail as loudly
            logger.exception("experiment %s: the sums were not written back", experiment_id)

    async def read_log(
        self, experiment_id: str, after: str | None = None, limit: int = 100
    ) -> tuple[builtins.list[LogEntry], str | None]:
        """Up to ``limit`` decision-log entries after the entry id ``after``, oldest first,
        and at most about ``LINREBOOT_LOG_PAGE_MAX_BYTES`` of them (at least one); and
        the entry id to go on from (None on the last page). The entries are decoded in
        a thread: a page of large contexts does not hold up the event loop."""
        if after is not None and not _valid_entry_id(after):
            raise InvalidInput("after must be an entry_id from the log")
        definition = await self._definition(experiment_id)
        if after is not None and _last_entry_id(after):
            return [], None
        raw, more = await self._store.read_log(experiment_id, after, limit,
                                               self._settings.log_page_max_bytes,
                                               _log_entry_size(definition))
        entries = await asyncio.to_thread(
            lambda: [_log_entry(definition, entry_id, fields) for entry_id, fields in raw])
        return entries, (raw[-1][0] if more and raw else None)

    # -- helpers ----------------------------------------------------------

    async def _view_for(self, experiment_id: str, key_hash: str | None) -> View:
        """This worker's view, read if it has none; 403 unless ``key_hash`` is the key's."""
        view = self._views.get(experiment_id)
        if view is None:
            return await self._read_view(experiment_id, key_hash)
        if key_hash is None or view.definition.accepts(key_hash):
            self._views.move_to_end(experiment_id)
            return view
        # A wrong key, a key rotated in since this view was read, or the experiment
        # was created again (with a new key). (A key revoked since is refused by the
        # scripts, which read the keys with every decision and reward.)
        stored = await self._store.key_hashes(experiment_id)
        if stored is None:
            self._forget(experiment_id)
            raise _missing(key_hash)
        if not _one_of(key_hash, stored):
            raise Forbidden(_WRONG_KEY)
        return await self._read_view(experiment_id, key_hash)

    async def _read_view(self, experiment_id: str, key_hash: str | None = None) -> View:
        read = await self._store.read_experiment(experiment_id)
        if read is None:
            self._forget(experiment_id)
            raise _missing(key_hash)
        meta, arms, snapshot = read
        definition = _parse_definition(meta, arms)
        if key_hash is not None and not definition.accepts(key_hash):
            raise Forbidden(_WRONG_KEY)  # nothing kept
        return self._remember(experiment_id, definition, snapshot)

    async def _caught_up(
        self, experiment_id: str, view: View, key_hash: str | None,
        progress: Progress | None = None,
    ) -> View:
        """The view with the statistics read now (and the definition, if arms changed).

        The sums change only by outcomes appended to the outcomes string and by
        folds of them (:mod:`service.folding`). So when no fold took an outcome
        this view has not added, the view catches up by adding the outcomes it
        lacks to a copy of its sums: the same bits as reading the sums, without
        reading them (the bulk of a read: a blob per arm). ``progress``: what
        a stale reply brought (else it is read); if the view cannot catch up
        with it, the statistics are read.
        """
        if progress is None:
            progress = await self._store.read_progress(experiment_id)
        if progress is None:
            self._forget(experiment_id)
            raise _missing(key_hash)
        caught = self._catch_up(experiment_id, view, progress)
        if caught is not None:
            return caught
        snapshot = await self._store.read_snapshot(experiment_id)
        if snapshot is None:
            self._forget(experiment_id)
            raise _missing(key_hash)
        return await self._refresh_view(experiment_id, view, snapshot)

    def _catch_up(self, experiment_id: str, view: View, progress: Progress) -> View | None:
        """The view at ``progress``, from ``view`` and the outcomes it lacks; None when a
        fold took outcomes it never added, or the definition changed."""
        latest = self._newer(experiment_id, view, progress.incarnation, progress.version,
                             progress.rewards)
        if latest is not None:
            return latest  # another request caught up meanwhile
        start = view.folded + view.applied - progress.folded  # the first outcome it lacks
        if not (progress.incarnation == view.definition.incarnation
                and progress.version == view.version and 0 <= start <= len(progress.unfolded)):
            return None
        return self._added(experiment_id, view, progress.unfolded[start:], progress.rewards,
                           progress.folded, max(view.last_number, progress.decision_seq))

    def _added(
        self, experiment_id: str, view: View, records: Sequence[bytes], rewards: int,
        folded: int, last_number: int,
    ) -> View:
        """This worker's view from now: ``view`` with the outcomes ``records`` (the next
        after those it holds) added, at the outcomes counter ``rewards``; ``folded`` of its
        outcomes are in the stored sums. The same bits as reading the statistics."""
        config = view.definition.config
        sums = {name: value.copy() for name, value in view.sums.items()}
        fold_into(config, sums, view.definition.arm_positions, records)
        state = discounted(config, sums)
        held = view.folded + view.applied + len(records)  # outcomes in the new view
        caught = View(view.definition, version=view.version, rewards=rewards,
                      last_number=last_number, state=state, folded=folded,
                      applied=held - folded, raw=None if state is sums else sums)
        caught.inherit(view)
        return self._keep(experiment_id, caught)

    async def _refresh_view(self, experiment_id: str, view: View, snapshot: Snapshot) -> View:
        """The view after a stale reply: its statistics, and the definition if arms changed.

        Requests that were in flight together get stale replies together; the
        first one rebuilds the view and the others take it if it is at least
        as new as their snapshot (same version, no fewer rewards).
        """
        latest = self._newer(experiment_id, view, view.definition.incarnation, snapshot.version,
                             snapshot.rewards)
        if latest is not None:
            return latest
        definition = view.definition
        if snapshot.version != definition.version:
            definition = await self._definition(experiment_id)
        # Decision numbers start again when the experiment is created again.
        same = definition.incarnation == view.definition.incarnation
        return self._remember(experiment_id, definition, snapshot, view.last_number if same else 0,
                              older=view)

    def _newer(
        self, experiment_id: str, view: View, incarnation: str, version: int, rewards: int
    ) -> View | None:
        """The cached view, if another request replaced ``view`` with one at least as new as
        statistics read at (incarnation, version, rewards): requests in flight together get
        stale replies together, and the first one's view serves the others."""
        latest = self._views.get(experiment_id)
        if (latest is not None and latest is not view
                and latest.definition.incarnation == incarnation
                and latest.version == version and latest.rewards >= rewards):
            return latest
        return None

    def _remember(
        self, experiment_id: str, definition: Definition, snapshot: Snapshot, last_number: int = 0,
        older: View | None = None,
    ) -> View:
        number = int(snapshot.stats.get(keys.DECISION_SEQUENCE, b"0"))
        config = definition.config
        sums = _state_for(config, list(definition.arms), snapshot.stats, snapshot.unfolded)
        state = discounted(config, sums)
        view = View(
            definition,
            version=snapshot.version,
            rewards=snapshot.rewards,
            last_number=max(last_number, number),
            state=state,
            folded=int(snapshot.stats.get(keys.FOLDED, b"0")),
            applied=len(snapshot.unfolded),
            raw=None if state is sums else sums,
        )
        if older is not None:
            view.inherit(older)
        return self._keep(experiment_id, view)

    def _keep(self, experiment_id: str, view: View) -> View:
        """Cache ``view`` as this worker's view of the experiment."""
        self._forget(experiment_id)
        self._views[experiment_id] = view
        self._view_bytes += view.nbytes + view.own_bytes
        self._within_budget(keep=view)
        return view

    def _within_budget(self, keep: View) -> None:
        """Drop views, least recently used first, until the budget holds or one is left,
        but never ``keep``. (Checked first: every reward and catch-up comes here, and the
        views may be thousands.)"""
        if self._view_bytes <= self._settings.view_cache_bytes:
            return
        for experiment_id, view in list(self._views.items()):
            if self._view_bytes <= self._settings.view_cache_bytes or len(self._views) <= 1:
                return
            if view is not keep:
                self._forget(experiment_id)

    def _forget(self, experiment_id: str) -> None:
        dropped = self._views.pop(experiment_id, None)
        if dropped is not None:
            self._view_bytes -= dropped.nbytes + dropped.own_bytes

    async def _definition(self, experiment_id: str) -> Definition:
        if not valid_experiment_id(experiment_id):
            raise NotFound("no experiment with this id")
        raw = await self._store.read_definition(experiment_id)
        if raw is None:
            self._forget(experiment_id)
            raise NotFound("no experiment with this id")
        return _parse_definition(*raw)

    def _validate_spec(self, spec: ExperimentSpec) -> PolicyConfig:
        s = self._settings
        if not valid_experiment_id(spec.id):
            raise InvalidInput(
                "experiment id must be 1-64 characters of A-Z a-z 0-9 _ . -, not . or ..")
        if spec.setting not in SETTINGS:
            raise InvalidInput(f"setting must be one of {', '.join(SETTINGS)}")
        if spec.policy not in POLICIES:
            raise InvalidInput(f"policy must be one of {', '.join(POLICIES)}")
        if not 1 <= spec.dim <= s.max_dim:
            raise InvalidInput(f"dim must be between 1 and {s.max_dim}")
        if not 1 <= len(spec.arms) <= s.max_arms:
            raise InvalidInput(f"give between 1 and {s.max_arms} arms")
        if not 1 <= spec.reward_window_seconds <= s.max_reward_window_seconds:
            raise InvalidInput(
                f"reward_window_seconds must be between 1 and {s.max_reward_window_seconds}"
            )
        if spec.max_stale_rewards < 0:
            raise InvalidInput("max_stale_rewards must be 0 or more")
        if spec.default_reward is not None:
            _check_vector([spec.default_reward], s.feature_bound, "default_reward")
        if spec.log_max_entries < 0 or spec.log_max_age_seconds < 1:
            raise InvalidInput("log_max_entries must be 0 or more and log_max_age_seconds "
                               "1 or more")
        if spec.log_all_contexts and (spec.setting != "contextual" or spec.log_max_entries == 0):
            raise InvalidInput("log_all_contexts needs the contextual setting and a decision "
                               "log (log_max_entries above 0): elsewhere the log has every "
                               "context already")
        self._validate_arms(spec.setting, spec.dim, spec.arms)
        try:
            check_hyperparameters(spec.policy, spec.hyperparameters)
            return paper_config(spec.policy, spec.setting, spec.dim, **spec.hyperparameters)
        except (ValueError, TypeError) as exc:
            raise InvalidInput(f"invalid hyperparameters: {exc}") from None

    def _validate_arms(self, setting: str, dim: int, arms: Sequence[ArmSpec]) -> None:
        ids = [a.id for a in arms]
        if not all(valid_arm_id(i) for i in ids):
            raise InvalidInput("arm ids must be 1-64 characters of A-Z a-z 0-9 _ . : -")
        if len(set(ids)) != len(ids):
            raise InvalidInput("arm ids must be distinct")
        for arm in arms:
            if setting == "stochastic":
                if arm.features is None or len(arm.features) != dim:
                    raise InvalidInput(
                        f"in the stochastic setting every arm needs {dim} features"
                    )
                _check_vector(arm.features, self._settings.feature_bound, "arm features")
            elif arm.features is not None:
                raise InvalidInput(
                    "arm features are fixed only in the stochastic setting; "
                    "send contexts with /choose instead"
                )


_REWARD_MESSAGES: dict[RewardStatus, str] = {
    "applied": "reward applied",
    "duplicate": "this reward was already applied; not applied again",
    "conflict": "a different reward was already applied to this decision",
    "late": "the decision's reward window has ended: its default reward counts instead; "
            "not applied",
    "not_found": "no pending decision with this id in this experiment (unknown or expired)",
}


def _status(text: str) -> RewardStatus:
    for status in _REWARD_MESSAGES:
        if status == text:
            return status
    raise RuntimeError(f"unexpected reward script result {text!r}")


# What PATCH /experiments/{id} may change: nothing that changes what the statistics
# mean (the model, its prior and its sums), only how decisions are made and kept.
LIVE_SETTINGS = ("epsilon", "reward_window_seconds", "default_reward", "max_stale_rewards",
                 "log_max_entries", "log_max_age_seconds")


def _one_of(key_hash: str, known: Sequence[str | None]) -> bool:
    """``key_hash`` is one of the ``known`` hashes (None: no such key), compared in
    constant time."""
    return any(hmac.compare_digest(key_hash, k) for k in known if k is not None)


def _fold_due(counter: int, recorded: int) -> bool:
    """The ``recorded`` outcomes took the counter past a multiple of FOLD_EVERY."""
    return counter // FOLD_EVERY > (counter - recorded) // FOLD_EVERY


def _check_vector(values: Sequence[float], bound: float, what: str) -> None:
    if not all(math.isfinite(v) and abs(v) <= bound for v in values):
        raise InvalidInput(f"{what} must be finite numbers with |value| <= {bound:g}")


def _candidates(
    definition: Definition, request: ChooseRequest, bound: float
) -> tuple[list[ArmRecord], np.ndarray]:
    """The arms that may be chosen and their contexts, shape (K', d); validates."""
    spec = definition.spec
    by_id = definition.by_id
    named = list(request.eligible or ()) + list(request.excluded)
    if request.arm_contexts:
        named += list(request.arm_contexts)
    if any(arm_id not in by_id for arm_id in named):
        raise UnknownArm("the request names an arm this experiment does not have")
    if request.eligible is not None:
        pool = [by_id[i] for i in dict.fromkeys(request.eligible)]
        if any(not a.active for a in pool):
            raise InvalidInput("eligible names a retired arm")
    elif spec.setting == "contextual" and request.arm_contexts:
        # A retired arm's context is ignored: clients may send it until they learn of
        # the retirement (no coordinated deploy needed).
        pool = [by_id[i] for i in request.arm_contexts if by_id[i].active]
    else:
        pool = definition.active_arms
    excluded = set(request.excluded)
    arms = pool
    if excluded or pool is not definition.active_arms:
        arms = sorted((a for a in pool if a.id not in excluded), key=lambda a: a.index)
    if not arms:
        raise InvalidInput("no arm is eligible after eligible/excluded are applied")
    if definition.features is not None:
        if request.context is not None or request.arm_contexts:
            raise InvalidInput("a stochastic experiment uses its arms' fixed features; "
                               "send no context")
        if arms is definition.active_arms:
            return arms, definition.active_features
        return arms, definition.features[[a.index for a in arms]]
    return arms, _contexts(spec, arms, request, bound)


def _contexts(
    spec: ExperimentSpec, arms: list[ArmRecord], request: ChooseRequest, bound: float
) -> np.ndarray:
    d = spec.dim
    if spec.setting == "covariates":
        if request.arm_contexts:
            raise InvalidInput("a covariates experiment takes one 'context', not arm_contexts")
        if request.context is None:
            raise InvalidInput(f"this experiment needs 'context': {d} numbers")
        if len(request.context) != d:
            raise InvalidInput(f"context must have exactly {d} numbers")
        _check_vector(request.context, bound, "context")
        return np.tile(np.asarray(request.context, dtype=np.float64), (len(arms), 1))
    if request.context is not None:
        raise InvalidInput("a contextual experiment takes 'arm_contexts', one per arm")
    given = request.arm_contexts or {}
    missing = [a.id for a in arms if a.id not in given]
    if missing:
        raise InvalidInput(f"arm_contexts is missing {len(missing)} eligible arm(s)")
    rows = [given[a.id] for a in arms]
    if any(len(r) != d for r in rows):
        raise InvalidInput(f"every arm context must have exactly {d} numbers")
    for r in rows:
        _check_vector(r, bound, "arm contexts")
    return np.array(rows, dtype=np.float64)


def _state_for(
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
    fold_into(config, state, _arm_positions(arms), unfolded)
    return state


def _arm_positions(arms: Sequence[ArmRecord]) -> dict[str, int]:
    """Each arm's stats field, to its position in the state's arm axis."""
    return {keys.arm_field(a.id): k for k, a in enumerate(arms)}


def _decision_rng(seed: int | None, number: int) -> np.random.Generator:
    """Seeded experiments: decision n always draws from the same stream."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng(np.random.SeedSequence([seed, number]))


def _field_names(shared: bool, arm_id: str) -> dict[str, str]:
    """The stats fields a reward of ``arm_id`` adds to (kept with each decision)."""
    return {
        "model_field": keys.model_field(None if shared else arm_id),
        "arm_field": keys.arm_field(arm_id),
    }


def _stored_format(config: PolicyConfig) -> dict[str, str]:
    """Meta fields that say how the experiment's statistics are stored: the recipes of
    its sums (``service.codec``) and the bytes of a context, which reward.lua and
    settle.lua check a decision's against before recording its outcome."""
    return {"model_recipe": stored_recipe(config, "model"),
            "arm_recipe": stored_recipe(config, "arm"),
            "context_bytes": str(8 * config.dim)}


def _decisions_behind(config: PolicyConfig, stored: Mapping[str, str | None]) -> bool:
    """Whether an experiment's pending decisions may lack their stats field names: stored
    by a version before today's recipes (one that differs only in not recording outcomes,
    the ``RECORDED`` suffix, wrote them)."""
    axes: tuple[Axis, ...] = ("model", "arm")
    return any((stored.get(f"{axis}_recipe") or "").removesuffix(RECORDED) != recipe(config, axis)
               for axis in axes)


def _upgraded_stats(
    config: PolicyConfig, stats: dict[str, bytes], stored: Mapping[str, str | None]
) -> dict[str, bytes]:
    """The statistics' blobs in the current format (counters unchanged).

    ``stored`` holds the recipes the blobs were written under (None: the
    first version's, which stored none).
    """
    axes: tuple[Axis, ...] = ("model", "arm")
    recipes = {axis: (stored.get(f"{axis}_recipe") or legacy_recipe(config, axis))
               .removesuffix(RECORDED) for axis in axes}
    out = {}
    for name, blob in stats.items():
        if name == keys.SHARED_MODEL_FIELD or name.startswith("model:"):
            out[name] = upgrade_blob(config, "model", blob, recipes["model"])
        elif name.startswith("arm:"):
            out[name] = upgrade_blob(config, "arm", blob, recipes["arm"])
    return out


def _decision_record(view: View, arm: ArmRecord, x: bytes, propensity: float | None) -> bytes:
    """The pending decision's record after what decide.lua puts in front of it (incarnation,
    number, deadline; the format is in ``outcomes.lua``): what reward.lua needs (the stats
    fields and ``x``, the context, packed) and the state the decision was made from."""
    names = _field_names(view.definition.config.shared, arm.id)
    text = (names["model_field"], names["arm_field"], arm.id, str(view.version),
            str(view.rewards), repr(time.time()), _text_of(propensity))
    return "\n".join(text).encode() + b"\n" + x


def _text_of(propensity: float | None) -> str:
    """A propensity as the records and the log keep it: '' for none."""
    return "" if propensity is None else repr(propensity)


def _log_entry_size(definition: Definition) -> Callable[[Mapping[str, bytes]], int]:
    """About how many bytes of JSON an entry of this experiment's log takes: its packed
    fields (:func:`service.store.log_entry_json_bytes`) and its eligible arms, stored as
    index ranges and written as the arms' ids (quoted, with a comma)."""
    ids = [len(a.id) for a in definition.arms]
    each = (sum(ids) / len(ids) if ids else 0.0) + 3.0

    def size(fields: Mapping[str, bytes]) -> int:
        listed = _ranges_count(fields.get("eligible", b"").decode())
        return log_entry_json_bytes(fields) + int(listed * each)

    return size


def _ranges_count(text: str) -> int:
    """How many indexes ``index_ranges`` text ("0-4,7,9-12") holds, without listing them."""
    total = 0
    for part in filter(None, text.split(",")):
        start, _, end = part.partition("-")
        total += int(end) - int(start) + 1 if end else 1
    return total


def _valid_entry_id(text: str) -> bool:
    """A Redis stream entry id: two unsigned 64-bit integers, "<ms>-<seq>"."""
    ms, _, seq = text.partition("-")
    return all(part.isdigit() and part.isascii() and int(part) < 2**64 for part in (ms, seq))


def _last_entry_id(text: str) -> bool:
    """The largest entry id there is: nothing can follow it."""
    ms, _, seq = text.partition("-")
    return int(ms) == int(seq) == 2**64 - 1


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


def _log_entry_fields(
    decision_id: str, arms: Sequence[ArmRecord], arm: ArmRecord, x: bytes, view: View,
    propensity: float | None, contexts: np.ndarray | None = None,
) -> dict[str, str | bytes]:
    """The decision's entry in the decision log (decide.lua adds its number): the chosen
    ``arm`` and its context, the arms it was chosen from (and, given, their
    ``contexts``), the statistics it was made from, and its propensity (no field when
    the experiment computes none: the entry says so as an older version's does)."""
    definition = view.definition
    eligible = (definition.active_ranges if arms is definition.active_arms
                else index_ranges([a.index for a in arms]))
    every = {} if contexts is None else {
        "contexts": np.ascontiguousarray(contexts, dtype="<f8").tobytes()}
    return {"type": "decision", "id": decision_id, "arm": arm.id, "x": x,
            "version": str(view.version), "rewards_seen": str(view.rewards),
            "eligible": eligible, **every,
            **({} if propensity is None else {"propensity": repr(propensity)})}


_OUTCOMES: dict[str, LogEntryType] = {"reward": "reward", "default": "default", "late": "late"}


def _log_entry(definition: Definition, entry_id: str, fields: dict[str, bytes]) -> LogEntry:
    """A decision-log entry as decide.lua, reward.lua, settle.lua or settings.lua wrote it."""
    text = {k: v.decode() for k, v in fields.items() if k not in ("x", "contexts")}
    time_ms = int(entry_id.split("-", 1)[0])
    kind = text["type"]
    if kind == "settings":
        return LogEntry(entry_id, time_ms / 1000, "settings", "",
                        changes=json.loads(text["changes"]))
    if kind != "decision":
        return LogEntry(entry_id, time_ms / 1000, _OUTCOMES[kind], text["id"],
                        reward=float(text["reward"]))
    arms = definition.arms
    return LogEntry(
        entry_id, time_ms / 1000, "decision", text["id"],
        number=int(text["number"]),
        arm_id=text["arm"],
        context=tuple(np.frombuffer(fields["x"], dtype="<f8").tolist()),
        eligible=tuple(arms[i].id for i in parse_index_ranges(text["eligible"])),
        contexts=(tuple(map(tuple, np.frombuffer(fields["contexts"], dtype="<f8").reshape(
            -1, definition.spec.dim).tolist())) if "contexts" in fields else None),
        propensity=float(text["propensity"]) if text.get("propensity") else None,
        version=int(text["version"]) if text["version"] else None,
        rewards_seen=int(text["rewards_seen"]) if text["rewards_seen"] else None,
    )


def _answer(arm_id: str, choice: Choice, propensity: float | None) -> str:
    """What a retry of an idempotent decision gets back (decide.lua's ARGV[13])."""
    score = float(choice.scores[0, int(choice.arms[0])])
    return "\n".join((arm_id, _text_of(propensity), "" if math.isinf(score) else repr(score)))


def _repeated(definition: Definition, decision_id: str, number: int, answer: str) -> Decision:
    """The decision an earlier request under ``decision_id`` got (:func:`_answer`)."""
    arm_id, propensity, index = answer.split("\n")
    return Decision(decision_id=decision_id, arm_id=arm_id,
                    index=float(index) if index else None, exploring=not index,
                    decision_number=number,
                    expires_in_seconds=definition.spec.reward_window_seconds,
                    propensity=float(propensity) if propensity else None)


def _decision(
    definition: Definition, decision_id: str, arm: ArmRecord, choice: Choice, number: int,
    propensity: float | None,
) -> Decision:
    score = float(choice.scores[0, int(choice.arms[0])])
    exploring = math.isinf(score)
    return Decision(
        decision_id=decision_id,
        arm_id=arm.id,
        index=None if exploring else score,
        exploring=exploring,
        decision_number=number,
        expires_in_seconds=definition.spec.reward_window_seconds,
        propensity=propensity,
    )


def _spec_to_json(spec: ExperimentSpec) -> dict[str, object]:
    data = dataclasses.asdict(spec)
    data.pop("arms")
    if spec.propensities:  # the default, left out: a worker of the version before reads it
        data.pop("propensities")
    return data


def _parse_definition(meta: dict[str, str], arms_raw: dict[str, str]) -> Definition:
    spec_data = json.loads(meta["spec"])
    config = stored_config(json.loads(meta["config"]))
    arms = []
    for arm_id, text in arms_raw.items():
        data = json.loads(text)
        features = tuple(data["features"]) if data.get("features") is not None else None
        arms.append(ArmRecord(arm_id, int(data["index"]), bool(data["active"]), features))
    arms.sort(key=lambda a: a.index)
    spec = ExperimentSpec(
        arms=tuple(ArmSpec(a.id, a.features) for a in arms), **spec_data
    )
    return Definition(
        spec=spec,
        config=config,
        key_hash=meta["key_hash"],
        previous_key_hash=meta.get("key_hash_old"),
        incarnation=meta["incarnation"],
        created_at=float(meta["created_at"]),
        version=int(meta["version"]),
        arms=tuple(arms),
        features=(
            np.array([a.features for a in arms], dtype=np.float64)
            if spec.setting == "stochastic" else None
        ),
    )


def _view(
    definition: Definition, stats: dict[str, bytes], unfolded: Sequence[bytes]
) -> ExperimentView:
    config = definition.config
    state = discounted(config, _state_for(config, list(definition.arms), stats, unfolded))
    arm_fields = [name for name, spec in layout(config).items() if spec.axis == "arm"]
    thetas = [ridge(xtx, xty, config.reg).tolist()
              for xtx, xty in zip(state["xtx"][0], state["xty"][0], strict=True)]
    theta = ({"shared": thetas[0]} if config.shared
             else {arm.id: thetas[k] for k, arm in enumerate(definition.arms)})
    arm_states = [
        _arm_state(arm, {name: state[name][0, k] for name in arm_fields},
                   thetas[0 if config.shared else k])
        for k, arm in enumerate(definition.arms)
    ]
    return ExperimentView(
        spec=definition.spec,
        config=dataclasses.asdict(config),
        created_at=definition.created_at,
        arms=tuple(arm_states),
        theta_hat=theta,
        decisions=int(stats.get(keys.DECISIONS, b"0")),
        rewards=int(stats.get(keys.REWARDS, b"0")),
        duplicates=int(stats.get(keys.DUPLICATES, b"0")),
        defaulted=int(stats.get(keys.DEFAULTED, b"0")),
        late=int(stats.get(keys.LATE, b"0")),
        defaults_missed=int(stats.get(keys.DEFAULTS_MISSED, b"0")),
        previous_key_valid=definition.previous_key_hash is not None,
    )


def _arm_state(arm: ArmRecord, sums: dict[str, np.ndarray], theta: list[float]) -> ArmState:
    """An arm's counters and estimates; with forgetting, ``pulls`` counts its outcomes
    undiscounted and ``weight`` is their discounted sum, which the estimates use."""
    pulls = float(sums["pulls"])
    count = int(sums["total_pulls"]) if "total_pulls" in sums else int(pulls)
    weight = pulls if "total_pulls" in sums else None
    if pulls == 0:
        return ArmState(arm.id, arm.active, count, None, None, arm.features, weight)
    shift, total, squares = float(sums["shift_r"]), float(sums["sum_dr"]), float(sums["sum_dr2"])
    mean_deviation = total / pulls
    # RSS about the model's prediction where the arm has one fixed feature vector
    # (stochastic, as in Section 3.3), else about the arm's mean reward; both
    # about the arm's first reward (policies.state), so no digit is lost.
    centre = (float(np.dot(arm.features, theta)) - shift if arm.features is not None
              else mean_deviation)
    rss = squares - 2 * centre * total + pulls * centre**2
    return ArmState(arm.id, arm.active, count, shift + mean_deviation, max(rss, 0.0),
                    arm.features, weight)
