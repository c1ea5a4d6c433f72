"""Room 2: decisions and rewards: choose an arm from a view and record it; apply
rewards exactly once; write the sums back (folds) in the background."""

from __future__ import annotations

import asyncio
import builtins
import functools
import logging
import math
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from policies import Ready, draw
from policies.ranking import rank
from service import shards
from service.definition import (
    WRONG_KEY,
    ArmRecord,
    Definition,
    hash_key,
    index_ranges,
    missing_experiment,
    one_of,
    reward_text,
)
from service.domain import (
    ChooseRequest,
    Decision,
    RankedDecision,
    RewardOutcome,
    RewardStatus,
    valid_experiment_id,
)
from service.errors import Conflict, Forbidden, InvalidInput, NotFound, StoreUnavailable
from service.folding import FOLD_EVERY, FOLD_LIMIT, folded_blobs, held_blobs
from service.settings import Settings
from service.store import DecideReply, Store
from service.views import Room, UnknownArm, View, Views

logger = logging.getLogger("linreboot.service")


# A stale view costs one more attempt; a third means the experiment is being redefined.
_DECIDE_ATTEMPTS = 3
# Shard counts kept for experiments rewarded without a view (all forgotten beyond).
_SHARD_COUNTS_KEPT = 10_000
# Why a member applied no reward of a batch (besides 'shards:<count>'): routed again.
_UNROUTED = frozenset({"missing", "forbidden"})
# How long a decision waits for its worker's rewards in flight (a batch's round trip is
# milliseconds; past this Redis is slow, and waiting longer would add to the deadline).
_REWARDS_WAIT_SECONDS = 0.05
# How long (s) after a decision of an experiment (member) found its view stale, or a probe
# found outcomes it lacked, its decisions read what they lack first (_probed).
_CONTENDED_SECONDS = 1.0
_CONTENDED_MOST = 4096  # experiments (members) remembered so before those over go
# How records and the log keep a context: little-endian doubles.
_PACKED = np.dtype("<f8")


