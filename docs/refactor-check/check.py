"""Behaviour check for the ranking-method refactor (issue 19): train one tiny checkpoint per
method, then print everything a user could observe of it, exactly.

    OMP_NUM_THREADS=1 PYTHONPATH=src:. python docs/refactor-check/check.py ROOT TAG > TAG.txt

ROOT holds the tiny backbone, the slates and the checkpoints of every TAG. The run trains each
head afresh into ROOT/TAG/<head> (same seed), and reports on two sets of checkpoints: "saved",
those of the first TAG ever run in ROOT (checkpoints written by the code before the change,
loaded by the code now), and "fresh", those it just trained. The report holds the weights'
digests, each slate's ranking and scores (float reprs), every decoder's order, the errors of
refused settings, and ``spdrank eval``'s metrics (its timings left out), so two runs on
different code agree only if the checkpoints and every number agree.
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path

import torch

from spdrank.core.slates import write_slates
from spdrank.training.train import TrainConfig, train
from tests.helpers import make_slate

HEADS = {
    "attn": {},
    "history": {"frozen": True, "cache": True},
    "scalar": {"frozen": True},
    "first": {},
    "pointwise": {"frozen": True, "cache": True},
    "tokens": {"head": "history", "frozen": True, "readout": "tokens"},
}


def backbone(root: Path) -> str:
    """The tests' tiny Llama (seeded), built once in ROOT."""
    path = root / "backbone"
    if not (path / "config.json").exists():
        from transformers import LlamaConfig, LlamaForCausalLM

        from spdrank.backbone.load import load_tokenizer
        from spdrank.backbone.locate import bundled_backbone_path

        tokenizer = load_tokenizer(str(bundled_backbone_path()))
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=4096, tie_word_embeddings=True,
            pad_token_id=tokenizer.pad_token_id,
        )
        LlamaForCausalLM(config).save_pretrained(path)
        tokenizer.save_pretrained(path)
    return str(path)


def data(root: Path) -> Path:
    path = root / "data"
    if not (path / "eval.jsonl").exists():
        path.mkdir(parents=True, exist_ok=True)
        rng = random.Random(0)
        write_slates(path / "train.jsonl",
                     [make_slate(rng, rng.randint(3, 10), qid=f"u{i}") for i in range(8)])
        write_slates(path / "eval.jsonl",
                     [make_slate(rng, rng.randint(3, 10), qid=f"e{i}") for i in range(6)])
    return path


def config(root: Path, out: Path, head: str, **kw) -> TrainConfig:
    d = data(root)
    settings = {
        "slates": str(d / "train.jsonl"), "eval_slates": str(d / "eval.jsonl"),
        "out": str(out), "backbone": backbone(root), "head": head, "lora_r": 8,
        "lora_alpha": 16, "positions": 16, "head_width": 32, "max_item_tokens": 8,
        "batch_size": 4, "warmup_steps": 2, "eval_every": 0, "save_every": 0,
        "max_steps": 3, "progress": False, "device": "cpu",
    }
    return TrainConfig(**(settings | kw))


