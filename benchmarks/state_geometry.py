"""How alike a backbone's hidden states look to a head: can the states of its first layers tell
one word from another?

    .venv/bin/python benchmarks/state_geometry.py [--backbones bundled,gemma3-270m] \\
        [--layers 1,2,6] [--queries 8] [--passages 20] [--out DIR]

The query-matched head compares each passage's words with the query's by the cosine of their
projected states (LayerNorm, then a linear map: ``methods/heads.state_projection``), through a
kernel in which identical words meet at cosine 1 and others fade. That works only if, at the
head's first step, the states of two different tokens are less alike than two occurrences of
the same token. Some backbones put most of a state's norm in one or two dimensions shared by
every token (the "massive activations" of Sun et al., 2024); LayerNorm does not remove them,
and every token then looks like every other.

For each backbone and layer, over the first ``--passages`` BM25 passages of ``--queries``
DL19 queries (each passage one forward of its own text), the script reports:

- the share of a state's squared norm in its largest dimension (mean over tokens);
- the mean cosine between two different tokens' states after LayerNorm (what the head reads);
- the same after each dimension is standardised over the tokens (mean 0, variance 1);
- the contrast the match needs: mean cosine of two occurrences of the same token minus that
  of two different tokens, after LayerNorm and after standardising.

Writes ``report.md`` and ``results.json`` to ``--out`` (default
``benchmarks/results/state-geometry-cpu``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from machine import load, machine
from serve_harness import ROOT, code_version

from spdrank.backbone.load import load_backbone, load_tokenizer
from spdrank.backbone.settings import BackboneConfig

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "state-geometry-cpu"
DL19 = ROOT.parent / "shared" / "data" / "trec-dl19" / "retrieve_results_dl19.json"
#: Tokens read from each passage (the students read 64).
TOKENS = 64


def passages(path: Path, queries: int, per_query: int) -> list[str]:
    """The first ``per_query`` passages of each of the first ``queries`` queries."""
    records = json.loads(path.read_text())[:queries]
    return [hit["content"] for r in records for hit in r["hits"][:per_query]]


def layer_states(name: str, texts: list[str], layers: list[int]
                 ) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """Each layer's states of every token of ``texts`` (its first TOKENS, the first token of
    each text left out: it carries the attention sink), stacked [T, D], and the token ids [T]."""
    tokenizer = load_tokenizer(name)
    config = BackboneConfig(name_or_path=name, layers=max(layers), dtype="float32", lora=None)
    model = load_backbone(config, device="cpu")
    model.eval()
    states: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
    ids: list[torch.Tensor] = []
    with torch.inference_mode():
        for text in texts:
            encoded = tokenizer(text, return_tensors="pt", truncation=True, max_length=TOKENS)
            out = model(**encoded, output_hidden_states=True)
            for layer in layers:
                states[layer].append(out.hidden_states[layer][0, 1:].float())
            ids.append(encoded["input_ids"][0, 1:])
    return {k: torch.cat(v) for k, v in states.items()}, torch.cat(ids)


def geometry(h: torch.Tensor, ids: torch.Tensor) -> dict[str, float]:
    """The figures of one layer's states ``h`` [T, D] with their token ids [T]."""
    share = (h.pow(2).max(-1).values / h.pow(2).sum(-1)).mean().item()
    same = ids[:, None] == ids[None, :]
    other = ~same
    same.fill_diagonal_(False)
    out = {"top_dim_share": share}
    standardised = (h - h.mean(0)) / h.std(0).clamp(min=1e-6)
    for label, x in (("layernorm", h), ("standardised", standardised)):
        n = F.normalize(F.layer_norm(x, x.shape[-1:]), dim=-1)
        cosine = n @ n.T
        out[f"cosine_{label}"] = cosine[other].mean().item()
        out[f"contrast_{label}"] = (cosine[same].mean() - cosine[other].mean()).item()
    return out


def report(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        "# How alike a backbone's states look to a head",
        "",
        (f"Written by `benchmarks/state_geometry.py` ({meta['date']}, commit {meta['commit']}, "
         f"{meta['machine']}, load {meta['load_before']} before, {meta['load_after']} after). "
         f"{meta['texts']} DL19 passages ({meta['tokens']:,} tokens, the first {TOKENS} of "
         "each, its first token left out), each read alone. The command is in command.txt."),
        "",
        ("| backbone | layer | top dimension's share of the squared norm | cosine of two "
        "tokens after LayerNorm | after standardising | same-token contrast after LayerNorm "
        "| after standardising |"),
        "|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        lines.append(
            f"| {row['backbone']} | {row['layer']} | {row['top_dim_share']:.3f} | "
            f"{row['cosine_layernorm']:.3f} | {row['cosine_standardised']:.3f} | "
            f"{row['contrast_layernorm']:.3f} | {row['contrast_standardised']:.3f} |")
    lines += ["", ("A contrast near zero means the head's match cannot, at its start, tell a "
                   "passage's word that is the query's from one that is not: it must first "
                   "learn to undo the shared dimensions.")]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbones", default="bundled,gemma3-270m")
    parser.add_argument("--layers", default="1,2,6")
    parser.add_argument("--queries", type=int, default=8)
    parser.add_argument("--passages", type=int, default=20)
    parser.add_argument("--retrieved", type=Path, default=DL19)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    torch.set_num_threads(2)
    layers = [int(x) for x in args.layers.split(",")]
    texts = passages(args.retrieved, args.queries, args.passages)
    before = load()
    rows = []
    for name in args.backbones.split(","):
        states, ids = layer_states(name, texts, layers)
        for layer in layers:
            rows.append({"backbone": name, "layer": layer, **geometry(states[layer], ids)})
            print(json.dumps(rows[-1]), flush=True)
    results = {
        "meta": {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                 "commit": code_version(), "machine": machine(), "load_before": before,
                 "load_after": load(), "texts": len(texts), "tokens": len(ids)},
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "report.md").write_text(report(results))
    (args.out / "command.txt").write_text(
        ".venv/bin/python benchmarks/state_geometry.py "
        + " ".join(shlex.quote(a) for a in sys.argv[1:]) + "\n")
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
