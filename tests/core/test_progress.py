"""Progress reports: a bar on a terminal, log lines elsewhere, nothing when turned off."""

import io

from spdrank.core.progress import Progress, track


class Terminal(io.StringIO):
    """A stream that says it is a terminal, as stderr does in an interactive shell."""

    def isatty(self) -> bool:
        return True


def test_progress_lines_come_at_their_interval_and_a_terminal_gets_the_bar(caplog):
    ticks = iter(range(0, 100, 4))  # the clock moves 4 s an item
    with caplog.at_level("INFO", logger="spdrank.core.progress"):
        assert list(track(range(7), "fit", unit="slate", every_s=10, clock=lambda: next(ticks),
                          file=io.StringIO())) == list(range(7))
    assert [r.getMessage().split(",")[0] for r in caplog.records] == [
        "fit: 3 slates", "fit: 6 slates", "fit: 7 slates",
    ]

    screen = Terminal()
    caplog.clear()
    assert list(track(range(3), "eval", unit="slate", total=3, file=screen)) == [0, 1, 2]
    assert "eval: 100%" in screen.getvalue() and caplog.records == []


def test_progress_by_hand_off_a_terminal_logs_its_count_rate_and_figures(caplog):
    ticks = iter(range(0, 100, 5))  # the clock moves 5 s an update
    with caplog.at_level("INFO", logger="spdrank.core.progress"):
        bar = Progress("train", unit="step", total=10, initial=4, every_s=10,
                       clock=lambda: next(ticks), file=io.StringIO())
        for step in range(5, 10):
            bar.update(1, loss=f"{1 / step:.2f}")
        bar.close()
    assert [r.getMessage() for r in caplog.records] == [
        # 2 steps of this run in 10 s: the 4 done before it do not count in the rate
        "train: 6/10 steps, 0.2 steps/s, about 20 s left, loss=0.17",
        "train: 8/10 steps, 0.2 steps/s, about 10 s left, loss=0.12",
        "train: 9/10 steps, 0.2 steps/s, about 6 s left, loss=0.11 (stopped)",
    ]
    caplog.clear()
    ticks = iter(range(0, 100, 20))
    with caplog.at_level("INFO", logger="spdrank.core.progress"):
        bar = Progress("cache states", unit="slate", total=6, every_s=10,
                       clock=lambda: next(ticks), file=io.StringIO())
        bar.update(3)
        bar.update(3)
        bar.close()
    assert [r.getMessage() for r in caplog.records] == [
        "cache states: 3/6 slates, 0.1 slates/s, about 20 s left",
        "cache states: 6/6 slates, 0.1 slates/s",
        "cache states: 6/6 slates, 0.1 slates/s (done)",
    ]


def test_progress_by_hand_on_a_terminal_is_a_bar_with_its_figures(caplog, capsys):
    screen = Terminal()
    with caplog.at_level("INFO", logger="spdrank.core.progress"):
        bar = Progress("teacher", unit="slate", total=4, file=screen)
        bar.update(1, ok="100%", failed=0)
        bar.write("a line of its own")
        bar.update(3, ok="75%", failed=1)
        bar.close()
    assert "teacher: 100%" in screen.getvalue() and "failed=1, ok=75%]" in screen.getvalue()
    assert capsys.readouterr().out == "a line of its own\n" and caplog.records == []


def test_progress_turned_off_reports_nothing_but_still_writes_its_lines(caplog, capsys):
    screen = Terminal()
    with caplog.at_level("INFO", logger="spdrank.core.progress"):
        bar = Progress("train", unit="step", total=3, mode=False, every_s=0, file=screen)
        bar.update(1, loss="0.5")
        bar.write("step 1: R@1 0.5000")
        bar.update(2)
        bar.close()
    assert screen.getvalue() == "" and caplog.records == []
    assert capsys.readouterr().out == "step 1: R@1 0.5000\n"