def train_all(root: Path, tag: str) -> None:
    for head, how in HEADS.items():
        out = root / tag / head
        if (out / "model" / "config.json").exists():
            continue
        kw = {"frozen": how.get("frozen", False)}
        if how.get("cache"):
            kw["cache_states"] = str(root / tag / f"cache-{head}")
        if how.get("readout"):
            kw["readout"] = how["readout"]
        summary = train(config(root, out, how.get("head", head), **kw))
        print(f"trained {head}: eval {json.dumps(summary['eval'], sort_keys=True)}")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def report(root: Path, label: str, tag: str) -> None:
    from spdrank.compare.decoders import decoder_rows
    from spdrank.core.slates import load_slates
    from spdrank.methods.spd.decode import DECODERS
    from spdrank.model.ranker import SPDRanker

    slates = load_slates(data(root) / "eval.jsonl")
    for head in HEADS:
        model_dir = root / tag / head / "model"
        print(f"== {label} {head}")
        print("config", (model_dir / "config.json").read_text().replace(str(root), "ROOT"))
        for f in sorted(model_dir.rglob("*.safetensors")):
            print("weights", f.relative_to(model_dir), digest(f))
        model = SPDRanker.from_pretrained(model_dir, device="cpu")
        print("name", model.name, "matrix", model.method.matrix, "history", model.reads_history)
        for ranking, slate in zip(model.rank_batch(slates), slates):
            print("rank", slate.query.qid, ranking.docids, [repr(s) for s in ranking.scores])
        for slate in slates[:2]:
            one = model.rank(slate)
            print("rank1", slate.query.qid, one.docids, one.indices)
            scores = model.score_matrix(slate)
            print("scores", slate.query.qid, scores.shape,
                  hashlib.sha256(scores.tobytes()).hexdigest()[:16])
            print("order", model.order(scores).tolist())
        try:
            rows = decoder_rows(model, list(DECODERS))
        except ValueError as exc:
            print("decoder_rows refused:", exc)
        else:
            for row in rows:
                print("row", row.name, [row.rank(s).docids for s in slates])
        if HEADS[head].get("cache"):
            cached_vs_live(root / tag / f"cache-{head}", model)
        windowed(root, label, head, model, model_dir)
        metrics = root / f"eval-{label}-{head}.json"
        subprocess.run(
            [sys.executable, "-m", "spdrank", "eval", "--slates", str(data(root) / "eval.jsonl"),
             "--model", f"{head}={model_dir}", "--device", "cpu", "--no-progress",
             "--json", str(metrics)],
            check=True, capture_output=True, text=True,
        )
        results = json.loads(metrics.read_text())
        for name, ranker in results["rankers"].items():
            print("eval", name, json.dumps(ranker.get("metrics"), sort_keys=True))


def cached_vs_live(cache_dir: Path, model) -> None:
    """The scores of the training slates from their cached states and from a live prefill."""
    from spdrank.core.slates import load_slates
    from spdrank.model.state_cache import open_state_cache

    path = cache_dir.parent.parent / "data" / "train.jsonl"
    slates = load_slates(path)
    cache = open_state_cache(cache_dir / "train", model, path, len(slates), progress=False)
    batch = cache.batch(list(range(len(slates))), slates, model)
    cached, _ = model.score_batch(slates, batch=batch)
    live, _ = model.score_batch(slates)
    print("cached", cached.shape, hashlib.sha256(cached.tobytes()).hexdigest()[:16],
          "live", hashlib.sha256(live.tobytes()).hexdigest()[:16],
          "max diff", f"{abs(cached - live).max():.2e}")
    for ranking, slate in zip(model.rank_batch(slates, batch=batch), slates):
        print("rank cached", slate.query.qid, ranking.docids, [repr(s) for s in ranking.scores])


def long_slates(root: Path) -> Path:
    """Slates over a window of 4 (one over the models' K of 16), in ROOT/data/long.jsonl."""
    path = data(root) / "long.jsonl"
    if not path.exists():
        rng = random.Random(1)
        write_slates(path, [make_slate(rng, n, qid=f"w{n}") for n in (5, 9, 14, 20)])
    return path


def windowed(root: Path, label: str, head: str, model, model_dir: Path) -> None:
    """Sliding windows of 4 over long slates: the Python ranker, the server's engine and
    ``spdrank rank --window`` (its outputs, timings left out, and its summary lines)."""
    from spdrank.core.slates import load_slates
    from spdrank.rankers.windows import WindowedRanker, Windows
    from spdrank.serving.engine import Admitted, Engine

    slates = load_slates(long_slates(root))
    ranker = WindowedRanker(model, Windows(4, 2))
    for slate in slates:
        r = ranker.rank(slate)
        print("window", slate.query.qid, r.docids, r.indices, r.decode_passes,
              [repr(s) for s in r.scores or []])
    engine = Engine(model, "m")
    engine.use_windows(4, 2, 64)
    for slate, ranked in zip(slates, engine.rank([Admitted(s) for s in slates])):
        r = ranked.ranking
        print("engine", slate.query.qid, r.docids, r.decode_passes, [repr(s) for s in r.scores or []],
              ranked.truncated, ranked.query_truncated, ranked.prompt_tokens)
    short = [s for s in slates if len(s) <= 16]
    for slate, ranked in zip(short, Engine(model, "m").rank([Admitted(s) for s in short])):
        r = ranked.ranking
        print("engine1", slate.query.qid, r.docids, [repr(s) for s in r.scores or []],
              ranked.truncated, ranked.prompt_tokens)
    out = root / f"rank-{label}-{head}"
    out.mkdir(exist_ok=True)
    for name, flags in (("plain", ["--input", str(data(root) / "eval.jsonl"),
                                   "--batch-size", "4"]),
                        ("window", ["--input", str(long_slates(root)), "--window", "4"])):
        done = subprocess.run(
            [sys.executable, "-m", "spdrank", "rank", "--model", str(model_dir), "--device",
             "cpu", "--output", str(out / f"{name}.jsonl"), "--trec", str(out / f"{name}.trec"),
             *flags], check=True, capture_output=True, text=True,
        )
        print("rank-cli", name, done.stdout.replace(str(root), "ROOT").strip())
        for line in (out / f"{name}.jsonl").read_text().splitlines():
            record = json.loads(line)
            record.pop("timings_ms")
            print("rank-cli", name, json.dumps(record, sort_keys=True))
        print("rank-cli", name, (out / f"{name}.trec").read_text())
    if head == "attn":
        metrics = out / "eval-window.json"
        subprocess.run(
            [sys.executable, "-m", "spdrank", "eval", "--slates", str(long_slates(root)),
             "--model", f"{head}={model_dir}", "--window", "4", "--device", "cpu",
             "--no-progress", "--json", str(metrics)],
            check=True, capture_output=True, text=True,
        )
        for name, ranker in json.loads(metrics.read_text())["rankers"].items():
            print("eval-window", name, json.dumps(ranker.get("metrics"), sort_keys=True))


