"""Output paths a command must not destroy or lose: a symlink's target is what gets written
(with its mode), a stream (/dev/null, /dev/stdout, a FIFO) is written in place, an output that
names an input or another output is refused, SIGTERM leaves no temporary file, and ``data``
replaces its folder whole. Ids a TREC run cannot carry and a titles TSV without a header are
here too: both were accepted silently.

The model is features-only (no backbone), so a ``rank`` run costs milliseconds in process and
a couple of seconds in a subprocess.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest

from spdrank.commands.cli import TERMINATED, main
from spdrank.core.files import check_outputs, output_target
from spdrank.datasets.titles import read_titles
from tests.helpers import save_features_only_model, subprocess_env

K = 4


def slate(qid: str = "u1", docids: tuple[str, str] = ("a", "b")) -> dict:
    return {
        "query": {"qid": qid, "text": "1. rose shampoo"},
        "candidates": [
            {"docid": docids[0], "doc": {"title": "argan oil"}, "score": 0.9,
             "features": {"pop": 3}},
            {"docid": docids[1], "doc": {"title": "lotion"}, "score": 0.1, "features": {"pop": 0}},
        ],
    }


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_features_only_model(tmp_path_factory.mktemp("outputs") / "features-spd", K)


@pytest.fixture
def slates_file(tmp_path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(slate("u1")) + "\n" + json.dumps(slate("u2")) + "\n")
    return path


def rank(model_dir: Path, slates: Path, output: str | Path, *extra: str) -> int:
    return main(["rank", "--model", str(model_dir), "--input", str(slates), "--output",
                 str(output), *extra])


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# -- symlinks, devices, FIFOs ----------------------------------------------------------------


def test_a_symlinked_output_writes_its_target_and_stays_a_link(tmp_path, model_dir, slates_file):
    target = tmp_path / "results" / "ranked.jsonl"
    target.parent.mkdir()
    target.write_text("previous\n")
    link = tmp_path / "ranked.jsonl"
    link.symlink_to(target)
    assert rank(model_dir, slates_file, link) == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert [json.loads(line)["query"]["qid"] for line in target.read_text().splitlines()] == [
        "u1", "u2"
    ]
    assert leftovers(tmp_path) == [] and leftovers(target.parent) == []


def test_a_link_to_dev_null_is_written_in_place(tmp_path, model_dir, slates_file):
    before = os.stat("/dev/null")
    link = tmp_path / "null.jsonl"
    link.symlink_to("/dev/null")
    assert rank(model_dir, slates_file, link) == 0
    assert link.is_symlink()
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino
    assert leftovers(tmp_path) == []


def test_dev_null_itself_is_never_replaced(tmp_path, model_dir, slates_file):
    # Checked first without writing: if /dev/null were not taken for a stream, the run below
    # could replace the machine's /dev/null (as root).
    assert output_target("/dev/null").stream
    before = os.stat("/dev/null")
    assert rank(model_dir, slates_file, "/dev/null", "--trec", "/dev/null") == 0
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (
        before.st_ino, before.st_rdev
    )
    assert not [p for p in Path("/dev").iterdir() if p.name.startswith(".null.")]


def test_a_fifo_is_written_in_place(tmp_path, model_dir, slates_file):
    fifo = tmp_path / "results.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    assert rank(model_dir, slates_file, fifo) == 0
    reader.join(timeout=30)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert [json.loads(line)["query"]["qid"] for line in got[0].decode().splitlines()] == [
        "u1", "u2"
    ]


def _rank_process(model_dir: Path, slates: Path, output: str, **kw) -> subprocess.CompletedProcess:
    env = subprocess_env() | {"OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "spdrank", "rank", "--model", str(model_dir), "--input",
         str(slates), "--output", output],
        env=env, timeout=300, check=False, **kw,
    )


@pytest.mark.parametrize("into", ["pipe", "file"])
def test_dev_stdout_prints_the_results(tmp_path, model_dir, slates_file, into):
    """Through a pipe, or a shell's ``> file`` (which /dev/stdout then names: replacing that
    file would leave the descriptor the shell opened pointing at nothing)."""
    assert output_target("/dev/stdout").stream  # before a run that could replace it
    if into == "pipe":
        done = _rank_process(model_dir, slates_file, "/dev/stdout", capture_output=True,
                             text=True)
        printed = done.stdout
    else:
        redirected = tmp_path / "redirected.jsonl"
        with open(redirected, "w") as fh:
            done = _rank_process(model_dir, slates_file, "/dev/stdout", stdout=fh,
                                 stderr=subprocess.PIPE, text=True)
        printed = redirected.read_text()
    assert done.returncode == 0, done.stderr
    # JSONL only: the summary goes to stderr beside results on stdout.
    assert [json.loads(line)["query"]["qid"] for line in printed.splitlines()] == ["u1", "u2"]
    assert "ranked 2 slates" in done.stderr
    assert os.path.islink("/dev/stdout")


# -- modes -----------------------------------------------------------------------------------


def test_rewriting_an_output_keeps_its_mode(tmp_path, model_dir, slates_file):
    out = tmp_path / "private.jsonl"
    out.write_text("previous\n")
    out.chmod(0o600)
    assert rank(model_dir, slates_file, out) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert "previous" not in out.read_text()


def test_a_new_output_gets_the_umasks_mode(tmp_path, model_dir, slates_file):
    old = os.umask(0o027)
    try:
        assert rank(model_dir, slates_file, tmp_path / "new.jsonl") == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.jsonl").stat().st_mode) == 0o640


# -- outputs that name an input or another output --------------------------------------------


def test_the_input_as_output_is_refused(tmp_path, model_dir, slates_file, capsys):
    before = slates_file.read_bytes()
    assert rank(model_dir, slates_file, slates_file) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--output" in line and "--input" in line and "the same file" in line
    assert slates_file.read_bytes() == before


@pytest.mark.parametrize("how", ["symlink", "hardlink", "dotted"])
def test_another_name_for_the_input_is_refused(tmp_path, model_dir, slates_file, capsys, how):
    before = slates_file.read_bytes()
    other = tmp_path / "other.jsonl"
    if how == "symlink":
        other.symlink_to(slates_file)
    elif how == "hardlink":
        os.link(slates_file, other)
    else:
        other = tmp_path / "." / "sub" / ".." / slates_file.name
        (tmp_path / "sub").mkdir()
    assert rank(model_dir, slates_file, other) == 2
    assert "the same file as --input" in one_error_line(capsys.readouterr().err)
    assert slates_file.read_bytes() == before


def test_output_and_trec_on_one_file_are_refused(tmp_path, model_dir, slates_file, capsys):
    out = tmp_path / "x"
    assert rank(model_dir, slates_file, out, "--trec", str(out)) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--trec" in line and "--output" in line
    assert not out.exists() and leftovers(tmp_path) == []


def test_eval_and_teacher_refuse_an_output_over_their_slates(tmp_path, slates_file, capsys):
    before = slates_file.read_bytes()
    code = main(["eval", "--slates", str(slates_file), "--ranker", "random", "--json",
                 str(slates_file)])
    assert code == 2 and "--json" in one_error_line(capsys.readouterr().err)
    code = main(["teacher", "--slates", str(slates_file), "--out", str(slates_file),
                 "--backend", "ranker:random"])
    assert code == 2 and "--out" in one_error_line(capsys.readouterr().err)
    # The default --slates-out (<stem>.slates.jsonl beside --out) counts too.
    labelled = tmp_path / "labels.slates.jsonl"
    labelled.write_bytes(before)
    code = main(["teacher", "--slates", str(labelled), "--out", str(tmp_path / "labels.jsonl"),
                 "--backend", "ranker:random"])
    assert code == 2 and "--slates-out" in one_error_line(capsys.readouterr().err)
    assert slates_file.read_bytes() == before and labelled.read_bytes() == before


# -- paths that cannot be written ------------------------------------------------------------


def test_an_output_under_a_file_is_one_line(tmp_path, model_dir, slates_file, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder\n")
    for output in (blocker / "x.jsonl", blocker / "deeper" / "x.jsonl"):
        assert rank(model_dir, slates_file, output) == 2
        line = one_error_line(capsys.readouterr().err)
        assert str(output) in line and "is a file, not a directory" in line
    assert blocker.read_text() == "not a folder\n"


@pytest.mark.parametrize("kind", ["directory", "socket", "loop"])
def test_an_output_that_is_no_file_is_refused(tmp_path, model_dir, slates_file, capsys, kind):
    import socket

    path = tmp_path / kind
    if kind == "directory":
        path.mkdir()
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
    else:
        path.symlink_to(path)
    assert rank(model_dir, slates_file, path) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(path) in line
    assert {"directory": stat.S_ISDIR, "socket": stat.S_ISSOCK, "loop": stat.S_ISLNK}[kind](
        os.lstat(path).st_mode
    )


# -- SIGTERM ---------------------------------------------------------------------------------


def _writer_of(fifo: Path, proc: subprocess.Popen) -> IO[str]:
    """The writing end of ``fifo``, once ``proc`` opens it for reading (a process that ended
    first fails the test instead of leaving it waiting for a reader that never comes)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "rank never opened its input"
        time.sleep(0.05)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "w")