class Decisions(Room):
    """``/choose`` and ``/reward``: decisions from this worker's views, rewards exactly once."""

    def __init__(self, store: Store, settings: Settings, views: Views) -> None:
        super().__init__(store, settings, views)
        self._rng = np.random.default_rng()  # unseeded experiments share one stream
        self._background: set[asyncio.Task[None]] = set()  # folds no request waits for
        self._rewarding: Counter[str] = Counter()  # rewards in flight, by experiment (member)
        # Shard counts of experiments this worker rewards without a view of them.
        self._shard_counts: dict[str, int] = {}
        # Until when (time.monotonic()) decisions of an experiment (member) probe first.
        self._contended: dict[str, float] = {}
        self._contended_most = _CONTENDED_MOST
        self.runs = shards.Runs()  # the members of the ids this worker makes

    async def choose(
        self, experiment_id: str, request: ChooseRequest, api_key: str | None = None
    ) -> Decision:
        """Choose an arm from this worker's view of the statistics, and record it
        (:meth:`_decide`)."""
        decision = await self._decide(experiment_id, request, api_key, _one_arm)
        assert isinstance(decision, Decision)
        return decision

    async def rank(
        self, experiment_id: str, request: ChooseRequest, api_key: str | None = None
    ) -> RankedDecision:
        """Order ``request.slots`` distinct arms (:func:`policies.ranking.rank`) from this
        worker's view, and record each slot as a decision of its own, all at once
        (:meth:`_decide`). The first slot is what :meth:`choose` would have chosen with
        the same random draw (for a seeded experiment, the same decision number)."""
        assert request.slots is not None
        decision = await self._decide(experiment_id, request, api_key, _ranked)
        assert isinstance(decision, RankedDecision)
        return decision

    async def _decide(
        self, experiment_id: str, request: ChooseRequest, api_key: str | None, make: _Maker
    ) -> Decision | RankedDecision:
        """Decide from this worker's view of the statistics (``make``: one arm, or a
        ranking), and record the decision.

        The decision is recorded only if that view is still current, or at most
        the experiment's ``max_stale_rewards`` behind (one round trip then);
        otherwise the store replies with the current statistics, read after
        the request arrived, and the decision is made again from them. So a
        decision reflects every reward acknowledged before its request arrived
        (but the latest ``max_stale_rewards``); rewards that arrive while it is
        being made may or may not count. ``api_key`` is checked before the
        request is (403 first) and again by ``decide.lua``; a missing
        experiment is the same 403 (:func:`service.definition.missing_experiment`).
        None is for trusted in-process callers only (a missing experiment is then 404).
        """
        if not valid_experiment_id(experiment_id):
            raise missing_experiment(api_key)
        key_hash = None if api_key is None else hash_key(api_key)
        view = await self.views.view_for(experiment_id, key_hash)
        step = view.definition.spec.shards  # decision numbers go up by this on a member
        # The caller's id (idempotent), else as random as uuid4().hex. It names the
        # member the decision is recorded on (service.shards).
        decision_id = request.decision_id or (
            secrets.token_hex(16) if step == 1 else self.runs.new_id(experiment_id, step))
        shard = shards.shard_of(decision_id, step)
        member_id = shards.member(experiment_id, shard)
        try:
            return await self._choose(experiment_id, member_id, view, step, decision_id,
                                      request, key_hash, api_key, make)
        except NotFound:  # a member gone (a sharded experiment deleted meanwhile)
            raise missing_experiment(api_key) from None
        except StoreUnavailable:
            if step > 1 and request.decision_id is None:
                self.runs.move_on(experiment_id, shard, step)
            raise

    async def _choose(
        self, experiment_id: str, member_id: str, view: View, step: int, decision_id: str,
        request: ChooseRequest, key_hash: str | None, api_key: str | None, make: _Maker,
    ) -> Decision | RankedDecision:
        """:meth:`_decide` once the member is known: ``view`` is the experiment's, which
        accepted ``key_hash``. The other members' views are read without the key (the
        home holds it; ``decide.lua`` checks it on the member)."""
        member_key = key_hash if member_id == experiment_id else None
        if member_id != experiment_id:
            view = await self.views.view_for(member_id, None)
        rewarding = self._rewarding[member_id]
        if (rewarding and view.behind + rewarding > view.definition.spec.max_stale_rewards
                and await self._store.after_rewards_in_flight(member_id,
                                                              _REWARDS_WAIT_SECONDS)):
            # This worker's rewards were on their way, more than the view may lag: the
            # decision would have gone after them (one batch in flight at a time) and
            # found its view stale. It waited for their replies, which bring their
            # outcomes, and decides from those, rather than prepare, draw and compute a
            # propensity twice. (Fewer it may lag: it decides now, as stale as allowed.)
            view = self.views.get(member_id) or view  # perhaps caught up meanwhile
        probed = self._contended.get(member_id, 0.0) > time.monotonic()
        if probed:  # the read brings this worker's own outcomes too
            view = await self._probed(experiment_id, member_id, view, member_key, api_key)
        else:
            # decide.lua would refuse a decision from a view further behind: catch up
            # first, rather than prepare, draw and compute a propensity twice.
            view = await self.views.current(member_id, view, member_key,
                                            view.definition.spec.max_stale_rewards)
        self._check_routing(experiment_id, member_id, view, step)
        basis = await self.views.merged(experiment_id, view, member_id)
        bound = self._settings.feature_bound
        try:
            candidates = basis.ready(request, bound)
        except UnknownArm:  # perhaps added since this worker read the experiment
            view = await self.views.read_view(member_id, member_key)
            self._check_routing(experiment_id, member_id, view, step)
            basis = await self.views.merged(experiment_id, view, member_id)
            candidates = basis.ready(request, bound)
        synced = False
        seeded = view.definition.spec.seed is not None
        # Probed, the view holds every outcome applied before a read made after the request
        # arrived: whatever is applied since, the decision is as current as it must be.
        seen: tuple[int, int | None] | None = (view.version, None if probed else view.rewards)
        number, reserved = (view.last_number + step if seeded else None), False
        for attempt in range(_DECIDE_ATTEMPTS):
            if attempt:
                basis = await self.views.merged(experiment_id, view, member_id)
                candidates = basis.ready(request, bound)
            definition = view.definition
            arms, contexts, ready = candidates
            rng = self._rng if number is None else _decision_rng(definition.spec.seed, number)
            made = await make(basis, request, decision_id, arms, contexts, ready, rng)
            first, *later = made.records
            reply = await self._store.decide(
                member_id, decision_id, key_hash=key_hash,
                incarnation=definition.incarnation, seen=seen, number=number,
                reserved=reserved, ttl_seconds=definition.spec.reward_window_seconds,
                max_lag=definition.spec.max_stale_rewards,
                grace_seconds=self._settings.default_reward_grace_seconds,
                record=first, logged=made.logged, ranked=request.slots is not None,
                later_records=later,
                held=view.folded + view.applied,
                request=None if request.decision_id is None else (
                    request.digest(), made.answer(), self._settings.idempotency_seconds),
            )
            if reply.status == "repeat":  # answered before under the caller's id
                assert reply.answer is not None
                return _repeated(decision_id, request.slots, reply.number, reply.answer,
                                 reply.windows_left)
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
                return made.finish(reply.number, definition.spec.reward_window_seconds)
            if reply.status == "missing":
                self.views.forget(experiment_id)
                self.views.forget(member_id)
                raise missing_experiment(api_key)
            if reply.status == "forbidden":
                if member_id == experiment_id or synced:
                    raise Forbidden(WRONG_KEY)
                # The experiment (its home) accepted the key: a key change this member
                # has not copied yet (service.shards). Copy it, and decide again.
                await shards.sync_members(self._store, experiment_id)
                synced = True
                continue
            if seen is not None and seen[1] is not None and _lagged(reply) - seen[1] > \
                    definition.spec.max_stale_rewards:  # (not a number or version changed)
                self._contend(member_id)
            if reply.progress is not None:  # what this view lacks: catch up
                view = await self.views.caught_up(member_id, view, member_key, reply.progress)
            else:
                assert reply.snapshot is not None
                view = await self.views.refresh(member_id, view, reply.snapshot)
            self._check_routing(experiment_id, member_id, view, step)
            # Decide again from the statistics just read, and record that
            # decision whatever has changed since: under steady rewards a
            # check would fail again and again.
            seen, number, reserved = None, reply.reserved, True
            if number is None and view.definition.spec.seed is not None:
                # No number set aside: the definition changed (arms, or created
                # again) since the request was checked. Check it again (the next
                # attempt's ready()), so a refusal takes no number; then predict one.
                seen, reserved = (view.version, view.rewards), False
                number = view.last_number + step
        raise StoreUnavailable("the experiment changed while deciding; retry")

    async def _probed(self, experiment_id: str, member_id: str, view: View,
                      key_hash: str | None, api_key: str | None) -> View:
        """``view`` caught up by a read sent after the request arrived (with this worker's
        next batch: one read for the batch's decisions of the member).

        Other workers' rewards, applied while a decision is made from a view, make it
        stale: then it is made twice (prepared, drawn, its propensity computed). While
        that happens to an experiment's decisions (``_contended``), they read first what
        their view lacks, and are recorded whatever is applied after that read: a round
        trip instead of a second decision (BENCHMARKS.md §27)."""
        progress = await self._store.probe_progress(member_id, held=view.folded + view.applied)
        if progress is None:
            self.views.forget(experiment_id)
            self.views.forget(member_id)
            raise missing_experiment(api_key)
        if progress.rewards - view.rewards > view.definition.spec.max_stale_rewards:
            self._contend(member_id)  # unread, they would have made the decision stale
        return await self.views.caught_up(member_id, view, key_hash, progress)

    def _contend(self, member_id: str) -> None:
        """The member's decisions read first for the next ``_CONTENDED_SECONDS``."""
        now = time.monotonic()
        if len(self._contended) >= self._contended_most:  # those over go, now and then
            self._contended = {m: until for m, until in self._contended.items() if until > now}
            self._contended_most = max(_CONTENDED_MOST, 2 * len(self._contended))
        self._contended[member_id] = now + _CONTENDED_SECONDS

    def _check_routing(self, experiment_id: str, member_id: str, view: View, step: int) -> None:
        """The member's view is of an incarnation with the shard count the decision was
        routed by; else (created again meanwhile with another count: decide.lua records
        only for the member's incarnation) 503, the views forgotten, to route afresh."""
        if view.definition.spec.shards != step:
            self.views.forget(experiment_id)
            self.views.forget(member_id)
            raise StoreUnavailable("the experiment was created again meanwhile; retry")

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
            raise missing_experiment(api_key)
        key_hash = None if api_key is None else hash_key(api_key)
        texts = [(decision_id, reward_text(value)) for decision_id, value in items]
        # The shard count, as this worker last saw it (1 if it never did): the scripts
        # refuse rewards routed by another count and say which (service.shards).
        view = self.views.get(experiment_id)
        count = (view.definition.spec.shards if view is not None
                 else self._shard_counts.get(experiment_id, 1))
        statuses: builtins.list[str | None] = [None] * len(texts)
        synced = False
        for _ in range(_DECIDE_ATTEMPTS):
            todo = [i for i, status in enumerate(statuses) if status is None]
            replies = await self._reward_members(experiment_id, count, key_hash,
                                                 [texts[i] for i in todo])
            for i, reply in zip(todo, replies, strict=True):
                if reply not in _UNROUTED and not reply.startswith("shards:"):
                    statuses[i] = reply
            left = {r for r in replies if r in _UNROUTED or r.startswith("shards:")}
            if not left:
                break
            recount = next((int(r[7:]) for r in left if r.startswith("shards:")), None)
            if recount is not None:  # routed by another count: nothing written for those
                count = self._learn(experiment_id, recount)
            elif "missing" in left and count > 1:
                # A member the count names is gone: the experiment was perhaps created
                # again with fewer shards. Its home says (a 'shards' reply), or is gone.
                count = self._learn(experiment_id, 1)
            elif ("forbidden" in left and count > 1 and not synced and key_hash is not None
                  and one_of(key_hash, await self._store.key_hashes(experiment_id) or ())):
                # The home accepts the key: a key change the other members have not
                # copied yet (service.shards). Copy it.
                await shards.sync_members(self._store, experiment_id)
                synced = True
            elif "missing" in left:
                self._shard_counts.pop(experiment_id, None)
                self.views.forget(experiment_id)
                raise missing_experiment(api_key)
            else:
                raise Forbidden(WRONG_KEY)
        if all(status is None for status in statuses):
            raise StoreUnavailable("the experiment changed while rewarding; retry")
        # Applied where routed; a reward whose member stayed out of reach (a member gone
        # from under its home) has no decision to apply to.
        done = [status or "not_found" for status in statuses]
        return [RewardOutcome(decision_id, _status(text), _REWARD_MESSAGES[_status(text)])
                for (decision_id, _), text in zip(items, done, strict=True)]

    def _learn(self, experiment_id: str, count: int) -> int:
        """The experiment's shard count, as a script said it: kept for the next rewards."""
        if len(self._shard_counts) >= _SHARD_COUNTS_KEPT:
            self._shard_counts.clear()
        self._shard_counts[experiment_id] = count
        self.views.forget(experiment_id)  # its view said another count: read anew
        return count

    async def _reward_members(
        self, experiment_id: str, count: int, key_hash: str | None,
        texts: Sequence[tuple[str, str]],
    ) -> builtins.list[str]:
        """Each reward applied by its decision's member (routed by ``count``), the members
        at once: per reward, its status, or why its member did not apply it ('missing',
        'forbidden', or 'shards:<count>' when the experiment has another count; nothing
        written for it then)."""
        by_member: dict[str, builtins.list[int]] = {}
        for i, (decision_id, _) in enumerate(texts):
            member_id = shards.member(experiment_id, shards.shard_of(decision_id, count))
            by_member.setdefault(member_id, []).append(i)
        calls = [self._reward_member(member_id, key_hash, [texts[i] for i in rows], count)
                 for member_id, rows in by_member.items()]
        # (one call awaited as it is: no task, so nothing else runs before it starts)
        if len(calls) == 1:
            replies = [await calls[0]]
        else:
            # Each member's part is written whole or not at all, but the parts are separate
            # scripts: an error is answered once every part is done, so that a batch sent
            # again meets them all decided (each reward counted once: the done ones
            # 'duplicate').
            answered = await asyncio.gather(*calls, return_exceptions=True)
            failed = next((a for a in answered if isinstance(a, BaseException)), None)
            if failed is not None:
                raise failed
            replies = [a for a in answered if not isinstance(a, BaseException)]
        out = [""] * len(texts)
        for (member_id, rows), reply in zip(by_member.items(), replies, strict=True):
            if reply[0] == "shards":
                whole = [f"shards:{reply[1]}"] * len(rows)
            elif reply in (["missing"], ["forbidden"]):
                if reply == ["missing"]:
                    self.views.forget(member_id)
                whole = reply * len(rows)
            else:
                whole = reply
            for i, status in zip(rows, whole, strict=True):
                out[i] = status
        return out

    async def _reward_member(
        self, member_id: str, key_hash: str | None, texts: Sequence[tuple[str, str]],
        count: int,
    ) -> builtins.list[str]:
        """reward.lua on one member (the experiment itself, unsharded): its statuses."""
        # What this worker holds, so that the reply brings any outcome of others it
        # lacks; only from the first of its rewards in flight: the reply to a later one
        # would bring the earlier ones again, each, as outcomes it lacks.
        view = self.views.get(member_id)
        held = view.reach if view is not None and not self._rewarding[member_id] else None
        self._rewarding[member_id] += len(texts)
        try:
            reply = await self._store.apply_rewards(member_id, key_hash, texts, held, count)
        finally:
            self._rewarding[member_id] -= len(texts)
            if not self._rewarding[member_id]:
                del self._rewarding[member_id]
        applied = reply.statuses.count("applied")
        view = self.views.get(member_id)
        if view is not None and applied:
            self.views.add_own(view, reply.appended, applied)
        self._fold_soon(member_id, reply.counter, applied)
        return reply.statuses

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
        """Wait for the background folds started so far (ExperimentService.close does;
        tests that read the stored sums after a reward do too)."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    async def defaults_applied(self, experiment_id: str, counter: int, defaulted: int) -> None:
        """The sweeper applied ``defaulted`` default rewards: this worker's view is
        behind by as many (the next decision reads first), and the sums may be due
        to be written back."""
        view = self.views.get(experiment_id)
        if view is not None:
            view.behind += defaulted
            self.views.drop_own(view)  # their records are not at hand: catching up reads
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
            view = self.views.get(experiment_id)
            definition = (view.definition if view is not None
                          else await self.views.definition(experiment_id))
            folded = await self._store.fold(experiment_id, definition.incarnation, FOLD_LIMIT,
                                            functools.partial(folded_blobs, definition.config),
                                            self._held(experiment_id, definition))
            if folded is None and view is not None:  # created again since this worker read it
                self.views.forget(experiment_id)
                definition = await self.views.definition(experiment_id)
                await self._store.fold(experiment_id, definition.incarnation, FOLD_LIMIT,
                                       functools.partial(folded_blobs, definition.config))
        except (StoreUnavailable, NotFound) as exc:
            logger.warning("experiment %s: the sums were not written back (%s); the next "
                           "fold will", experiment_id, exc)
        except Exception:  # a damaged entry read: the views that read it fail as loudly
            logger.exception("experiment %s: the sums were not written back", experiment_id)

    def _held(self, experiment_id: str, definition: Definition
              ) -> Callable[[int, Sequence[str], Sequence[bytes]], dict[str, bytes] | None]:
        """A fold's blobs from this worker's view of the experiment (then it reads no stored
        sums: :func:`service.folding.held_blobs`), when the view holds every outcome the
        stored sums hold (``sums_hold``) and none past those the fold read (the view as it
        is when the fold has read them, perhaps newer than when it began), under
        ``definition``'s incarnation and policy; else None, and the fold reads the stored
        blobs. The view's sums are those it read (``view.folded`` outcomes) with the next
        ``view.applied`` added; folds since added the first of those to the stored sums,
        the same additions in the same order (:mod:`service.folding`): so the view holds
        the stored sums with the fold's first records added. (A stored blob changed by
        anything but a fold, which nothing the service writes does, is then written over
        with the sums the view holds: a damaged blob is mended where a fold that reads it
        fails, logged.)"""
        def held(sums_hold: int, fields: Sequence[str], records: Sequence[bytes]
                 ) -> dict[str, bytes] | None:
            view = self.views.get(experiment_id)
            if (view is None or view.definition.incarnation != definition.incarnation
                    or view.definition.config != definition.config):
                return None
            holds = view.folded + view.applied - sums_hold  # of the records the fold read
            if not 0 <= holds <= len(records) or sums_hold < view.folded:
                return None
            return held_blobs(definition.config, view.sums, view.definition.arm_positions,
                              fields, records[holds:])
        return held


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


def _fold_due(counter: int, recorded: int) -> bool:
    """The ``recorded`` outcomes took the counter past a multiple of FOLD_EVERY."""
    return counter // FOLD_EVERY > (counter - recorded) // FOLD_EVERY


def _decision_rng(seed: int | None, number: int) -> np.random.Generator:
    """Seeded experiments: decision n always draws from the same stream."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng(np.random.SeedSequence([seed, number]))


