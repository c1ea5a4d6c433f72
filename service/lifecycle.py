"""Room 3: the experiment lifecycle: create, read, list, delete; arms, keys and live
settings; validation; the start-up upgrade of experiments stored by earlier versions."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import functools
import hmac
import itertools
import json
import math
import secrets
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence

import numpy as np

from policies import (
    POLICIES,
    SETTINGS,
    PolicyConfig,
    check_hyperparameters,
    discounted,
    layout,
    paper_config,
)
from policies.config import stored_config
from policies.ridge import ridge
from policies.state import Axis, merge_sums
from service import keys, shards
from service.codec import RECORDED, legacy_recipe, recipe, stored_recipe, upgrade_blob
from service.definition import (
    ArmRecord,
    Definition,
    IdempotencyKey,
    check_vector,
    field_names,
    hash_key,
    parse_definition,
    reward_text,
    spec_to_json,
    state_for,
)
from service.domain import (
    MAX_RANKED,
    RECENT_MINUTES,
    ArmSpec,
    ArmState,
    ExperimentSpec,
    ExperimentView,
    Minute,
    valid_arm_id,
    valid_experiment_id,
    with_service_defaults,
)
from service.errors import Conflict, InvalidInput, NotFound, StoreUnavailable
from service.store import Snapshot
from service.views import Room

# A settings change races a decision's redefinition at most twice in a row; a third
# time means the experiment keeps changing.
_ATTEMPTS = 3
# Experiments a listing reads at once: each reads its members at once too, so that
# LIST_READS x shards.MAX_SHARDS stays well within the store's pool (256 connections).
LIST_READS = 8


class Lifecycle(Room):
    """Create, read, change and delete experiments."""

    async def create(self, spec: ExperimentSpec, idempotency: IdempotencyKey | None = None
                     ) -> tuple[ExperimentView, str]:
        """The experiment, made, and its API key (kept only as its hash). Under an
        ``idempotency`` key, the same request sent again after it was made answers the
        same key and the experiment as it is now (:meth:`_made_before`)."""
        spec = with_service_defaults(spec)
        config = self._validate_spec(spec)
        spec_text = json.dumps(spec_to_json(spec))
        incarnation = secrets.token_hex(8)
        api_key = (secrets.token_urlsafe(32) if idempotency is None
                   else idempotency.api_key("experiment", spec.id, incarnation, spec_text))
        meta = {
            "spec": spec_text,
            "config": json.dumps(dataclasses.asdict(config)),
            "key_hash": hash_key(api_key),
            "incarnation": incarnation,
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
               else {"default_reward": reward_text(spec.default_reward)}),
            **({} if spec.log_max_entries == 0
               else {"log_max_entries": str(shards.log_share(spec.log_max_entries,
                                                             spec.shards)),
                     "log_max_age_seconds": str(spec.log_max_age_seconds)}),
            # How much a ranking's slot's reward counts (outcomes.lua).
            **({} if spec.position_weights is None
               else {"position_weights": ",".join(map(repr, spec.position_weights))}),
        }
        arms = {
            a.id: json.dumps({"index": i, "active": True, "features": a.features})
            for i, a in enumerate(spec.arms)
        }
        try:
            strays = await self._store.existing(shards.members(spec.id, shards.MAX_SHARDS)[1:])
            if spec.shards == 1 and not strays:  # one key space, made by one script
                if not await self._store.create(spec.id, meta, arms,
                                                default_reward=spec.default_reward is not None):
                    raise Conflict("an experiment with this id already exists")
            elif idempotency is not None and await self._store.key_hash(spec.id) is not None:
                raise Conflict("an experiment with this id already exists")  # no claim needed
            else:
                async with self._claimed(spec.id):
                    await self._create_members(spec, meta, arms)
        except Conflict:
            if idempotency is None:
                raise
            return await self._made_before(spec.id, spec_text, idempotency)
        # From what was written, not read back: a read that failed now (Redis
        # just out of memory, say) would leave the experiment without its key.
        definition = parse_definition(meta, arms)
        return _view(definition, [Snapshot(0, 0, {}, (), definition.incarnation)]), api_key

    async def _made_before(self, experiment_id: str, spec_text: str,
                           idempotency: IdempotencyKey) -> tuple[ExperimentView, str]:
        """The experiment and its key, if a creation under ``idempotency`` made it with
        the same definition and admin token within ``idempotency_seconds``, and its key
        is still the one that creation gave (not rotated since); else 409."""
        try:
            definition = await self.views.definition(experiment_id)
            api_key = idempotency.api_key("experiment", experiment_id, definition.incarnation,
                                          spec_text)
            if (self._recent(definition.created_at)
                    and hmac.compare_digest(hash_key(api_key), definition.key_hash)):
                return await self.get(experiment_id), api_key
        except NotFound:  # deleted meanwhile: nothing to answer again
            pass
        raise Conflict("an experiment with this id already exists (not made by a request "
                       "with this Idempotency-Key, body and admin token in the last "
                       f"{self._settings.idempotency_seconds} s, or its key was rotated "
                       "since)")

    @contextlib.asynccontextmanager
    async def _claimed(self, experiment_id: str) -> AsyncIterator[None]:
        """One creation or deletion of an id at a time (a claim on the home's slot), so
        that the members of a sharded experiment are made or removed whole."""
        token = await self._store.claim(experiment_id)
        if token is None:
            raise StoreUnavailable("an experiment with this id is being created or deleted; "
                                   "retry")
        try:
            yield
        finally:
            with contextlib.suppress(StoreUnavailable):  # else it expires in a minute
                await self._store.release(experiment_id, token)

    async def _create_members(self, spec: ExperimentSpec, meta: Mapping[str, str],
                              arms: Mapping[str, str]) -> None:
        """The members, the home last: once it exists, every member does. A member found
        while there is no home is one nobody can use (of an experiment whose deletion
        stopped halfway, or a creation that did): it goes first, whatever this one's
        shard count."""
        exists = Conflict("an experiment with this id already exists")
        if await self._store.key_hash(spec.id) is not None:
            raise exists
        for member_id in await self._store.existing(
                shards.members(spec.id, shards.MAX_SHARDS)[1:]):
            await self._store.delete(member_id)
        for shard in reversed(range(spec.shards)):
            if not await self._store.create(
                    shards.member(spec.id, shard), {**meta, **shards.numbering(shard, spec.shards)},
                    arms, default_reward=spec.default_reward is not None, listed=shard == 0):
                # The home, made meanwhile by an unsharded creation (which takes no claim):
                # the members made here are nobody's.
                for member_id in shards.members(spec.id, spec.shards)[1:]:
                    await self._store.delete(member_id)
                raise exists

    async def get(self, experiment_id: str) -> ExperimentView:
        if not valid_experiment_id(experiment_id):
            raise NotFound("no experiment with this id")
        read = await self._store.read_experiment(experiment_id)
        if read is None:
            raise NotFound("no experiment with this id")
        meta, arms, snapshot = read
        definition = parse_definition(meta, arms)
        others = await asyncio.gather(*(
            self._store.read_snapshot(member_id)
            for member_id in shards.members(experiment_id, definition.spec.shards)[1:]))
        if any(other is None for other in others):  # being deleted
            raise NotFound("no experiment with this id")
        return _view(definition, [snapshot, *(o for o in others if o is not None)])

    async def list(
        self, limit: int = 100, after: str | None = None
    ) -> tuple[builtins.list[ExperimentView], str | None]:
        """Up to ``limit`` experiments in id order, after ``after``; and the id to go on from.

        The second value is None on the last page.
        """
        ids = [i for i in await self._store.list_ids() if after is None or i > after]
        views = []
        # A page's views read LIST_READS at a time: a round trip each, overlapped.
        for start in range(0, min(limit, len(ids)), LIST_READS):
            chunk = ids[start:min(start + LIST_READS, limit)]
            read = await asyncio.gather(*map(self._listed, chunk))
            views += [view for view in read if view is not None]
        more = len(ids) > limit
        return views, (ids[limit - 1] if more else None)

    async def _listed(self, experiment_id: str) -> ExperimentView | None:
        """The experiment's view; None, and its id off the list, if it is gone."""
        try:
            return await self.get(experiment_id)
        except NotFound:
            await self._store.forget_id(experiment_id)
            return None

    async def delete(self, experiment_id: str) -> None:
        """Delete the experiment: the home first, so that it is gone at once, then its
        other members (a deletion that stops halfway leaves members nobody can use;
        a creation under the same id replaces them)."""
        if not valid_experiment_id(experiment_id):
            raise NotFound("no experiment with this id")
        raw = await self._store.read_definition(experiment_id)
        if raw is not None and _count_or_one(raw[0]) == 1:  # one key space, one script
            self.views.forget(experiment_id)
            if not await self._store.delete(experiment_id):
                raise NotFound("no experiment with this id")
            return
        async with self._claimed(experiment_id):
            raw = await self._store.read_definition(experiment_id)
            count = _count_or_one(raw[0]) if raw is not None else shards.MAX_SHARDS
            # Without a home, the members a deletion that stopped halfway left, if any.
            member_ids = (shards.members(experiment_id, count) if raw is not None
                          else [experiment_id, *await self._store.existing(
                              shards.members(experiment_id, count)[1:])])
            for member_id in member_ids:
                self.views.forget(member_id)
            removed = await self._store.delete(experiment_id)
            for member_id in member_ids[1:]:
                await self._store.delete(member_id)
        if not removed:
            raise NotFound("no experiment with this id")

    async def _change_definition(
        self, definition: Definition, change: Callable[[str], Awaitable[int]]
    ) -> int:
        """Make a change of the definition (its result: positive when made) on the
        experiment, and for a sharded one copy it to the other members
        (:func:`service.shards.sync_members`)."""
        result = await change(definition.spec.id)
        member_ids = shards.members(definition.spec.id, definition.spec.shards)
        if result > 0 and len(member_ids) > 1:
            await shards.sync_members(self._store, definition.spec.id)
        for member_id in member_ids:
            self.views.forget(member_id)
        return result

    async def add_arms(self, experiment_id: str, arms: Sequence[ArmSpec],
                       idempotency: IdempotencyKey | None = None) -> ExperimentView:
        """Add active arms. Under an ``idempotency`` key each record keeps its marker, and
        arms that are all there already, added under that key, active and as asked, are
        this addition made before: answered, not refused."""
        definition = await self.views.definition(experiment_id)
        self._validate_arms(definition.spec.setting, definition.spec.dim, arms)
        marker = None if idempotency is None else idempotency.marker()
        if marker is not None and _added_before(definition, arms, marker):
            return await self.get(experiment_id)
        too_many = InvalidInput(f"an experiment may have at most {self._settings.max_arms} arms")
        if len(definition.arms) + len(arms) > self._settings.max_arms:
            raise too_many
        records = {a.id: json.dumps({"active": True, "features": a.features,
                                     **({} if marker is None else {"added": marker})})
                   for a in arms}
        result = await self._change_definition(definition, functools.partial(
            self._store.add_arms, arms=records, max_arms=self._settings.max_arms))
        if result == 0:
            raise NotFound("no experiment with this id")
        if result < 0 and marker is not None and _added_before(
                await self.views.definition(experiment_id), arms, marker):
            return await self.get(experiment_id)  # this addition, made meanwhile
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
        definition = await self.views.definition(experiment_id)
        self._changed(definition, changes)  # refused before any member changes
        if not await self._change_definition(definition, functools.partial(self._update_home,
                                                                    changes=changes)):
            raise NotFound("no experiment with this id")
        return await self.get(experiment_id)

    async def _update_home(self, experiment_id: str, changes: Mapping[str, object]) -> int:
        """The settings of the experiment (its home, sharded) changed: its new version,
        0 if it is gone."""
        for _ in range(_ATTEMPTS):
            definition = await self.views.definition(experiment_id)
            spec, config = self._changed(definition, changes)
            version = await self._store.update_settings(
                experiment_id, definition.version, json.dumps(spec_to_json(spec)),
                json.dumps(dataclasses.asdict(config)),
                None if spec.default_reward is None else reward_text(spec.default_reward),
                shards.log_share(spec.log_max_entries, spec.shards), spec.log_max_age_seconds,
                json.dumps(dict(changes), sort_keys=True))
            if version >= 0:
                return version
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
            check_vector([float(changes["default_reward"])],  # type: ignore[arg-type]
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

    async def rotate_key(self, experiment_id: str,
                         idempotency: IdempotencyKey | None = None) -> str:
        """A new API key for the experiment, shown once; the current one stays valid as
        its previous key until :meth:`revoke_previous_key` (one key before it is no
        longer valid: an experiment takes two at most). Made only if the current key is
        still the one read first (409 if another rotation came between).

        Under an ``idempotency`` key the new key is made from it and a nonce the
        rotation stores: sent again while the key it made is current, the rotation
        answers that key (within ``idempotency_seconds``; later, 409) and changes
        nothing."""
        definition = await self.views.definition(experiment_id)
        made = self._rotated_under(definition, idempotency)
        if made is not None:
            return made
        nonce = secrets.token_hex(8)
        api_key = (secrets.token_urlsafe(32) if idempotency is None
                   else idempotency.api_key("rotation", experiment_id, nonce))

        async def rotate(member_id: str) -> int:
            return await self._store.rotate_key(member_id, hash_key(api_key),
                                                definition.key_hash, nonce)

        result = await self._change_definition(definition, rotate)
        if result == 0:
            raise NotFound("no experiment with this id")
        if result < 0:
            # Overtaken: by another attempt of this rotation (sent again while it ran)?
            made = self._rotated_under(await self.views.definition(experiment_id),
                                       idempotency)
            if made is not None:
                return made
            raise Conflict("the key was rotated by another request meanwhile: look at the "
                           "experiment, and rotate again if you still mean to")
        return api_key

    def _rotated_under(self, definition: Definition,
                       idempotency: IdempotencyKey | None) -> str | None:
        """The current key, if the last rotation made it under ``idempotency`` within
        ``idempotency_seconds``; None if not under it. Made under it but longer ago: 409,
        as rotating again would revoke the key the clients may still use (the one the
        lost reply's key replaced), and the key is no longer shown again."""
        if idempotency is None or definition.key_nonce is None:
            return None
        made = idempotency.api_key("rotation", definition.spec.id, definition.key_nonce)
        if not hmac.compare_digest(hash_key(made), definition.key_hash):
            return None
        if not self._recent(definition.key_rotated_at):
            raise Conflict("this rotation was made more than "
                           f"{self._settings.idempotency_seconds} s ago "
                           "(LINREBOOT_IDEMPOTENCY_SECONDS): its key is not shown again; "
                           "rotate under a new Idempotency-Key")
        return made

    def _recent(self, made_at: float | None) -> bool:
        """A change made at ``made_at`` may be answered again as made: unix seconds, by
        the clock of the worker that made it, which may be ahead of this one's."""
        return made_at is not None and \
            abs(time.time() - made_at) <= self._settings.idempotency_seconds

    async def revoke_previous_key(self, experiment_id: str) -> bool:
        """Revoke the key a rotation kept valid; False if there was none. Takes effect at
        once: every decision and reward script reads the keys."""
        definition = await self.views.definition(experiment_id)
        result = await self._change_definition(definition, self._store.revoke_previous_key)
        if result == 0:
            raise NotFound("no experiment with this id")
        return result == 1

    async def retire_arms(self, experiment_id: str, arm_ids: Sequence[str]) -> ExperimentView:
        definition = await self.views.definition(experiment_id)
        if not arm_ids or len(set(arm_ids)) != len(arm_ids):
            raise InvalidInput("give one or more distinct arm ids to retire")
        every = InvalidInput("cannot retire every active arm")
        if not {a.id for a in definition.active_arms} - set(arm_ids):
            raise every
        result = await self._change_definition(definition, functools.partial(
            self._store.retire_arms, arm_ids=arm_ids))
        if result == 0:
            raise NotFound("no experiment with this id")
        if result == -2:  # the others retired by another request meanwhile
            raise every
        if result < 0:
            raise NotFound("unknown arm id")
        return await self.get(experiment_id)

    async def upgrade_stored(self) -> tuple[builtins.list[str], builtins.list[str]]:
        """Experiments written by an earlier version, brought up to date.

        Earlier versions stored no recipes (or the recipe of whole Gram
        matrices), pending decisions without field names, and Gram matrices
        whole. Each worker runs this at start-up; the store makes it happen
        once. Returns the experiments upgraded, and "id: reason" for each that
        could not be (it answers 5xx until it is fixed or deleted; it does not
        stop the service).
        """
        upgraded, failures = [], []
        for experiment_id in await self._store.list_ids():
            raw = await self._store.read_definition(experiment_id)
            if raw is None:
                continue
            try:
                config = stored_config(json.loads(raw[0]["config"]))
                count = int(json.loads(raw[0]["spec"]).get("shards", 1))
                changed = [await self._store.upgrade(
                    member_id,
                    _stored_format(config),
                    functools.partial(_upgraded_stats, config),
                    functools.partial(field_names, config.shared),
                    functools.partial(_decisions_behind, config),
                ) for member_id in shards.members(experiment_id, count)]
                if any(changed):
                    upgraded.append(experiment_id)
            except (ValueError, TypeError, KeyError, RuntimeError) as exc:
                failures.append(f"{experiment_id}: {exc}")
        return upgraded, failures

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
            check_vector([spec.default_reward], s.feature_bound, "default_reward")
        if spec.log_max_entries < 0 or spec.log_max_age_seconds < 1:
            raise InvalidInput("log_max_entries must be 0 or more and log_max_age_seconds "
                               "1 or more")
        if spec.log_all_contexts and (spec.setting != "contextual" or spec.log_max_entries == 0):
            raise InvalidInput("log_all_contexts needs the contextual setting and a decision "
                               "log (log_max_entries above 0): elsewhere the log has every "
                               "context already")
        _validate_position_weights(spec.position_weights)
        self._validate_arms(spec.setting, spec.dim, spec.arms)
        try:
            check_hyperparameters(spec.policy, spec.hyperparameters)
            config = paper_config(spec.policy, spec.setting, spec.dim, **spec.hyperparameters)
        except (ValueError, TypeError) as exc:
            raise InvalidInput(f"invalid hyperparameters: {exc}") from None
        shards.check(spec, config)
        return config

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
                check_vector(arm.features, self._settings.feature_bound, "arm features")
            elif arm.features is not None:
                raise InvalidInput(
                    "arm features are fixed only in the stochastic setting; "
                    "send contexts with /choose instead"
                )


def _added_before(definition: Definition, arms: Sequence[ArmSpec], marker: str) -> bool:
    """Every one of ``arms`` is the experiment's, added under ``marker``, active, with the
    same features."""
    there = definition.by_id
    return all(a.id in there and there[a.id].added == marker and there[a.id].active
               and there[a.id].features == a.features for a in arms)


# What PATCH /experiments/{id} may change: nothing that changes what the statistics
# mean (the model, its prior and its sums), only how decisions are made and kept.
LIVE_SETTINGS = ("epsilon", "reward_window_seconds", "default_reward", "max_stale_rewards",
                 "log_max_entries", "log_max_age_seconds")


def _count_or_one(meta: dict[str, str]) -> int:
    """The shard count the meta says; 1 for a damaged spec (its own keys only)."""
    try:
        return shards.count_of(meta)
    except ValueError:
        return 1


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


def _view(definition: Definition, members: Sequence[Snapshot]) -> ExperimentView:
    """The experiment as its members' statistics give it (one unsharded)."""
    config = definition.config
    arms = list(definition.arms)
    parts = [state_for(config, arms, m.stats, m.unfolded) for m in members]
    state = discounted(config, parts[0] if len(parts) == 1 else merge_sums(config, parts))

    def total(counter: str) -> int:
        return sum(int(m.stats.get(counter, b"0")) for m in members)

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
        decisions=total(keys.DECISIONS),
        rewards=total(keys.REWARDS),
        duplicates=total(keys.DUPLICATES),
        defaulted=total(keys.DEFAULTED),
        late=total(keys.LATE),
        defaults_missed=total(keys.DEFAULTS_MISSED),
        previous_key_valid=definition.previous_key_hash is not None,
        recent=recent_minutes([m.stats for m in members], time.time()),
    )


def recent_minutes(members: Sequence[Mapping[str, bytes]], now: float) -> tuple[Minute, ...]:
    """The minutes of the last hour (up to ``now``'s) with activity, oldest first, summed
    over the members' stats hashes (:func:`_member_minutes`; a minute an hour old or
    more, its mark not yet overwritten, is left out)."""
    minutes = [minute for stats in members for minute in _member_minutes(stats)]
    # The minutes are Redis's: by its clock, should it run ahead of this one's (by
    # minutes, not more: a mark far ahead, a clock since set back, would hide the
    # hour until it came round).
    here = int(now // 60)
    newest = max([here, *(minute for minute, _ in minutes if minute <= here + 5)])
    sums: dict[int, list[int]] = {}
    for minute, counts in minutes:
        if minute > newest - RECENT_MINUTES and any(counts):
            total = sums.setdefault(minute, [0, 0, 0])
            for i, count in enumerate(counts):
                total[i] += count
    return tuple(Minute(60 * m, *counts) for m, counts in sorted(sums.items()))


# recent.lua's mark of a minute: the minute, then the counters decisions, rewards and
# defaulted as it began.
_MARK = struct.Struct("<I3d")


def _member_minutes(stats: Mapping[str, bytes]) -> list[tuple[int, tuple[int, int, int]]]:
    """Each marked minute of one stats hash and its counts: the counters of the mark made
    next less its own, the last mark's the counters now. Marks are taken in the
    counters' order (each counter only grows, and every marked call adds to one), which
    is the order they were made in, should Redis's clock step back. A damaged ring
    (a counter not a finite count) is read as none."""
    ring = stats.get(keys.RECENT_MARKS)
    if ring is None or len(ring) != _MARK.size * RECENT_MINUTES:
        return []
    unpacked = [(minute, counters) for minute, *counters in _MARK.iter_unpack(ring) if minute]
    if not all(math.isfinite(c) and c >= 0 for _, counters in unpacked for c in counters):
        return []  # damaged (no script writes such a mark): as if there were none
    marks = sorted((tuple(int(c) for c in counters), minute) for minute, counters in unpacked)
    now = tuple(int(stats.get(name, b"0")) for name in (keys.DECISIONS, keys.REWARDS,
                                                         keys.DEFAULTED))
    ends = [counters for counters, _ in marks[1:]] + [now]
    counted = []
    for (counters, minute), end in zip(marks, ends, strict=True):
        decisions, rewards, defaulted = (max(0, e - c) for e, c in zip(end, counters,
                                                                       strict=True))
        counted.append((minute, (decisions, rewards, defaulted)))
    return counted


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


def _validate_position_weights(weights: tuple[float, ...] | None) -> None:
    """Each slot's weight in (0, 1], the first slot's the largest (clicks on lower slots
    mean less), at most one per slot of the longest ranking."""
    if weights is None:
        return
    if not 1 <= len(weights) <= MAX_RANKED:
        raise InvalidInput(f"position_weights must have 1 to {MAX_RANKED} weights")
    if not all(math.isfinite(w) and 0.0 < w <= 1.0 for w in weights):
        raise InvalidInput("position_weights must be numbers in (0, 1]")
    if any(later > earlier for earlier, later in itertools.pairwise(weights)):
        raise InvalidInput("position_weights must not increase: w_1 >= w_2 >= ...")
