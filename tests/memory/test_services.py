"""memory.services: what a run is told, ranked by PostgreSQL's full-text search."""

import pytest
from django.contrib.postgres.search import SearchQuery, SearchRank, SearchVector
from django.db.models import F

from memory.models import MemoryScope
from memory.services import _WORD, entries_in_scope, rank_for_task
from tests.factories import GoalFactory, MemoryEntryFactory, TaskFactory

pytestmark = pytest.mark.django_db


def ranked_by_the_orm(task, budget_chars):
    """The ranking as the ORM writes it: the reference the one-shape query must match."""
    words = sorted(set(_WORD.findall(task.instruction.lower())))[:64]
    qs = entries_in_scope(task)
    if words:
        query = SearchQuery(" OR ".join(words), search_type="websearch", config="english")
        qs = qs.annotate(rank=SearchRank(SearchVector("title", "body", config="english"), query))
    else:
        qs = qs.annotate(rank=F("id") * 0.0)
    chosen, used = [], 0
    for entry in qs.order_by("-rank", "-updated_at", "id")[:200]:
        size = len(entry.title) + len(entry.body) + 8
        if used + size <= budget_chars:
            chosen.append((entry.pk, pytest.approx(float(entry.rank or 0.0))))
            used += size
    return chosen


@pytest.mark.parametrize(
    "instruction",
    ["Write the quarterly report in house style.", "?? !!", "parking building report"],
)
@pytest.mark.parametrize("budget", [10_000, 120])
def test_ranking_matches_the_orm_in_every_scope(instruction, budget):
    goal, other = GoalFactory(), GoalFactory()
    MemoryEntryFactory(title="House style", body="Reports use short sentences.")
    MemoryEntryFactory(title="Parking", body="Parking is behind the building.")
    MemoryEntryFactory(title="Off", body="Reports are never late.", active=False)
    MemoryEntryFactory(scope=MemoryScope.GOAL, goal=goal, title="Goal", body="Quarterly report.")
    MemoryEntryFactory(scope=MemoryScope.GOAL, goal=other, title="Other goal", body="Report.")
    MemoryEntryFactory(scope=MemoryScope.TAG, tag="finance", title="Tag", body="Report in euros.")
    MemoryEntryFactory(scope=MemoryScope.TAG, tag="legal", title="Legal", body="Report to counsel.")
    for task in (
        TaskFactory(instruction=instruction),
        TaskFactory(instruction=instruction, goal=goal, tags=["finance", "ops"]),
    ):
        got = [(e.pk, r) for e, r in rank_for_task(task, budget_chars=budget)]
        assert got == ranked_by_the_orm(task, budget)
        assert got  # something in scope fits, so the comparison says something


def test_the_best_match_comes_first_and_out_of_scope_never():
    MemoryEntryFactory(title="Unrelated", body="Parking is behind the building.")
    MemoryEntryFactory(title="House style", body="Reports use short sentences.")
    MemoryEntryFactory(scope=MemoryScope.TAG, tag="legal", title="Legal", body="Reports in style.")
    task = TaskFactory(instruction="Write a short report in house style.")
    chosen = rank_for_task(task, budget_chars=10_000)
    assert [e.title for e, _ in chosen] == ["House style", "Unrelated"]
    assert chosen[0][1] > 0 and chosen[1][1] == 0.0
    assert chosen[0][0].body == "Reports use short sentences." and chosen[0][0].pk
