"""Fuzzing the output paths of ``spdrank rank`` and ``spdrank data``: special files, symlinks
(to an input, to a directory, dangling, looping), other spellings of one path, and outputs
that name each other. Property-based (hypothesis), derandomized and bounded, so it runs the
same examples every time, in seconds.

Each example builds a fresh folder of inputs, an unrelated file, links and special files,
runs the command in process, and checks what must hold whatever the paths: the exit status
is what the paths call for (an oracle from what each name is), an error is one line, no
input, unrelated file, link or device changes (their bytes are hashed before and after), only
the outputs' targets are written, and no temporary file or folder is left behind.

The rank model is features-only (no backbone), so a run costs milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spdrank.commands.cli import main
from tests.helpers import save_features_only_model

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

SLATES = "".join(
    json.dumps({
        "query": {"qid": qid, "text": "1. rose shampoo"},
        "candidates": [
            {"docid": "a", "doc": {"title": "argan oil"}, "score": 0.9, "features": {"pop": 3}},
            {"docid": "b", "doc": {"title": "lotion"}, "score": 0.1, "features": {"pop": 0}},
        ],
    }) + "\n"
    for qid in ("u1", "u2")
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_features_only_model(tmp_path_factory.mktemp("fuzz-paths") / "features-spd", 4)


# -- the folder each example runs in ---------------------------------------------------------


def _rank_tree(root: Path) -> None:
    """Inputs, an unrelated file and every kind of path an output might be given."""
    (root / "in.jsonl").write_text(SLATES)
    (root / "other.txt").write_text("unrelated\n")
    (root / "dir").mkdir()
    (root / "dir" / "kept.txt").write_text("kept\n")
    (root / "old.jsonl").write_text("previous results\n")
    os.chmod(root / "old.jsonl", 0o600)
    for name, target in {
        "link_to_in": "in.jsonl", "link_to_dir": "dir", "link_to_old": "old.jsonl",
        "dangling": "fresh.jsonl", "dangling_far": "nowhere/x.jsonl", "loop": "loop",
        "link_to_null": "/dev/null",
    }.items():
        (root / name).symlink_to(target)
    os.link(root / "in.jsonl", root / "hardlink_to_in")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "socket"))
    sock.close()


#: Output names by what they are: which the oracle reads. ``key`` names the file written, so
#: two outputs with one key collide.
RANK_OUTPUTS: dict[str, tuple[str, str]] = {
    "in.jsonl": ("input", "in"),
    "./in.jsonl": ("input", "in"),
    "dir/../in.jsonl": ("input", "in"),
    "link_to_in": ("input", "in"),
    "hardlink_to_in": ("input", "in"),
    "dir": ("refused", "dir"),
    "link_to_dir": ("refused", "dir"),
    "other.txt/x.jsonl": ("refused", "under-file"),
    "dangling_far": ("refused", "far"),
    "loop": ("refused", "loop"),
    "socket": ("refused", "socket"),
    "new.jsonl": ("file", "new"),
    "dir/new.jsonl": ("file", "dir/new"),
    "deep/er/new.jsonl": ("file", "deep"),
    "old.jsonl": ("file", "old"),
    "link_to_old": ("file", "old"),
    "dangling": ("file", "fresh"),
    "link_to_null": ("stream", "null"),  # /dev/null itself: test_output_paths, guarded
}

#: What each output key writes, relative to the folder.
WRITTEN = {"new": "new.jsonl", "dir/new": "dir/new.jsonl", "deep": "deep/er/new.jsonl",
           "old": "old.jsonl", "fresh": "fresh.jsonl"}


def _snapshot(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` (not following links): its kind and, for a file, its bytes'
    digest and mode; a link's target."""
    seen: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                seen[rel] = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                seen[rel] = ("file", hashlib.sha256(path.read_bytes()).hexdigest(),
                             stat.S_IMODE(st.st_mode))
            else:
                seen[rel] = (stat.S_IFMT(st.st_mode),)
    return seen