def refusals(root: Path) -> None:
    """The errors of settings a method refuses (their messages are part of the behaviour)."""
    from spdrank.backbone.settings import BackboneConfig
    from spdrank.core.features import FeatureNormalizer
    from spdrank.methods.head_config import HeadConfig
    from spdrank.model.config import SPDConfig
    from spdrank.model.parts import NoBackbone, NoTokenizer
    from spdrank.model.ranker import SPDRanker

    cases = {
        "first frozen": {"head": "first", "frozen": True},
        "first cached": {"head": "first", "frozen": True, "cache_states": str(root / "nocache")},
        "scalar cached with LoRA": {"head": "scalar", "cache_states": str(root / "nocache")},
    }
    for what, kw in cases.items():
        head = kw.pop("head")
        try:
            train(config(root, root / "refused", head, **kw))
        except (ValueError, KeyError) as exc:
            print("refused", what, "->", type(exc).__name__, exc)
        else:
            print("refused", what, "-> ACCEPTED")
    features = FeatureNormalizer(("pop",), (0.0,), (1.0,))
    for kind in ("first", "history"):
        try:
            SPDRanker(SPDConfig(backbone=BackboneConfig(lora=None), head=HeadConfig(kind=kind),
                                features=features, features_only=True),
                      NoBackbone(), NoTokenizer())
        except ValueError as exc:
            print("refused", kind, "features-only ->", exc)
    for head, positions in (("first", 60), ("first", 30), ("scalar", 60), ("history", 60)):
        model_config = config(root, root / "refused", head, positions=positions).model_config()
        print("model_config", head, positions, json.dumps(model_config.to_dict(), sort_keys=True)
              .replace(str(root), "ROOT"))
    from spdrank.backbone.prompt import PromptSettings
    from spdrank.methods.first.method import first_prompt

    for positions in (4, 60):
        first = SPDConfig(
            backbone=BackboneConfig(name_or_path=backbone(root), lora=None),
            head=HeadConfig(kind="first", positions=positions),
            prompt=first_prompt(PromptSettings()),
        )
        try:
            model = SPDRanker.build(first)
            print("letters", positions, model.head.token_ids.tolist(), model.name)
        except ValueError as exc:
            print("letters", positions, "->", exc)
    try:
        # A plain prompt given: a config given none gets the one its head trains with.
        SPDRanker.build(SPDConfig(backbone=BackboneConfig(name_or_path=backbone(root), lora=None),
                                  head=HeadConfig(kind="first", positions=4),
                                  prompt=PromptSettings()))
    except ValueError as exc:
        print("first without its prompt ->", exc)


def main() -> None:
    root, tag = Path(sys.argv[1]), sys.argv[2]
    torch.set_num_threads(1)
    root.mkdir(parents=True, exist_ok=True)
    first = root / "FIRST_TAG"
    if not first.exists():
        first.write_text(tag)
    train_all(root, tag)
    report(root, "saved", first.read_text())
    report(root, "fresh", tag)
    refusals(root)


if __name__ == "__main__":
    main()
