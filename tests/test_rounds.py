"""The one scheduler of rounds in turns: the orders each comparison runs its settings in."""

from stagebench.core._rounds import in_turns


def test_rounds_in_turns_orders():
    # the loader's and the job's rounds: forth, then back, numbered from start, until max_rounds
    assert list(in_turns(lambda i: "ABC", 3, start=1)) == [(1, list("ABC")), (2, list("CBA")), (3, list("ABC"))]
    # each round is asked for once the one before ran; none named ends the rounds
    asked: list[int] = []
    rounds = in_turns(lambda i: asked.append(i) or ("AB" if i < 2 else ""), 10)
    assert next(rounds) == (0, ["A", "B"]) and asked == [0]
    assert list(rounds) == [(1, ["B", "A"])] and asked == [0, 1, 2]
    # the head-to-head: T P P T in every round; the whole runs: forth and back once, then back, forth, back
    assert [o for _, o in in_turns(lambda i: "TP", 2, there_and_back=2)] == [list("TPPT")] * 2
    whole = [o for _, o in in_turns(lambda i: "RVY" if i == 0 else "VY", 4, there_and_back=1)]
    assert whole == [list("RVYYVR"), list("YV"), list("VY"), list("YV")]
