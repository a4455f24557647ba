"""EdgeRetention: a run sweeps a bounded number of looks and carries on where it stopped."""

from __future__ import annotations

from tidemq_broker.maintenance.edges import EdgeRetention


class FakeEdges:
    """Children 1..10; the odd ones are gone, one edge each."""

    def __init__(self) -> None:
        self.looks: list[tuple[int, int]] = []

    def forget_orphan_edges(self, after, limit):
        self.looks.append((after, limit))
        children = [c for c in range(1, 11) if c > after][:limit]
        if not children:
            return 0, 0
        return children[-1], sum(1 for c in children if c % 2)


def test_a_run_stops_after_its_batches_and_the_next_goes_on_then_wraps():
    edges = FakeEdges()
    job = EdgeRetention(edges, batch=3, batches=2)
    assert job.run() == 3  # children 1-6: 1, 3, 5 gone
    assert job.run() == 2  # 7-9 and 10: 7, 9
    assert edges.looks == [(0, 3), (3, 3), (6, 3), (9, 3)]
    assert job.run() == 0 and edges.looks[-1] == (10, 3)  # nothing above 10: back to the start
    assert job.run() == 3 and edges.looks[-2:] == [(0, 3), (3, 3)]
