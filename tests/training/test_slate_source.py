"""Training slates read as needed: a seeded order per epoch, bounded memory, errors at file:line."""

from __future__ import annotations

import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spdrank.core.files import atomic_writer
from spdrank.core.slates import SlateError, dumps_slate
from spdrank.training.slate_source import IndexedSlates, StreamedSlates, open_slate_source
from tests.helpers import WORDS, make_slate, subprocess_env


@pytest.fixture
def many(tmp_path):
    """Write 40 slates (qids u0..u39) as plain or gzip JSONL; returns the path."""

    def write(name: str, blank_lines: bool = False) -> Path:
        rng = random.Random(1)
        slates = [make_slate(rng, rng.randint(3, 6), qid=f"u{i}") for i in range(40)]
        # Blank lines are skipped, and still counted in line numbers.
        text = "".join(dumps_slate(s) + ("\n\n" if blank_lines else "\n") for s in slates)
        path = tmp_path / name
        with atomic_writer(path) as fh:
            fh.write(text)
        return path

    return write


def qids(slates) -> list[str]:
    return [s.query.qid for s in slates]


def test_index_gives_each_slate_once_per_epoch_in_an_order_of_seed_and_epoch(many):
    path = many("s.jsonl", blank_lines=True)
    source = open_slate_source(path, seed=3)
    assert isinstance(source, IndexedSlates) and len(source) == 40
    epoch0, epoch1 = qids(source.take(0, 0, 40)), qids(source.take(1, 0, 40))
    assert sorted(epoch0) == sorted(epoch1) == sorted(f"u{i}" for i in range(40))
    assert epoch0 != epoch1 and epoch0 != [f"u{i}" for i in range(40)]
    again = open_slate_source(path, seed=3)
    assert qids(again.take(1, 0, 7) + again.take(1, 7, 40)) == epoch1
    assert qids(open_slate_source(path, seed=4).take(0, 0, 40)) != epoch0
    # Read by seeking, a slate is exactly the one in the file (blank lines and all).
    first = source.take(0, 0, 1)[0]
    assert first.to_dict() == next(
        s for s in open_slate_source(path, seed=0).take(0, 0, 40) if s.query.qid == first.query.qid
    ).to_dict()


def test_gzip_stream_is_a_seeded_local_shuffle_that_resumes_by_skipping(many):
    path = many("s.jsonl.gz")
    source = open_slate_source(path, seed=3, buffer_size=8)
    assert isinstance(source, StreamedSlates) and len(source) == 40
    epoch0 = qids(source.take(0, 0, 40))
    assert sorted(epoch0) == sorted(f"u{i}" for i in range(40)) and epoch0 != sorted(epoch0)
    assert qids(source.take(1, 0, 40)) != epoch0
    # A slate comes out no earlier than buffer_size positions before its place in the file.
    assert all(pos >= int(qid[1:]) - 8 for pos, qid in enumerate(epoch0))
    # Batch by batch, or resumed mid-epoch by a new source, the order is the same.
    pieces = open_slate_source(path, seed=3, buffer_size=8)
    assert qids(pieces.take(0, 0, 5) + pieces.take(0, 5, 12) + pieces.take(0, 20, 40)) == (
        epoch0[:12] + epoch0[20:]
    )
    resumed = open_slate_source(path, seed=3, buffer_size=8)
    assert qids(resumed.take(0, 30, 34)) == epoch0[30:34]
    assert qids(resumed.take(0, 2, 4)) == epoch0[2:4]  # going back restarts the epoch


@pytest.mark.parametrize("name", ["s.jsonl", "s.jsonl.gz"])
def test_numbered_slates_carry_their_place_in_the_file(many, name):
    """The place ignores blank lines: it indexes per-slate data such as cached states."""
    source = open_slate_source(many(name, blank_lines=True), seed=3, buffer_size=8)
    numbered = source.take_numbered(1, 0, 40)
    assert [s.query.qid for _, s in numbered] == qids(source.take(1, 0, 40))
    assert all(s.query.qid == f"u{place}" for place, s in numbered)


@pytest.mark.parametrize("name", ["s.jsonl", "s.jsonl.gz"])
def test_limit_reads_only_the_first_slates(many, name):
    path = many(name)
    source = open_slate_source(path, seed=0, limit=5)
    assert sorted(qids(source.take(0, 0, 5))) == [f"u{i}" for i in range(5)]
    with pytest.raises(IndexError):
        source.take(0, 0, 6)


