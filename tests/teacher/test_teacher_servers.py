"""The server pool's choices (no HTTP: the clients are never used) and the list of servers.

The openai backend over real loopback servers is tested in test_teacher_openai.py.
"""

import threading
import time

import pytest

from spdrank.commands.cli import main
from spdrank.teacher.servers import Server, ServerPool, collect_base_urls


def make_pool(n: int = 2, limit: int = 1, backoff_s: float = 60.0) -> ServerPool:
    return ServerPool([Server(f"http://s{i}:8000/v1", client=None) for i in range(n)], limit, backoff_s)


def acquire_in_thread(pool: ServerPool, **kwargs) -> tuple[threading.Thread, list]:
    got: list = []
    thread = threading.Thread(target=lambda: got.append(pool.acquire(**kwargs)), daemon=True)
    thread.start()
    return thread, got


def test_least_loaded_first_and_a_full_pool_waits_for_a_slot():
    pool = make_pool(limit=2)
    a, b = pool
    assert [pool.acquire() for _ in range(3)] == [a, b, a]
    pool.release(a)
    assert pool.acquire() is b  # b: 1 in flight, a: 1 in flight but more used
    assert (a.in_flight, b.in_flight) == (1, 2)
    assert pool.acquire() is a
    thread, got = acquire_in_thread(pool)  # all 4 slots taken
    time.sleep(0.1)
    assert thread.is_alive()
    pool.release(b)
    thread.join(5)
    assert got == [b]


def test_a_failed_server_leaves_rotation_until_it_answers():
    pool = make_pool(backoff_s=60.0)
    a, b = pool
    assert pool.acquire() is a
    pool.release(a, failure="connection refused")
    assert a.failures == 1 and 30.0 <= a.down_until - time.monotonic() <= 60.0
    for _ in range(3):  # only b while a is out, though a is less used
        assert pool.acquire() is b
        pool.release(b)
    # A request that has tried b may still go to a: when all it may try are out, the soonest back.
    assert pool.acquire(exclude={b}) is a
    pool.release(a, failure="refused again")  # the same outage: not counted twice
    assert a.failures == 1
    assert pool.acquire(exclude={a, b}) is None  # tried them all
    assert pool.acquire(exclude={b}) is a
    pool.release(a)  # it answered: back in rotation
    assert (a.failures, a.down_until) == (0, 0.0)
    assert pool.acquire() is a


def test_back_off_doubles_while_a_server_keeps_failing():
    pool = make_pool(n=1, backoff_s=0.05)
    (a,) = pool
    for k in range(3):
        assert pool.acquire() is a
        time.sleep(max(0.0, a.down_until - time.monotonic()))  # wait until it is back
        before = time.monotonic()
        pool.release(a, failure="down")
        after = time.monotonic()
        # 0.05 * 2**k, jittered down to half; the pause began between before and after
        assert a.down_until - before >= 0.05 * 2**k / 2 and a.down_until - after <= 0.05 * 2**k
    assert a.failures == 3


def test_a_full_pool_takes_a_server_as_soon_as_it_is_back():
    pool = make_pool(limit=1, backoff_s=0.2)
    a, b = pool
    pool.take_out(a, "unreachable at start")
    assert pool.acquire() is b  # b in rotation and free; now b is full and a is out
    thread, got = acquire_in_thread(pool)
    thread.join(5)  # woken when a's back-off ends (at most 0.2 s), not by a release
    assert got == [a]


def test_close_ends_waiting_for_a_slot():
    pool = make_pool(n=1)
    assert pool.acquire() is not None
    thread, got = acquire_in_thread(pool)
    time.sleep(0.05)
    pool.close()
    thread.join(5)
    assert got == [None] and pool.acquire() is None and pool.closed.is_set()


def test_server_list_from_flags_and_file(tmp_path):
    listing = tmp_path / "servers.txt"
    listing.write_text(
        "# the GPU boxes\n"
        "http://gpu0:8000/v1\n"
        "\n"
        "   https://gpu1.example.org/v1/   # behind a proxy\n"
    )
    assert collect_base_urls(["http://localhost:8080/v1"], listing) == [
        "http://localhost:8080/v1", "http://gpu0:8000/v1", "https://gpu1.example.org/v1",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("http://a:8000/v1\ngpu1:8000/v1\n", ":2: not a server URL"),
        ("http://a:8000/v1\n# c\nhttp://a:99999/v1\n", ":3: not a server URL"),
        ("http://a:8000/v1\nhttp://b/v1 http://c/v1\n", ":2: not a server URL"),
        ("http://a:8000/v1\n\nhttp://a:8000/v1/\n", ":3: http://a:8000/v1 is listed twice (first at {path}:1)"),
        ("# nothing but comments\n\n", ": no server URLs in it"),
    ],
)
def test_bad_server_lists_name_file_and_line(tmp_path, text, message):
    listing = tmp_path / "servers.txt"
    listing.write_text(text)
    with pytest.raises(ValueError) as info:
        collect_base_urls([], listing)
    assert str(info.value).startswith(f"{listing}{message.format(path=listing)}")


def test_bad_server_list_is_a_usage_error_before_any_work(tmp_path, capsys):
    (tmp_path / "slates.jsonl").write_text("")
    (tmp_path / "servers.txt").write_text("http://a:8000/v1\nftp://b/v1\n")
    code = main(["teacher", "--slates", str(tmp_path / "slates.jsonl"), "--out", str(tmp_path / "l.jsonl"),
                 "--backend", "openai", "--base-urls-file", str(tmp_path / "servers.txt"),
                 "--base-url", "http://a:8000/v1"])
    err = capsys.readouterr().err
    assert code == 2 and f"{tmp_path / 'servers.txt'}:1: http://a:8000/v1 is listed twice" in err
    assert not (tmp_path / "l.jsonl").exists()
    code = main(["teacher", "--slates", str(tmp_path / "slates.jsonl"), "--out", str(tmp_path / "l.jsonl"),
                 "--backend", "openai", "--base-url", "localhost:8000"])
    assert code == 2 and "--base-url: not a server URL" in capsys.readouterr().err