@contextmanager
def _folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="spdrank-paths-") as name:
        yield Path(name)


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _check_error(code: int, err: str, command: str) -> None:
    if code:
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, err
        assert lines[0].startswith(f"spdrank {command}: error: ") and "Traceback" not in err


def _run_outputs(
    root: Path, argv: list[str], named: list[str], before: dict, command: str
) -> tuple[int, dict, set[str]]:
    """Run ``argv`` in the tree ``root``, whose outputs are ``named`` (keys of RANK_OUTPUTS), and check it: it
    fails in one line exactly when an output is not a plain file or stream or two outputs
    share a file, whatever was there and is not a written output is as it was (links and
    special files included), and a written output kept the mode of the file it replaced.
    Returns the exit code, the tree after, and the files written."""
    code, _, err = _run(argv)
    kinds = [RANK_OUTPUTS[n] for n in named]
    files = [key for kind, key in kinds if kind != "stream"]
    expect_ok = (
        all(kind in ("file", "stream") for kind, _ in kinds) and len(files) == len(set(files))
    )
    assert code == (0 if expect_ok else 2), (argv, err)
    _check_error(code, err, command)
    after = _snapshot(root)
    written = {WRITTEN[key] for kind, key in kinds if kind == "file"} if code == 0 else set()
    for rel, was in before.items():
        if rel in written:
            assert after[rel][0] == "file" and after[rel][2] == was[2], rel
        else:
            assert after.get(rel) == was, rel
    return code, after, written


def _no_temporaries(root: Path) -> None:
    """No temporary file (``.NAME.HEX.tmp``) or folder (``.NAME.XXXX``, ``.NAME.old``) left."""
    left = [
        os.path.join(folder, name)
        for folder, dirs, files in os.walk(root)
        for name in dirs + files
        if name.startswith(".")
    ]
    assert not left, left


# -- rank ------------------------------------------------------------------------------------


@settings(FUZZ, max_examples=60)
@given(
    output=st.sampled_from(sorted(RANK_OUTPUTS)),
    trec=st.one_of(st.none(), st.sampled_from(sorted(RANK_OUTPUTS))),
)
def test_rank_outputs_destroy_nothing(model_dir, output, trec):
    null_before = os.stat("/dev/null")
    with _folder() as root:
        _rank_tree(root)
        before = _snapshot(root)
        argv = ["rank", "--model", str(model_dir), "--input", str(root / "in.jsonl"),
                "--output", str(root / output)]
        named = [output]
        if trec is not None:
            argv += ["--trec", str(root / trec)]
            named.append(trec)
        _, after, written = _run_outputs(root, argv, named, before, "rank")
        new = set(after) - set(before)
        assert new <= written | {"deep", "deep/er"}, new
        for rel in written:
            lines = (root / rel).read_text().splitlines()
            assert len(lines) in (2, 4), rel  # 2 JSONL records, or 2 slates x 2 TREC lines
        _no_temporaries(root)
    null_after = os.stat("/dev/null")
    assert stat.S_ISCHR(null_after.st_mode) and null_after.st_ino == null_before.st_ino


# -- data --out -------------------------------------------------------------------------------


def _log(root: Path) -> None:
    items = [f"i{n}" for n in range(10)]
    (root / "seq.txt").write_text("".join(
        f"u{u} " + " ".join(items[(u + k) % 10] for k in range(4)) + "\n" for u in range(20)
    ))
    (root / "titles.tsv").write_text(
        "item_id\ttitle\n" + "".join(f"{i}\ttitle of {i}\n" for i in items)
    )


