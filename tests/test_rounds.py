"""The one scheduler of rounds in turns: the orders each comparison runs its settings in."""

from stagebench.core._rounds import in_turns


def test_rounds_go_forth_then_back_and_stop_at_max_rounds_or_when_none_is_named():
    assert list(in_turns(lambda i: "ABC", 3, start=1)) == [(1, list("ABC")), (2, list("CBA")), (3, list("ABC"))]
    asked: list[int] = []
    rounds = in_turns(lambda i: asked.append(i) or ("AB" if i < 2 else ""), 10)
    assert next(rounds) == (0, ["A", "B"]) and asked == [0]  # each round asked once the one before ran
    assert list(rounds) == [(1, ["B", "A"])] and asked == [0, 1, 2]


def test_rounds_there_and_back_then_alternating():
    assert [o for _, o in in_turns(lambda i: "TP", 2, there_and_back=2)] == [list("TPPT")] * 2  # head-to-head
    whole = [o for _, o in in_turns(lambda i: "RVY" if i == 0 else "VY", 4, there_and_back=1)]  # whole runs
    assert whole == [list("RVYYVR"), list("YV"), list("VY"), list("YV")]
