"""A worker's first view of an experiment: the requests that find none together wait for
one read of the statistics (Views._first_view), not one each, and a wrong key among them
is still refused with nothing kept for it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from service.domain import ArmSpec, ChooseRequest, ExperimentSpec
from service.errors import Forbidden
from service.experiments import ExperimentService

pytestmark = pytest.mark.anyio


def _counted(service: ExperimentService) -> list[str]:
    """The experiment ids the service's store reads whole (read_experiment), as called:
    the real store, each call recorded."""
    store: Any = service._store
    reads: list[str] = []
    real = store.read_experiment

    async def read_experiment(experiment_id: str) -> Any:
        reads.append(experiment_id)
        return await real(experiment_id)

    store.read_experiment = read_experiment
    return reads


@pytest.mark.unsharded  # (one read of the home; a sharded decision also reads its member)
async def test_requests_without_a_view_share_one_read(
        service: ExperimentService, other_service: ExperimentService) -> None:
    arms = tuple(ArmSpec(f"a{i}") for i in range(20))
    _, key = await service.create(ExperimentSpec(id="cold", setting="covariates", dim=4,
                                                 arms=arms))
    reads = _counted(other_service)  # a worker that holds no view of it yet
    request = ChooseRequest(context=(0.1, 0.2, 0.3, 0.4))
    decisions = await asyncio.gather(*(other_service.choose("cold", request, key)
                                       for _ in range(20)))
    assert len({d.decision_id for d in decisions}) == 20
    assert reads == ["cold"]  # one read for the twenty (each of them read it before)
    assert "cold" in other_service.views.held


async def test_a_wrong_key_among_them_is_refused_and_keeps_nothing(
        service: ExperimentService, other_service: ExperimentService) -> None:
    _, key = await service.create(ExperimentSpec(id="cold", setting="covariates", dim=2,
                                                 arms=(ArmSpec("a"), ArmSpec("b"))))
    request = ChooseRequest(context=(0.1, 0.2))
    wrong = await asyncio.gather(*(other_service.choose("cold", request, "not-the-key")
                                   for _ in range(3)), return_exceptions=True)
    assert all(isinstance(answer, Forbidden) for answer in wrong)
    assert "cold" not in other_service.views.held  # nothing kept for a wrong key
    mixed = await asyncio.gather(other_service.choose("cold", request, "not-the-key"),
                                 other_service.choose("cold", request, key),
                                 return_exceptions=True)
    assert isinstance(mixed[0], Forbidden) and not isinstance(mixed[1], BaseException)
    assert "cold" in other_service.views.held