def open_temporaries(pid: int, folder: Path) -> list[str]:
    """The temporaries ``pid`` holds open in ``folder``: an unnamed file (``O_TMPFILE``, which
    ``/proc`` shows as ``folder/#INODE (deleted)``) or a hidden ``.NAME.HEX.tmp`` sibling."""
    held = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed since it was listed
            continue
        name = target.removeprefix(f"{folder}/")
        if name != target and (name.startswith("#") or name.endswith(".tmp")):
            held.append(name)
    return held


def _await_temporary(proc: subprocess.Popen, folder: Path) -> None:
    deadline = time.monotonic() + 120
    while not open_temporaries(proc.pid, folder) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.05)
    assert open_temporaries(proc.pid, folder), "the command never opened its temporary output"


def test_sigterm_during_rank_removes_the_temporary_and_keeps_the_output(tmp_path, model_dir):
    """The input is a FIFO that never ends, so rank is caught mid-write, its temporary open."""
    fifo = tmp_path / "slow.jsonl"
    os.mkfifo(fifo)
    out = tmp_path / "ranked.jsonl"
    out.write_text("previous\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "spdrank", "rank", "--model", str(model_dir), "--input",
         str(fifo), "--output", str(out)],
        env=subprocess_env() | {"OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        with _writer_of(fifo, proc) as writer:  # once rank reads it, its temporary made
            writer.write(json.dumps(slate("u1")) + "\n")
            writer.flush()
            _await_temporary(proc, tmp_path)
            time.sleep(0.5)  # into the read of the line that never comes
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == TERMINATED, err
    assert err.strip().splitlines()[-1] == "spdrank rank: terminated"
    assert leftovers(tmp_path) == []
    assert out.read_text() == "previous\n"


def test_sigkill_during_data_windows_leaves_no_temporary(tmp_path):
    """A kill no handler sees (SIGKILL, the OOM killer) mid-write leaves the folder as it was:
    the output is filled as a file without a name until it is complete."""
    from spdrank.core.files import _unnamed_file

    fd = _unnamed_file(tmp_path)
    if fd is None:
        pytest.skip("this file system has no unnamed files (O_TMPFILE)")
    os.close(fd)
    fifo = tmp_path / "labelled.jsonl"
    os.mkfifo(fifo)
    out = tmp_path / "windows.jsonl"
    out.write_text("previous\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "spdrank", "data", "windows", "--slates", str(fifo), "--window",
         "2", "--stride", "1", "--out", str(out)],
        env=subprocess_env() | {"OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        with _writer_of(fifo, proc) as writer:
            writer.write(json.dumps(slate("u1")) + "\n")
            writer.flush()
            _await_temporary(proc, tmp_path)
            proc.kill()
            proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["labelled.jsonl", "windows.jsonl"]
    assert out.read_text() == "previous\n"


# -- data --out ------------------------------------------------------------------------------


def _log_files(tmp_path: Path, header: bool = True) -> tuple[Path, Path]:
    items = [f"i{n}" for n in range(12)]
    seqs = tmp_path / "seq.txt"
    seqs.write_text("".join(
        f"u{u} " + " ".join(items[(u + k) % 12] for k in range(5)) + "\n" for u in range(30)
    ))
    titles = tmp_path / "titles.tsv"
    rows = [f"{item}\ttitle of {item}" for item in items]
    titles.write_text("\n".join((["item_id\ttitle"] if header else []) + rows) + "\n")
    return seqs, titles


def _data(seqs: Path, titles: Path, out: Path, *extra: str) -> int:
    return main(["data", "sequences", "--sequences", str(seqs), "--titles", str(titles),
                 "--out", str(out), "--candidates", "4", "--no-progress", *extra])


def test_data_refuses_a_non_empty_out_and_replaces_it_whole_with_overwrite(tmp_path, capsys):
    seqs, titles = _log_files(tmp_path)
    out = tmp_path / "built"
    assert _data(seqs, titles, out, "--validation", "3") == 0
    assert (out / "valid.jsonl").exists()
    out.chmod(0o750)
    capsys.readouterr()
    assert _data(seqs, titles, out) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--out" in line and "--overwrite" in line
    assert (out / "valid.jsonl").exists()  # refused: nothing changed
    assert _data(seqs, titles, out, "--overwrite") == 0
    assert not (out / "valid.jsonl").exists()
    assert sorted(p.name for p in out.iterdir()) == ["eval.jsonl", "manifest.json", "train.jsonl"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o750
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_data_into_an_empty_or_new_folder_needs_no_overwrite(tmp_path):
    seqs, titles = _log_files(tmp_path)
    (tmp_path / "empty").mkdir()
    assert _data(seqs, titles, tmp_path / "empty") == 0
    assert _data(seqs, titles, tmp_path / "new" / "nested") == 0
    assert (tmp_path / "new" / "nested" / "train.jsonl").exists()


def test_data_refuses_an_out_holding_its_input_even_with_overwrite(tmp_path, capsys):
    seqs, titles = _log_files(tmp_path)
    before = seqs.read_bytes()
    assert _data(seqs, titles, tmp_path, "--overwrite") == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--sequences" in line and "inside --out" in line
    assert seqs.read_bytes() == before


def test_a_failed_data_build_leaves_out_as_it_was(tmp_path, capsys):
    seqs, titles = _log_files(tmp_path)
    out = tmp_path / "built"
    assert _data(seqs, titles, out) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert _data(seqs, titles, out, "--overwrite", "--candidates", "400") == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# -- titles without a header line ------------------------------------------------------------


def test_a_titles_tsv_without_a_header_keeps_its_first_row(tmp_path, caplog):
    seqs, titles = _log_files(tmp_path, header=False)
    out = tmp_path / "built"
    with caplog.at_level(logging.WARNING):
        assert _data(seqs, titles, out) == 0
    assert f"{titles}:1 has no header line" in caplog.text and "'i0'" in caplog.text
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["untitled_items"] == 0


def test_a_titles_header_is_still_skipped(tmp_path, caplog):
    _, titles = _log_files(tmp_path)
    with caplog.at_level(logging.WARNING):
        read = read_titles(titles, known_items={"i0", "i1"})
    assert "item_id" not in read and read["i0"] == "title of i0" and not caplog.text


# -- ids a TREC run cannot carry -------------------------------------------------------------


@pytest.mark.parametrize(
    ("qid", "docids", "field", "code"),
    [
        ("u\x001", ("a", "b"), "query.qid", "U+0000"),
        ("u\u202e1", ("a", "b"), "query.qid", "U+202E"),
        ("u1", ("\u200b", "b"), "candidates[0].docid", "U+200B"),
        ("u1", ("a", "b\u00a0c"), "candidates[1].docid", "U+00A0"),
    ],
    ids=["nul_qid", "rtl_override_qid", "zero_width_docid", "nbsp_docid"],
)
def test_trec_refuses_control_and_format_characters(
    tmp_path, model_dir, capsys, qid, docids, field, code
):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(slate("u0")) + "\n" + json.dumps(slate(qid, docids)) + "\n")
    out, trec = tmp_path / "o.jsonl", tmp_path / "o.trec"
    assert rank(model_dir, path, out, "--trec", str(trec)) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{path}:2" in line and field in line and code in line
    assert not out.exists() and not trec.exists()


def test_check_outputs_leaves_streams_out_of_the_comparison(tmp_path):
    check_outputs({"--input": tmp_path / "in"}, {"--output": "/dev/null", "--trec": "/dev/null"})
    with pytest.raises(ValueError, match="--trec .* same file as --output"):
        check_outputs({}, {"--output": tmp_path / "a", "--trec": tmp_path / "a"})


# -- eval --trec-dir: run files named after the rankers --------------------------------------


def _search_slates(path: Path) -> Path:
    rows = [
        {"query": {"qid": qid, "text": "q"}, "relevance": {"d1": 1},
         "candidates": [{"docid": f"d{i}", "doc": {"text": f"passage {i}"}} for i in range(4)]}
        for qid in ("q1", "q2")
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _run_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{q} Q0 d{i} {i + 1} {5 - i} mine\n" for q in ("q1", "q2")
                            for i in range(4)))
    return path


def _eval(slates: Path, *extra: str) -> int:
    return main(["eval", "--slates", str(slates), "--no-progress", *extra])


def test_eval_trec_dir_refuses_to_overwrite_a_run_it_reads(tmp_path, capsys):
    slates = _search_slates(tmp_path / "s.jsonl")
    run = _run_file(tmp_path / "runs" / "bm25.trec")
    before = run.read_bytes()
    assert _eval(slates, "--run", f"bm25={run}", "--trec-dir", str(run.parent)) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"--trec-dir {run}" in line and f"--run {run}" in line
    assert run.read_bytes() == before and sorted(p.name for p in run.parent.iterdir()) == [
        "bm25.trec"]


@pytest.mark.parametrize("role", ["--qrels", "--slates"])
def test_eval_trec_dir_refuses_to_overwrite_its_judgements_or_slates(tmp_path, capsys, role):
    slates = _search_slates(tmp_path / "s.jsonl")
    if role == "--qrels":
        victim = tmp_path / "random.trec"
        victim.write_text("q1 0 d1 1\n")
        argv = ["--slates", str(slates), "--qrels", str(victim)]
    else:
        victim = tmp_path / "random.trec"
        victim.write_bytes(slates.read_bytes())
        argv = ["--slates", str(victim)]
    before = victim.read_bytes()
    code = main(["eval", *argv, "--ranker", "random", "--trec-dir", str(tmp_path),
                 "--no-progress"])
    assert code == 2
    assert role in one_error_line(capsys.readouterr().err)
    assert victim.read_bytes() == before


def test_eval_trec_dir_refuses_names_that_share_a_file(tmp_path, capsys):
    slates = _search_slates(tmp_path / "s.jsonl")
    run = _run_file(tmp_path / "r.trec")
    out = tmp_path / "out"
    assert _eval(slates, "--run", f"a b={run}", "--run", f"a_b={run}",
                 "--trec-dir", str(out)) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "'a b'" in line and "'a_b'" in line and "a_b.trec" in line
    assert not out.exists()


def test_eval_trec_dir_writes_one_run_a_ranker(tmp_path):
    slates = _search_slates(tmp_path / "s.jsonl")
    run = _run_file(tmp_path / "r.trec")
    out = tmp_path / "out"
    assert _eval(slates, "--run", f"first stage={run}", "--ranker", "random",
                 "--trec-dir", str(out)) == 0
    assert sorted(p.name for p in out.iterdir()) == ["first_stage.trec", "random.trec"]
    assert {line.split()[-1] for line in (out / "first_stage.trec").read_text().splitlines()} == {
        "first_stage"}


def test_rank_refuses_an_output_over_its_prompt_file(tmp_path, model_dir, slates_file, capsys):
    prompt = tmp_path / "prompt.json"
    prompt.write_text("{}\n")
    assert rank(model_dir, slates_file, prompt, "--prompt", str(prompt)) == 2
    assert "--prompt" in one_error_line(capsys.readouterr().err)
    assert prompt.read_text() == "{}\n"


def test_train_refuses_an_out_that_holds_its_slates_as_a_file_it_writes(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    slates = run / "train.json"  # the name of the summary the run writes under --out
    slates.write_text(json.dumps(slate("u1")) + "\n" + json.dumps(slate("u2")) + "\n")
    before = slates.read_bytes()
    code = main(["train", "--slates", str(slates), "--out", str(run), "--features-only",
                 "--features", "pop", "--head", "attn", "--positions", "4", "--no-progress"])
    assert code == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"--out {slates}" in line and "--slates" in line
    assert slates.read_bytes() == before and sorted(p.name for p in run.iterdir()) == [
        "train.json"]


def test_an_unnamed_output_is_copied_in_where_it_cannot_be_linked(tmp_path, monkeypatch):
    """A file system that makes unnamed files but refuses to link one in still gets the
    output, whole and with the mode of the file it replaces."""
    from spdrank.core.files import atomic_writer

    out = tmp_path / "out.jsonl"
    out.write_text("previous\n")
    out.chmod(0o640)

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EPERM, "linking refused")

    monkeypatch.setattr(os, "link", refuse)
    with atomic_writer(out) as fh:
        fh.write("new\n")
    assert out.read_text() == "new\n" and stat.S_IMODE(out.stat().st_mode) == 0o640
    assert leftovers(tmp_path) == []
