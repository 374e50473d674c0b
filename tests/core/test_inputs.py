"""The one input reader (core/inputs.py): which files it reads, how much of them, which bytes,
and where each line starts; every refusal one line naming the file (and line)."""

from __future__ import annotations

import gzip
import os
import threading
from pathlib import Path

import pytest

from spdrank.core.inputs import BOM, input_lines, read_document, read_text
from spdrank.core.validation import SlateError


def _lines(path: Path, **kw) -> list[tuple[int, int, bytes]]:
    return [tuple(line) for line in input_lines(path, "test file", **kw)]


def test_lines_are_numbered_as_an_editor_numbers_them_and_offsets_find_them_again(
    tmp_path: Path,
) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes(BOM + b"one\n\ntwo\r\nthree")
    lines = _lines(path)
    assert lines == [(1, 3, b"one\n"), (2, 7, b"\n"), (3, 8, b"two\r\n"), (4, 13, b"three")]
    with open(path, "rb") as fh:
        for _, offset, raw in lines:
            fh.seek(offset)
            assert fh.readline() == raw


def test_a_byte_order_mark_is_skipped_only_at_the_start(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes(b"a\n" + BOM + b"b\n")
    assert [line.text for line in input_lines(path)] == ["a\n", "\ufeffb\n"]


def test_gzip_is_read_decompressed_and_a_broken_one_is_named(tmp_path: Path) -> None:
    path = tmp_path / "f.txt.gz"
    path.write_bytes(gzip.compress(BOM + b"x\ny\n"))
    assert _lines(path) == [(1, 3, b"x\n"), (2, 5, b"y\n")]
    path.write_bytes(gzip.compress(b"x\n" * 1000)[:-30])
    with pytest.raises(SlateError, match=r"f.txt.gz:\d+: not a readable gzip file"):
        _lines(path)


def test_a_line_is_bounded_at_its_bound_and_the_file_at_its_own(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes(b"12345\n123456\n")
    assert len(_lines(path, max_line=7)) == 2  # "123456\n" is 7 bytes
    with pytest.raises(SlateError, match=r"^.*f.txt:2: a line longer than 6 bytes, the most "
                                         r"a test file line may hold"):
        _lines(path, max_line=6)
    with pytest.raises(SlateError, match=r"f.txt:2: the test file is longer than 10 bytes"):
        _lines(path, max_bytes=10)


def test_a_gzip_bomb_stops_at_the_file_bound(tmp_path: Path) -> None:
    path = tmp_path / "bomb.txt.gz"
    path.write_bytes(gzip.compress(b"a\n" * 5_000_000))  # 10 MB in about 10 kB
    with pytest.raises(SlateError, match=r"bomb.txt.gz:\d+: the test file is longer than "
                                         r"1,000,000 bytes"):
        _lines(path, max_bytes=1_000_000)


def test_bytes_that_are_not_utf8_are_named_by_line_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes(BOM + b"ok\ncaf\xc3\n")
    with pytest.raises(SlateError, match=r"f.txt:2: not UTF-8 text \(byte 4 of the line, at "
                                         r"byte offset 9 of the file: .*\)$"):
        _lines(path)
    # Undecoded for a reader that decodes itself (a journal's torn last line).
    assert _lines(path, utf8=False)[1] == (2, 6, b"caf\xc3\n")


@pytest.mark.parametrize(("target", "kind"), [
    ("/dev/zero", "a character device"), ("/dev/null", "a character device"),
    ("dir", "a directory"),
])
def test_what_is_not_a_file_or_a_pipe_is_refused_before_reading(
    tmp_path: Path, target: str, kind: str
) -> None:
    path = Path(target) if target.startswith("/") else tmp_path / target
    if target == "dir":
        path.mkdir()
    link = tmp_path / "link"
    link.symlink_to(path)
    for given in (path, link):
        with pytest.raises(SlateError, match=rf"^{given} is {kind}: a test file must be a "
                                             r"regular file or a pipe$"):
            _lines(given)
        with pytest.raises(SlateError, match=rf"^{given} is {kind}"):
            read_document(given, "test file")


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(SlateError, match=r"^no such test file: .*/absent$"):
        _lines(tmp_path / "absent")


def test_a_fifo_is_read_once_and_refused_where_a_file_is_read_twice(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "wb") as fh:
            fh.write(b"a\nb\n")

    writer = threading.Thread(target=feed)
    writer.start()
    assert _lines(fifo) == [(1, 0, b"a\n"), (2, 2, b"b\n")]
    writer.join()
    with pytest.raises(SlateError, match=r"fifo is a pipe: a test file is read more than once"):
        _lines(fifo, regular_only=True)


def test_a_document_is_bounded_and_its_mark_skipped(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_bytes(BOM + b'{"a": 1}')
    assert read_document(path, "test file") == b'{"a": 1}'
    with pytest.raises(SlateError, match=r"^.*d.json: the test file is longer than 5 bytes"):
        read_document(path, "test file", limit=5)


def test_a_text_document_is_strict_utf8(tmp_path: Path) -> None:
    path = tmp_path / "preamble.md"
    path.write_bytes(BOM + "# Rows\ncafé\n".encode())
    assert read_text(path, "preamble") == "# Rows\ncafé\n"
    path.write_bytes(b"# Rows\ncaf\xe9\n")
    with pytest.raises(SlateError, match=r"preamble.md: not UTF-8 text \(at byte offset 10 of "
                                         r"the file"):
        read_text(path, "preamble")
    with pytest.raises(SlateError, match=r"^/dev/zero is a character device: a preamble"):
        read_text("/dev/zero", "preamble")