@pytest.mark.parametrize("name", ["s.jsonl", "s.jsonl.gz"])
def test_bad_lines_and_failed_checks_fail_while_indexing_with_file_and_line(many, name):
    path = many(name, blank_lines=True)  # slate u3 is on line 7

    def no_u3(slate):
        if slate.query.qid == "u3":
            raise ValueError("u3 is not wanted")

    with pytest.raises(SlateError, match=rf"^{re.escape(str(path))}:7: u3 is not wanted$"):
        open_slate_source(path, seed=0, check=no_u3)
    assert len(open_slate_source(path, seed=0, check=no_u3, limit=3)) == 3  # never read u3


def test_invalid_json_after_the_limit_is_never_read(tmp_path, many):
    path = many("s.jsonl")
    path.write_text(path.read_text() + "{not json\n")
    assert len(open_slate_source(path, seed=0, limit=40)) == 40
    with pytest.raises(SlateError, match=rf"^{re.escape(str(path))}:41: invalid JSON"):
        open_slate_source(path, seed=0)


def test_a_file_changed_after_indexing_is_refused(many):
    path = many("s.jsonl")
    source = open_slate_source(path, seed=0)
    path.write_text(path.read_text() + path.read_text())
    with pytest.raises(SlateError, match="changed after training started reading it"):
        source.take(0, 0, 1)


def test_a_file_without_slates_is_refused(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(SlateError, match="holds no slates"):
        open_slate_source(tmp_path / "empty.jsonl", seed=0)


# -- memory on a file larger than the run should hold -------------------------------------------

#: Run in a fresh interpreter: index the file, train 3 steps, print the peak RSS in KiB.
TRAIN_AND_MEASURE = """
import resource, sys
from spdrank.training.train import TrainConfig, train
slates, backbone, out = sys.argv[1:]
train(TrainConfig(slates=slates, out=out, backbone=backbone, target="clicks", lora_r=4,
                  lora_alpha=8, positions=8, head_width=16, max_item_tokens=4, batch_size=4,
                  max_steps=3, warmup_steps=1, eval_every=0, save_every=0, device="cpu",
                  progress=False))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def write_small_slates(path: Path, count: int) -> None:
    """``count`` slates of 3-5 candidates with two-word titles, written fast from a pool of
    pre-rendered candidate lists (only the qid is new on each line)."""
    rng = random.Random(0)
    pool = []
    for _ in range(997):
        n = rng.randint(3, 5)
        cands = ",".join(
            f'{{"docid":"d{j}","doc":{{"title":"{rng.choice(WORDS)} {rng.choice(WORDS)}"}}}}'
            for j in range(n)
        )
        pool.append(f'"text":"1. {rng.choice(WORDS)}"}},"candidates":[{cands}],"clicked":["d{rng.randrange(n)}"]}}\n')
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(f'{{"query":{{"qid":"u{i}",{pool[i % len(pool)]}' for i in range(count))


@pytest.mark.bigfile
def test_peak_memory_of_training_does_not_grow_with_the_slate_file(tmp_path, tiny_backbone):
    """Index a 200,000-slate file and train on it: the peak RSS grows by the index, not the file.

    The same run on 2,000 slates is the baseline (interpreter, torch, model). The index costs
    16 bytes a slate and an epoch's permutation 8, so 200,000 slates add ~4.8 MB; holding them
    as parsed slates (``load_slates``, as training once did) adds ~540 MB, ten times the 51 MB
    file. The bound, a quarter of the file's size, leaves room for allocator noise and fails if
    even a fraction of the file were kept.
    """
    small, big = tmp_path / "small.jsonl", tmp_path / "big.jsonl"
    write_small_slates(small, 2_000)
    write_small_slates(big, 200_000)
    started = time.perf_counter()
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", TRAIN_AND_MEASURE, str(path), tiny_backbone, str(tmp_path / path.stem)],
            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for path in (small, big)
    ]
    outputs = [run.communicate() for run in runs]
    for run, (out, err) in zip(runs, outputs):
        assert run.returncode == 0, err[-3000:]
    small_kib, big_kib = (int(out.split()[-1]) for out, _ in outputs)
    growth = (big_kib - small_kib) * 1024
    file_size = big.stat().st_size
    print(f"peak RSS: 2,000 slates {small_kib / 1024:.1f} MiB, 200,000 slates "
          f"{big_kib / 1024:.1f} MiB; growth {growth / 2**20:.1f} MiB for a "
          f"{file_size / 2**20:.1f} MiB file ({time.perf_counter() - started:.0f} s)")
    assert growth < file_size / 4