def _text_of(propensity: float | None) -> str:
    """A propensity as the records and the log keep it: '' for none."""
    return "" if propensity is None else repr(propensity)


# Propensities' texts by value (_text_of's), made once: while the statistics stay, a
# ranking's slots take their values from the view's table again and again, and repr of
# a float costs about 0.5 µs (5 µs a ranking of 10). Emptied when it grows past the bound.
_TEXTS: dict[float | None, str] = {None: ""}
_TEXTS_MOST = 65_536


def _texts_of(propensities: Sequence[float | None]) -> list[str]:
    """Each propensity's :func:`_text_of`."""
    texts = _TEXTS
    if len(texts) > _TEXTS_MOST:
        texts.clear()
        texts[None] = ""
    found = [texts.get(p) for p in propensities]
    if None in found:
        for j, p in enumerate(propensities):
            if found[j] is None:
                found[j] = texts[p] = _text_of(p)
    return found  # type: ignore[return-value]


@dataclass(frozen=True)
class _Made:
    """One attempt's decision, ready for decide.lua: per slot (one for ``/choose``) its
    record, and its log entry (a ranking's: one for all its slots); what a retry under
    the caller's id gets back (``answer()``: per slot, arm '\n' propensity '\n' index,
    '' while exploring; made only for a caller's id); and the reply once recorded under
    a number (``finish(number, window)``)."""

    records: list[bytes]
    logged: dict[str, str | bytes]
    answer: Callable[[], str]
    finish: Callable[[int, int], Decision | RankedDecision]