@pytest.fixture(scope="module")
def earlier_build(tmp_path_factory) -> Path:
    """A build with a validation split, which a rebuild without one must not leave behind."""
    root = tmp_path_factory.mktemp("earlier")
    _log(root)
    code, _, err = _run(["data", "sequences", "--sequences", str(root / "seq.txt"), "--titles",
                         str(root / "titles.tsv"), "--out", str(root / "built"), "--candidates",
                         "3", "--validation", "2", "--no-progress"])
    assert code == 0, err
    return root / "built"


#: ``--out`` names by what they are: ``build`` an earlier build (replaced with --overwrite,
#: refused without), ``new`` a path to create, ``refused`` refused either way.
DATA_OUTS: dict[str, str] = {
    "built": "build",
    "link_to_built": "build",
    "built/../built": "build",
    "new": "new",
    "new/nested": "new",
    "empty": "new",
    ".": "refused",
    "seq.txt": "refused",
    "other.txt": "refused",
    "other.txt/sub": "refused",
    "link_to_seq": "refused",
}


@settings(FUZZ, max_examples=25)
@given(out=st.sampled_from(sorted(DATA_OUTS)), overwrite=st.booleans())
def test_data_out_destroys_nothing_and_leaves_no_stale_file(earlier_build, out, overwrite):
    with _folder() as root:
        _log(root)
        (root / "other.txt").write_text("unrelated\n")
        (root / "empty").mkdir()
        shutil.copytree(earlier_build, root / "built")
        (root / "link_to_built").symlink_to("built")
        (root / "link_to_seq").symlink_to("seq.txt")
        before = _snapshot(root)
        argv = ["data", "sequences", "--sequences", str(root / "seq.txt"), "--titles",
                str(root / "titles.tsv"), "--out", str(root / out), "--candidates", "3",
                "--no-progress", *(["--overwrite"] if overwrite else [])]
        code, _, err = _run(argv)

        kind = DATA_OUTS[out]
        expect_ok = kind == "new" or (kind == "build" and overwrite)
        assert code == (0 if expect_ok else 2), (argv, err)
        _check_error(code, err, "data")

        after = _snapshot(root)
        target = {"build": "built", "new": out}.get(kind) if code == 0 else None
        for rel, was in before.items():
            if target is None or not (rel == target or rel.startswith(target + "/")):
                assert after.get(rel) == was, rel
        if target is not None:
            assert sorted(p.name for p in (root / target).iterdir()) == [
                "eval.jsonl", "manifest.json", "train.jsonl"
            ]
        assert (root / "link_to_built").is_symlink()
        _no_temporaries(root)


# -- data windows --out ----------------------------------------------------------------------


@settings(FUZZ, max_examples=30)
@given(output=st.sampled_from(sorted(RANK_OUTPUTS)))
def test_data_windows_output_destroys_nothing(output):
    with _folder() as root:
        _rank_tree(root)
        before = _snapshot(root)
        code, _, err = _run(["data", "windows", "--slates", str(root / "in.jsonl"), "--window",
                             "2", "--stride", "1", "--out", str(root / output)])
        kind, key = RANK_OUTPUTS[output]
        assert code == (0 if kind in ("file", "stream") else 2), (output, err)
        _check_error(code, err, "data")
        after = _snapshot(root)
        written = {WRITTEN[key]} if code == 0 and kind == "file" else set()
        for rel, was in before.items():
            if rel in written:
                assert after[rel][0] == "file" and after[rel][2] == was[2], rel
            else:
                assert after.get(rel) == was, rel
        assert set(after) - set(before) <= written | {"deep", "deep/er"}
        for rel in written:
            assert len((root / rel).read_text().splitlines()) == 2  # each slate fits a window
        _no_temporaries(root)


# -- eval --trec-dir -------------------------------------------------------------------------


