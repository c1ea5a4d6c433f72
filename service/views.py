"""Room 1: each worker's views of its experiments' statistics, and their catch-up.

A view is what this worker last read of an experiment (definition and
statistics) with the policy prepared from it. Rewards make views stale; a view
catches up by adding the outcomes it lacks (its own rewards' records, or what
``progress.lua`` returns) to a copy of its sums, the same bits as reading them,
and reads the statistics only when a fold took outcomes it never added. The views
share one memory budget, least recently used dropped first.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from policies import Ready, State, discounted, layout, prepare
from policies.propensity import SERVICE, arm_propensity, off_the_loop, propensities
from policies.ranking import Ranking, placement_table, position_propensities
from policies.state import Sums, inherit_kept, merge_sums
from service import keys, shards
from service.definition import (
    WRONG_KEY,
    ArmRecord,
    Definition,
    check_vector,
    missing_experiment,
    one_of,
    parse_definition,
    rows_of,
    state_for,
)
from service.domain import ChooseRequest, ExperimentSpec, valid_experiment_id
from service.errors import Forbidden, InvalidInput, NotFound, StoreUnavailable
from service.folding import fold_into
from service.settings import Settings
from service.store import Appended, Progress, Snapshot, Store

# A view keeps the records of at most this many of its worker's own outcomes (a few
# hundred bytes each); beyond, it reads what it lacks when it must catch up.
_OWN_RECORDS_KEPT = 256


@dataclass
class _Prepared:
    """The last request's arms (rows), their statistics, and, while the contexts stay
    the same, the prepared policy and the propensities computed from it (by position;
    a ranking's slots', by (position, slot), or every arm's at every position up to a
    ranking's length: ``table``, False where the law has none)."""

    rows: tuple[int, ...]
    state: State
    ready: Ready | None = None
    propensities: dict[int, float] = field(default_factory=dict)
    arm_propensity: Callable[[int], float] | None = None  # made for the first one
    placements: dict[tuple[int, int], float] = field(default_factory=dict)
    # The first experiment's table as lists ([arm][position]): a lookup per slot without
    # a NumPy call.
    table: _Table | None = None
    rankings: int = 0  # rankings asked of ``ready``, counted as they arrive
    # The table being computed (for rankings of up to its k): the rankings that arrive
    # meanwhile await it rather than each compute their own (BENCHMARKS.md §32).
    tabling: tuple[int, asyncio.Future[_Table]] | None = None


_Table = list[list[float]] | Literal[False]


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
    # with the latest outcomes starts from (Views.caught_up).
    folded: int = 0
    applied: int = 0
    raw: State | None = None
    # When the outcomes it holds were read (time.monotonic): a sharded experiment's
    # decision catches up the other members' views older than shards.SYNC_SECONDS.
    read_at: float = field(default_factory=time.monotonic)
    _last: _Prepared | None = field(default=None, repr=False)
    _inherited: _Prepared | None = field(default=None, repr=False)  # see inherit()

    @functools.cached_property
    def nbytes(self) -> int:
        """Memory it may hold: the statistics (and the sums before they were aged, for an
        experiment that forgets), as much again for a request's subset, and the
        solutions the subset keeps (``policies.state.kept_theta``)."""
        sums = sum(a.nbytes for a in self.state.values())
        raw = 0 if self.raw is None else sum(a.nbytes for a in self.raw.values())
        # One kept solution per model (a shared model's too: the subset is frozen):
        # theta, with the inverse of X'X + reg I (LinUCB, the pooled spread) or the
        # draw basis W (the samplers, LinPHE and LinGIRO), and the X'X and X'y it was
        # solved from (policies.state.kept_theta, kept_ridge_and_inverse,
        # kept_draw_basis): at most 2 X'X and 2 X'y; counted with room to spare.
        return 2 * sums + raw + 5 * self.state["xtx"].nbytes + 2 * self.state["xty"].nbytes

    @property
    def reach(self) -> int:
        """How many outcomes it holds the records of: those in its statistics, and its
        own since, while it keeps them."""
        return self.rewards + (len(self.own) if self.own is not None else 0)

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
        view keep its solutions (``policies.state.kept_theta``); frozen, as a view's
        statistics never change (``Views.added`` copies them), so that a request with a
        context of its own compares no sums and solves no shared model again."""
        config = self.definition.config
        take = np.array(rows)
        return Sums(_read_only({
            name: self.state[name][:, take] if spec.per_arm(config) else self.state[name]
            for name, spec in layout(config).items()
        }), frozen=True)

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
        rows = definition.active_rows if arms is definition.active_arms else rows_of(arms)
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
            if off_the_loop(ready):
                def compute() -> float:
                    arm = np.array([position])
                    return float(propensities(ready, arm, accuracy=SERVICE)[0])
                kept[position] = await asyncio.to_thread(compute)
            else:
                kept[position] = self._arm_propensity(ready)(position)
        return kept[position]

    def _arm_propensity(self, ready: Ready) -> Callable[[int], float]:
        """The propensity of each arm of ``ready`` (:func:`policies.propensity.arm_propensity`),
        kept with it while the view keeps that: what the arms' integrals share is computed
        once for the decisions from the same statistics."""
        last = self._last
        if last is None or last.ready is not ready:
            return arm_propensity(ready, SERVICE)
        if last.arm_propensity is None:
            last.arm_propensity = arm_propensity(ready, SERVICE)
        return last.arm_propensity

    async def slot_propensities(self, ready: Ready, ranking: Ranking) -> list[float]:
        """The probability that ``rank(ready)`` puts each of ``ranking``'s arms at its
        position: the first as :meth:`propensity` (a ranking of one is a decision),
        the others by :func:`policies.ranking.position_propensities`, in a thread
        (an integral over the placed arms, or rankings drawn again: 0.3 ms to tens of
        ms). The second ranking from the same statistics computes instead every arm's
        probability at every position (:func:`policies.ranking.placement_table`: a few
        times one ranking's work), which then answers every later one; rankings that
        arrive while it is computed wait for it (:func:`_table`)."""
        last = self._last
        if last is None or last.ready is not ready:
            last = _Prepared((), self.state)  # nothing kept: compute, keep nothing
        last.rankings += 1  # before any wait: rankings that arrive meanwhile see it
        arms: list[int] = ranking.arms[0].tolist()
        first = await self.propensity(ready, arms[0])
        k = len(arms)
        table = last.table
        if k > 1 and last.rankings > 1 and (table is None or (
                isinstance(table, list) and len(table[0]) < k)):
            table = await _table(last, ready, k)
        if isinstance(table, list) and len(table[0]) >= k:
            return [first, *(table[arm][slot] for slot, arm in enumerate(arms[1:], 1))]
        placed = [(arm, slot) for slot, arm in enumerate(arms)][1:]
        kept = last.placements
        if any(pair not in kept for pair in placed):  # kept, as propensity() keeps its own
            def compute() -> list[float]:
                return [float(p) for p in position_propensities(
                    ready, ranking, draws=SLATE_DRAWS, accuracy=SERVICE)[0, 1:]]
            kept.update(zip(placed, await asyncio.to_thread(compute), strict=True))
        return [first, *(kept[pair] for pair in placed)]


async def _table(last: _Prepared, ready: Ready, k: int) -> _Table:
    """``last``'s placement table for rankings of ``k`` (as
    :func:`policies.ranking.placement_table`), computed once in a thread however many
    rankings ask for it at once: 25 concurrent rankings after a reward each computed
    it (BENCHMARKS.md §32). Kept in ``last`` once made, unless a table for more
    positions is on its way; a failure is each waiter's, and the next asks again."""
    if last.tabling is None or last.tabling[0] < k:
        def table_of() -> _Table:
            table = placement_table(ready, k, accuracy=SERVICE)
            return False if table is None else table[0].tolist()
        computing = asyncio.ensure_future(asyncio.to_thread(table_of))
        computing.add_done_callback(functools.partial(_tabled, last))
        last.tabling = (k, computing)
    tabling = last.tabling
    # shield: a waiter cancelled (its client gone) leaves the others theirs
    table = await asyncio.shield(tabling[1])
    if last.tabling is tabling:
        last.table = table
    return table


def _tabled(last: _Prepared, done: asyncio.Future[_Table]) -> None:
    """A table computed: if it failed (or was cancelled, as at shutdown), the next ranking
    computes it again, whether a waiter saw the failure or all had gone."""
    failed = done.cancelled() or done.exception() is not None  # (retrieved: no warning)
    if failed and last.tabling is not None and last.tabling[1] is done:
        last.tabling = None


# Rankings drawn again for a slot's propensity where no integral serves (a shared
# model's draws, epsilon, an arm to explore): a standard error of at most 1.6 points.
SLATE_DRAWS = 1024


class UnknownArm(InvalidInput):
    """A request names an arm the definition at hand does not have."""


class Views:
    """This worker's views, by experiment, within ``settings.view_cache_bytes``."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self._store = store
        self._settings = settings
        # Per experiment, what this worker last read; least recently used first.
        self._held: OrderedDict[str, View] = OrderedDict()
        self._bytes = 0  # their nbytes and own_bytes, against settings.view_cache_bytes
        # Per sharded experiment, the members' views last merged and their merge.
        self._merged: dict[str, tuple[tuple[View, ...], View]] = {}
        self._syncing: dict[str, asyncio.Future[View]] = {}  # catch-ups of members under way
        # First reads under way (Views._first_view): what read_experiment gave.
        self._first_reads: dict[str, asyncio.Future[tuple[dict[str, str], dict[str, str],
                                                            Snapshot] | None]] = {}

    @property
    def held(self) -> Mapping[str, View]:
        """The views held, least recently used first."""
        return self._held

    @property
    def nbytes(self) -> int:
        """The memory the views count against the budget."""
        return self._bytes

    def get(self, experiment_id: str) -> View | None:
        """The view held of the experiment, if any (not marked as used)."""
        return self._held.get(experiment_id)
    async def view_for(self, experiment_id: str, key_hash: str | None) -> View:
        """This worker's view, read if it has none; 403 unless ``key_hash`` is the key's."""
        view = self._held.get(experiment_id)
        if view is None:
            return await self._first_view(experiment_id, key_hash)
        if key_hash is None or view.definition.accepts(key_hash):
            self._held.move_to_end(experiment_id)
            return view
        # A wrong key, a key rotated in since this view was read, or the experiment
        # was created again (with a new key). (A key revoked since is refused by the
        # scripts, which read the keys with every decision and reward.)
        stored = await self._store.key_hashes(experiment_id)
        if stored is None:
            self.forget(experiment_id)
            raise missing_experiment(key_hash)
        if not one_of(key_hash, stored):
            raise Forbidden(WRONG_KEY)
        return await self.read_view(experiment_id, key_hash)

    async def _first_view(self, experiment_id: str, key_hash: str | None) -> View:
        """A view of an experiment this worker holds none of: the requests that find none
        together (a cold start, a view dropped from the budget) wait for one read and
        one decoding of the statistics, not one each. A key the read does not accept,
        or no experiment, is so only for the request that began the read: one that
        joined it reads again (the key, or the experiment, may be newer than it)."""
        pending = self._first_reads.get(experiment_id)
        joined = pending is not None
        if pending is None:
            pending = asyncio.ensure_future(self._store.read_experiment(experiment_id))
            self._first_reads[experiment_id] = pending
            pending.add_done_callback(functools.partial(self._first_read_done, experiment_id))
        read = await asyncio.shield(pending)
        if read is None:
            if joined:  # (the experiment may have been created since that read began)
                return await self.read_view(experiment_id, key_hash)
            self.forget(experiment_id)
            raise missing_experiment(key_hash)
        meta, arms, snapshot = read
        definition = parse_definition(meta, arms)
        if key_hash is not None and not definition.accepts(key_hash):
            if joined:
                return await self.read_view(experiment_id, key_hash)
            raise Forbidden(WRONG_KEY)  # nothing kept
        held = self._newer(experiment_id, None, definition.incarnation, snapshot.version,
                           snapshot.rewards)
        return held if held is not None else self._remember(experiment_id, definition, snapshot)

    def _first_read_done(self, experiment_id: str, done: asyncio.Future[object]) -> None:
        self._first_reads.pop(experiment_id, None)
        if not done.cancelled():
            done.exception()  # retrieved: each waiter got it (asyncio warns otherwise)

    async def read_view(self, experiment_id: str, key_hash: str | None = None) -> View:
        read = await self._store.read_experiment(experiment_id)
        if read is None:
            self.forget(experiment_id)
            raise missing_experiment(key_hash)
        meta, arms, snapshot = read
        definition = parse_definition(meta, arms)
        if key_hash is not None and not definition.accepts(key_hash):
            raise Forbidden(WRONG_KEY)  # nothing kept
        return self._remember(experiment_id, definition, snapshot)

    async def caught_up(
        self, experiment_id: str, view: View, key_hash: str | None,
        progress: Progress | None = None,
    ) -> View:
        """The view with the statistics read now (and the definition, if arms changed).

        The sums change only by outcomes appended to the outcomes string and by
        folds of them (:mod:`service.folding`). So when no fold took an outcome
        this view has not added, the view catches up by adding the outcomes it
        lacks to a copy of its sums: the same bits as reading the sums, without
        reading them (the bulk of a read: a blob per arm), and only those it
        lacks are sent. ``progress``: what a stale reply brought (else it is
        read); if the view cannot catch up with it, the statistics are read.
        """
        if progress is None:
            progress = await self._store.read_progress(experiment_id,
                                                       held=view.folded + view.applied)
        if progress is None:
            self.forget(experiment_id)
            raise missing_experiment(key_hash)
        caught = self._catch_up(experiment_id, view, progress)
        if caught is not None:
            return caught
        snapshot = await self._store.read_snapshot(experiment_id)
        if snapshot is None:
            self.forget(experiment_id)
            raise missing_experiment(key_hash)
        return await self.refresh(experiment_id, view, snapshot)

    async def current(self, experiment_id: str, view: View, key_hash: str | None,
                      max_lag: int) -> View:
        """``view``, caught up if it is more than ``max_lag`` outcomes behind: with its own
        rewards' records when it holds them all (no round trip), else by reading."""
        if view.behind <= max_lag:
            return view
        if view.own is not None and len(view.own) == view.behind:
            return self.added(experiment_id, view, view.own, view.rewards + view.behind,
                              view.folded, view.last_number)
        return await self.caught_up(experiment_id, view, key_hash)

    async def merged(self, experiment_id: str, deciding: View, member_id: str) -> View:
        """What a decision recorded on ``member_id`` (whose view is ``deciding``) is made
        from: ``deciding`` itself unsharded; else a view of the merge of every member's
        sums (:mod:`service.shards`), the others caught up when older than
        ``shards.SYNC_SECONDS``."""
        count = deciding.definition.spec.shards
        if count == 1:
            return deciding
        member_ids = shards.members(experiment_id, count)
        if member_id not in member_ids:  # routed by another incarnation's count
            raise StoreUnavailable("the experiment was created again meanwhile; retry")
        now = time.monotonic()
        # The other members' views without the key: the caller checked it on the
        # experiment's own (its home holds it), and the decision's script checks it.
        held = [deciding if other == member_id else self._fresh(other, now)
                for other in member_ids]
        stale = [i for i, view in enumerate(held) if view is None]
        if stale:  # most decisions have none: no task, no await
            synced = await asyncio.gather(*(self._synced(member_ids[i]) for i in stale))
            for i, view in zip(stale, synced, strict=True):
                held[i] = view
        views = [v for v in held if v is not None]
        if _differ(views):
            # A change of the definition is being copied from the home to the other
            # members (service.shards), or its copy stopped halfway: read each
            # member's as it is now, and if they still differ, copy it.
            views = [await self.read_view(other) for other in member_ids]
            if _differ(views):
                await shards.sync_members(self._store, experiment_id)
                views = [await self.read_view(other) for other in member_ids]
            if _differ(views):
                raise StoreUnavailable("the experiment's definition is being changed; retry")
        return self._merge(experiment_id, tuple(views))

    def _fresh(self, member_id: str, now: float) -> View | None:
        """This worker's view of a member, if it serves a decision as it is: held, with
        no own rewards to add, read within SYNC_SECONDS."""
        view = self._held.get(member_id)
        if view is None or view.behind or now - view.read_at > shards.SYNC_SECONDS:
            return None
        self._held.move_to_end(member_id)
        return view

    async def _synced(self, member_id: str) -> View:
        """This worker's view of a member a decision does not record on: with the
        worker's own rewards added, and read again when older than SYNC_SECONDS."""
        view = await self.view_for(member_id, None)
        view = await self.current(member_id, view, None, 0 if view.own is not None else
                                  view.behind)
        if time.monotonic() - view.read_at <= shards.SYNC_SECONDS:
            return view
        # One read per member at a time: the requests that find the view old together
        # wait for the same catch-up.
        pending = self._syncing.get(member_id)
        if pending is None:
            pending = asyncio.ensure_future(self.caught_up(member_id, view, None))
            self._syncing[member_id] = pending
            pending.add_done_callback(functools.partial(self._synced_done, member_id))
        return await asyncio.shield(pending)

    def _synced_done(self, member_id: str, done: asyncio.Future[View]) -> None:
        self._syncing.pop(member_id, None)
        if not done.cancelled():
            done.exception()  # retrieved: each waiter got it (asyncio warns otherwise)

    def _merge(self, experiment_id: str, views: tuple[View, ...]) -> View:
        """The view of the merge of ``views`` (kept while they are this worker's). Kept apart
        from the members' views (``_merged``, never ``_held``): its ``folded`` and
        ``applied`` say nothing of its sums, and no fold starts from it (Decisions._held)."""
        kept = self._merged.get(experiment_id)
        if kept is not None and all(a is b for a, b in zip(kept[0], views, strict=True)):
            return kept[1]
        definition = views[0].definition
        state = _read_only(merge_sums(definition.config, [v.sums for v in views]))
        merged = View(definition, version=definition.version,
                      rewards=sum(v.rewards for v in views), last_number=0, state=state,
                      read_at=min(v.read_at for v in views))
        if kept is not None:
            merged.inherit(kept[1])
            self._bytes -= kept[1].nbytes
        self._merged[experiment_id] = (views, merged)
        self._bytes += merged.nbytes  # in the budget, as its members' views are
        self._within_budget(keep=views[0])
        return merged

    def _catch_up(self, experiment_id: str, view: View, progress: Progress) -> View | None:
        """The view at ``progress``, from ``view`` and the outcomes it lacks; None when a
        fold took outcomes it never added, or the definition changed."""
        latest = self._newer(experiment_id, view, progress.incarnation, progress.version,
                             progress.rewards)
        if latest is not None:  # another request caught up meanwhile
            latest.last_number = max(latest.last_number, progress.decision_seq)
            return latest
        # (A decision from the older view may have learnt a later decision number.)
        last_number = max(view.last_number, progress.decision_seq)
        view = self._from_held(experiment_id, view, progress)
        # The first outcome it lacks, among those progress brought.
        start = view.folded + view.applied - progress.folded - progress.skipped
        if not (progress.incarnation == view.definition.incarnation
                and progress.version == view.version and 0 <= start <= len(progress.unfolded)):
            return None
        if start == len(progress.unfolded) and progress.rewards == view.rewards \
                and not view.behind and self._held.get(experiment_id) is view:
            # Nothing it lacks (a probe that found it current): the view itself, still
            # this worker's, with the policy prepared from it and the propensities
            # computed, which a copy would compute again (BENCHMARKS.md §32).
            view.last_number = max(view.last_number, last_number)
            view.read_at = max(view.read_at, progress.read_at)
            return view
        return self.added(experiment_id, view, progress.unfolded[start:], progress.rewards,
                          progress.folded, max(view.last_number, last_number),
                          read_at=progress.read_at)

    def _from_held(self, experiment_id: str, view: View, progress: Progress) -> View:
        """The view to add ``progress``'s records to: this worker's held view when another
        request caught it up past ``view`` meanwhile (read first from the same older view,
        requests in flight together) and the records cover it, so that what it added is
        not added again; else ``view``."""
        held = self._held.get(experiment_id)
        if held is None or held is view or held.definition is not view.definition \
                or held.version != view.version:
            return view
        start = held.folded + held.applied - progress.folded - progress.skipped
        later = held.folded + held.applied > view.folded + view.applied
        return held if later and 0 <= start <= len(progress.unfolded) else view

    def added(
        self, experiment_id: str, view: View, records: Sequence[bytes], rewards: int,
        folded: int, last_number: int, read_at: float | None = None,
    ) -> View:
        """This worker's view from now: ``view`` with the outcomes ``records`` (the next
        after those it holds) added, at the outcomes counter ``rewards``; ``folded`` of its
        outcomes are in the stored sums. The same bits as reading the statistics.
        ``read_at``: when the records were read (None: they are the worker's own, and the
        view is as old as ``view``)."""
        config = view.definition.config
        sums = {name: value.copy() for name, value in view.sums.items()}
        fold_into(config, sums, view.definition.arm_positions, records)
        state = _read_only(discounted(config, _read_only(sums)))
        held = view.folded + view.applied + len(records)  # outcomes in the new view
        caught = View(view.definition, version=view.version, rewards=rewards,
                      last_number=last_number, state=state, folded=folded,
                      applied=held - folded, raw=None if state is sums else sums,
                      read_at=view.read_at if read_at is None else read_at)
        caught.inherit(view)
        return self._keep(experiment_id, caught)

    async def refresh(self, experiment_id: str, view: View, snapshot: Snapshot) -> View:
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
            definition = await self.definition(experiment_id)
        if snapshot.incarnation != definition.incarnation:
            # Deleted and created again between the two reads (or since the view): its
            # sums are not the definition's. Both read together instead (a fold from a
            # view labelled with one incarnation over another's sums would write them
            # into the experiment: Decisions._held).
            return await self.read_view(experiment_id)
        # Decision numbers start again when the experiment is created again.
        same = definition.incarnation == view.definition.incarnation
        return self._remember(experiment_id, definition, snapshot, view.last_number if same else 0,
                              older=view)

    def _newer(
        self, experiment_id: str, view: View | None, incarnation: str, version: int,
        rewards: int,
    ) -> View | None:
        """The cached view, if another request replaced ``view`` with one at least as new as
        statistics read at (incarnation, version, rewards): requests in flight together get
        stale replies together, and the first one's view serves the others."""
        latest = self._held.get(experiment_id)
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
        sums = _read_only(state_for(config, list(definition.arms), snapshot.stats,
                                    snapshot.unfolded))
        state = _read_only(discounted(config, sums))
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
        self._drop(experiment_id)
        self._held[experiment_id] = view
        self._bytes += view.nbytes + view.own_bytes
        self._within_budget(keep=view)
        return view

    def _within_budget(self, keep: View) -> None:
        """Drop views, least recently used first, until the budget holds or one is left,
        but never ``keep``. (Checked first: every reward and catch-up comes here, and the
        views may be thousands.)"""
        if self._bytes <= self._settings.view_cache_bytes:
            return
        for experiment_id, view in list(self._held.items()):
            if self._bytes <= self._settings.view_cache_bytes or len(self._held) <= 1:
                return
            if view is not keep:
                self.forget(experiment_id)

    def forget(self, experiment_id: str) -> None:
        merged = self._merged.pop(shards.home(experiment_id), None)
        if merged is not None:
            self._bytes -= merged[1].nbytes
        self._drop(experiment_id)

    def _drop(self, experiment_id: str) -> None:
        dropped = self._held.pop(experiment_id, None)
        if dropped is not None:
            self._bytes -= dropped.nbytes + dropped.own_bytes

    async def definition(self, experiment_id: str) -> Definition:
        """The definition of an experiment, or of one of its members (service.shards)."""
        if not valid_experiment_id(shards.home(experiment_id)):
            raise NotFound("no experiment with this id")
        raw = await self._store.read_definition(experiment_id)
        if raw is None:
            self.forget(experiment_id)
            raise NotFound("no experiment with this id")
        return parse_definition(*raw)

    def add_own(self, view: View, appended: Appended | None, applied: int) -> None:
        """``view`` (this worker's current one) is ``applied`` outcomes behind more. It
        keeps the records its reward's reply brought (:attr:`View.own`, counted in the
        view budget) that follow on from those it holds (:attr:`View.reach`): its own
        rewards' in turn, or, when others' outcomes came between, every record it lacks
        (reward.lua sends them then); records it holds already are skipped. And it
        learns the decision numbers taken meanwhile (a seeded decision predicts the next).
        """
        own = view.own if view.own is not None else []
        reach = view.reach
        usable = (appended is not None
                  and appended.incarnation == view.definition.incarnation
                  and appended.version == view.version
                  and len(own) == (view.behind if view.own is not None else 0)
                  and appended.first <= reach
                  and appended.first + len(appended.records) == appended.outcomes)
        lacked = appended.records[reach - appended.first:] if usable and appended else ()
        if not usable or len(own) + len(lacked) > _OWN_RECORDS_KEPT:
            self.drop_own(view)
            view.behind += applied
            return
        assert appended is not None
        own.extend(lacked)
        view.own, view.behind = own, len(own)
        view.last_number = max(view.last_number, appended.decision_seq)
        self._count_own(view, sum(map(len, lacked)))

    def drop_own(self, view: View) -> None:
        """``view`` catches up by reading from now on."""
        view.own = None
        self._count_own(view, -view.own_bytes)

    def _count_own(self, view: View, change: int) -> None:
        view.own_bytes += change
        self._bytes += change
        self._within_budget(keep=view)


def _read_only(state: State) -> State:
    """``state`` with its arrays made read-only: a view's statistics never change (a
    change makes a new view), and a fold may write them back as they are
    (Decisions._held): a write into them is an error, not a silent change of the sums."""
    for value in state.values():
        value.flags.writeable = False
    return state


def _differ(views: Sequence[View]) -> bool:
    """The members' views hold different definitions (incarnation, version, arms)."""
    return len({(v.definition.incarnation, v.definition.version, len(v.definition.arms))
                for v in views}) > 1


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
        check_vector(request.context, bound, "context")
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
        check_vector(r, bound, "arm contexts")
    return np.array(rows, dtype=np.float64)


class Room:
    """A room of the service beside the views (decisions, lifecycle, the decision log): the
    store, the settings, and this worker's views, which they share."""

    def __init__(self, store: Store, settings: Settings, views: Views) -> None:
        self._store = store
        self._settings = settings
        self.views = views