# What decides: (the view, the request, the decision id, the arms, their contexts, the
# prepared policy, the generator) -> the decision to record.
_Maker = Callable[[View, ChooseRequest, str, Sequence[ArmRecord], np.ndarray, Ready,
                   np.random.Generator], Awaitable[_Made]]


def _lagged(reply: DecideReply) -> int:
    """A stale reply's outcomes counter."""
    if reply.progress is not None:
        return reply.progress.rewards
    assert reply.snapshot is not None
    return reply.snapshot.rewards


async def _one_arm(view: View, request: ChooseRequest, decision_id: str,
                   arms: Sequence[ArmRecord], contexts: np.ndarray, ready: Ready,
                   rng: np.random.Generator) -> _Made:
    """``/choose``: one arm (:func:`policies.draw`) and its propensity."""
    choice = draw(ready, [rng])
    picked = int(choice.arms[0])
    score = float(choice.scores[0, picked])
    propensity = (await view.propensity(ready, picked)
                  if view.definition.spec.propensities else None)
    records, logged = _slots(view, decision_id, arms, contexts, [picked], [arms[picked].id],
                             [propensity], ranked=False)

    def answer() -> str:
        return _answer_line(arms[picked].id, propensity, score)

    def finish(number: int, window: int) -> Decision:
        return _slot_decision(decision_id, arms[picked].id, score, number, window, propensity)
    return _Made(records, logged, answer, finish)