def _eval_tree(root: Path) -> None:
    """Search slates in a file whose name a ranker's run would take (``random.trec``), a run
    it replays (``runs/bm25.trec``), and links and files a --trec-dir might be given."""
    rows = [{"query": {"qid": q, "text": "q"}, "relevance": {"d1": 1},
             "candidates": [{"docid": f"d{i}", "doc": {"text": f"passage {i}"}}
                            for i in range(3)]} for q in ("q1", "q2")]
    (root / "random.trec").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "runs").mkdir()
    (root / "runs" / "bm25.trec").write_text("".join(
        f"{q} Q0 d{i} {i + 1} {3 - i} mine\n" for q in ("q1", "q2") for i in range(3)))
    (root / "link_to_runs").symlink_to("runs")


#: --trec-dir values by the folder they name (relative to the tree), or ``None``: a file.
TREC_DIRS: dict[str, str | None] = {
    ".": ".", "runs": "runs", "link_to_runs": "runs", "runs/../runs": "runs", "out": "out",
    "out/deep": "out/deep", "random.trec": None, "runs/bm25.trec": None,
}


@settings(FUZZ, max_examples=60)
@given(
    names=st.lists(st.sampled_from(["bm25", "a b", "a_b", "A_B", "q.1"]), unique=True,
                   max_size=3),
    with_random=st.booleans(),
    trec_dir=st.sampled_from(sorted(TREC_DIRS)),
)
def test_eval_trec_dir_destroys_nothing(names, with_random, trec_dir):
    """Every ranker's run file is checked as an output: none may be a file the command reads
    (the slates, a replayed run) or another ranker's (names equal once sanitised)."""
    from spdrank.commands.eval import run_tag

    if not names and not with_random:
        names = ["bm25"]
    with _folder() as root:
        _eval_tree(root)
        before = _snapshot(root)
        argv = ["eval", "--slates", str(root / "random.trec"), "--no-progress",
                "--trec-dir", str(root / trec_dir)]
        argv += [f"--run={name}={root / 'runs' / 'bm25.trec'}" for name in names]
        argv += ["--ranker", "random"] if with_random else []
        code, _, err = _run(argv)

        folder = TREC_DIRS[trec_dir]
        tags = [run_tag(n) for n in names] + (["random"] if with_random else [])
        files = {f"{tag}.trec" if folder == "." else f"{folder}/{tag}.trec" for tag in tags}
        collides = len({t.casefold() for t in tags}) < len(tags) or bool(
            files & {"random.trec", "runs/bm25.trec"})
        assert code == (2 if folder is None or collides else 0), (argv, err)
        _check_error(code, err, "eval")

        after = _snapshot(root)
        written = files if code == 0 else set()
        for rel, was in before.items():
            assert after.get(rel) == was, rel  # no run file replaces anything that was there
        made = {"out": {"out"}, "out/deep": {"out", "out/deep"}}.get(folder or "", set())
        assert set(after) - set(before) == written | (made if code == 0 else set())
        _no_temporaries(root)


# -- teacher --slates-out and --json ---------------------------------------------------------


@settings(FUZZ, max_examples=40)
@given(
    slates_out=st.sampled_from(sorted(RANK_OUTPUTS)),
    summary=st.one_of(st.none(), st.sampled_from(sorted(RANK_OUTPUTS))),
)
def test_teacher_outputs_destroy_nothing(slates_out, summary):
    """The labelled slates and the summary, beside a label file: each checked as rank's
    outputs are, against the slates, the label file and each other."""
    with _folder() as root:
        _rank_tree(root)
        before = _snapshot(root)
        argv = ["teacher", "--slates", str(root / "in.jsonl"), "--backend", "ranker:random",
                "--no-progress", "--out", str(root / "labels.jsonl"),
                "--slates-out", str(root / slates_out)]
        named = [slates_out]
        if summary is not None:
            argv += ["--json", str(root / summary)]
            named.append(summary)
        code, after, written = _run_outputs(root, argv, named, before, "teacher")
        labels = {"labels.jsonl"} if code == 0 else set()
        assert set(after) - set(before) <= written | labels | {"deep", "deep/er"}
        _no_temporaries(root)
