"""The one scheduler of rounds in turns: the orders each comparison runs its settings in."""

from stagebench.core._rounds import in_turns


def test_rounds_go_forth_then_back_every_other_round_until_max_rounds():
    assert list(in_turns(lambda i: "ABC", 3)) == [(0, list("ABC")), (1, list("CBA")), (2, list("ABC"))]
    assert [n for n, _ in in_turns(lambda i: "AB", 2, start=5)] == [5, 6]


def test_no_settings_end_the_rounds_and_each_round_is_asked_after_the_one_before():
    asked: list[int] = []

    def settings(i: int) -> str:
        asked.append(i)
        return "AB" if i < 2 else ""

    rounds = in_turns(settings, 10)
    assert next(rounds) == (0, ["A", "B"]) and asked == [0]
    assert list(rounds) == [(1, ["B", "A"])] and asked == [0, 1, 2]


def test_rounds_there_and_back_then_alternating():
    # threads against processes: T P P T in every round
    assert [o for _, o in in_turns(lambda i: ("T", "P"), 2, there_and_back=2)] == [list("TPPT")] * 2
    # whole runs: forth and back once, then the extra rounds back, forth, back
    orders = [o for _, o in in_turns(lambda i: "RVY" if i == 0 else "VY", 4, there_and_back=1)]
    assert orders == [list("RVYYVR"), list("YV"), list("VY"), list("YV")]