async def _ranked(view: View, request: ChooseRequest, decision_id: str,
                  arms: Sequence[ArmRecord], contexts: np.ndarray, ready: Ready,
                  rng: np.random.Generator) -> _Made:
    """``/rank``: ``request.slots`` arms in order (:func:`policies.ranking.rank`), each
    slot's propensity the probability that its arm was placed there."""
    assert request.slots is not None
    try:
        ranking = rank(ready, [rng], request.slots)
    except ValueError:
        raise InvalidInput(f"k ({request.slots}) is more than the {len(arms)} eligible arms "
                           "of this request") from None
    placed: list[int] = ranking.arms[0].tolist()
    scores: list[float] = ranking.scores[0].take(ranking.arms[0]).tolist()
    ids = [arms[a].id for a in placed]
    propensities: list[float | None] = (
        list(await view.slot_propensities(ready, ranking))
        if view.definition.spec.propensities else [None] * len(placed))
    records, logged = _slots(view, decision_id, arms, contexts, placed, ids, propensities,
                             ranked=True)

    def answer() -> str:
        return "\n".join(_answer_line(arm_id, p, score)
                         for arm_id, p, score in zip(ids, propensities, scores, strict=True))

    def finish(number: int, window: int) -> RankedDecision:
        return RankedDecision(decision_id, number, window, tuple(ids),
                              tuple([None if math.isinf(s) else s for s in scores]),
                              tuple(propensities), (window,) * len(placed))
    return _Made(records, logged, answer, finish)


def _slots(view: View, decision_id: str, arms: Sequence[ArmRecord], contexts: np.ndarray,
           picked: Sequence[int], ids: Sequence[str], propensities: Sequence[float | None],
           *, ranked: bool) -> tuple[list[bytes], dict[str, str | bytes]]:
    """Each slot's record (one for ``/choose``) and the decision's log entry, what the
    slots share made once.

    A record is the pending decision's after what decide.lua puts in front of it
    (incarnation, number, deadline; the format is in ``outcomes.lua``): what reward.lua
    needs (the stats fields and ``x``, the context, packed) and the state the decision
    was made from. The log entry (decide.lua adds the number) holds the chosen arm and
    its context, the arms it was chosen from (and, with ``log_all_contexts``, their
    contexts), the statistics it was made from and its propensity (no field when the
    experiment computes none: the entry says so as an older version's does). A
    ranking's is one entry for all its slots, in order (``type`` ranking: ``arms``
    and ``propensities`` comma-separated, ``x`` the contexts one after the other):
    :mod:`service.decision_log` shows each slot as a decision's entry."""
    definition = view.definition
    version, rewards, made_at = str(view.version), str(view.rewards), repr(time.time())
    # take(): a third of the cost of indexing with a list
    chosen = np.ascontiguousarray(contexts.take(picked, axis=0), dtype=_PACKED)
    texts = _texts_of(propensities)
    # What the slots' records share, and each arm's head, made once (per definition).
    shared = f"{version}\n{rewards}\n{made_at}\n".encode()
    heads, packed, width = definition.record_heads, chosen.tobytes(), chosen.shape[1] * 8
    records = [heads[arm_id] + shared + f"{text}\n".encode() + packed[at:at + width]
               for at, arm_id, text in zip(range(0, len(packed), width), ids, texts,
                                           strict=True)]
    eligible = (definition.active_ranges if arms is definition.active_arms
                else index_ranges([a.index for a in arms]))
    every: dict[str, str | bytes] = {} if not definition.spec.log_all_contexts else {
        "contexts": np.ascontiguousarray(contexts, dtype=_PACKED).tobytes()}
    placed = ",".join(ids)
    logged: dict[str, str | bytes] = {
        "type": "ranking" if ranked else "decision", "id": decision_id,
        ("arms" if ranked else "arm"): placed, "x": packed, "version": version,
        "rewards_seen": rewards, "eligible": eligible, **every}
    if propensities[0] is not None:
        logged["propensities" if ranked else "propensity"] = ",".join(texts)
    return records, logged


def _answer_line(arm_id: str, propensity: float | None, score: float) -> str:
    """One slot of what a retry of an idempotent decision gets back (decide.lua's
    ARGV[13])."""
    return "\n".join((arm_id, _text_of(propensity), "" if math.isinf(score) else repr(score)))


def _repeated(decision_id: str, slots: int | None, number: int, answer: str,
              windows_left: Sequence[int]) -> Decision | RankedDecision:
    """The decision (``slots`` None) or ranking an earlier request under ``decision_id``
    got (:class:`_Made`'s answer), with the time each slot's reward may still come in
    (0 once it has come; a ranking's, the longest of its slots')."""
    lines = answer.split("\n")
    if len(lines) % 3:
        raise ValueError(f"a kept answer has {len(lines)} lines, not 3 a slot")
    arm_ids = tuple(lines[0::3])
    propensities = tuple(float(text) if text else None for text in lines[1::3])
    indices = tuple(float(text) if text else None for text in lines[2::3])
    windows = (*windows_left, *[0] * len(arm_ids))[:len(arm_ids)]
    if slots is None:
        return _slot_decision(decision_id, arm_ids[0],
                              math.inf if indices[0] is None else indices[0],
                              number, windows[0], propensities[0])
    return RankedDecision(decision_id, number, max(windows, default=0), arm_ids, indices,
                          propensities, windows)


def _slot_decision(decision_id: str, arm_id: str, score: float, number: int, window: int,
                   propensity: float | None) -> Decision:
    exploring = math.isinf(score)
    return Decision(
        decision_id=decision_id,
        arm_id=arm_id,
        index=None if exploring else score,
        exploring=exploring,
        decision_number=number,
        expires_in_seconds=window,
        propensity=propensity,
    )
