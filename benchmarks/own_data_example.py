"""A small generated shop log, written in the forms users bring their own data in.

    python benchmarks/own_data_example.py --out own-data [--users 400] [--seed 0]

From a fixed seed (the same bytes on every run and machine), it writes into ``--out``:

- ``log.inter`` and ``log.item``: RecBole atomic files (a ``name:type`` header line; one
  interaction a line with a timestamp, users interleaved; item titles and brands);
- ``sequences.txt`` and ``titles.tsv``: the same log as ``user item item ...`` lines (time
  order) and an ``item_id<TAB>title`` table with a header;
- ``candidates.txt``: an upstream retriever's top 30 per user, ``user item:score ...`` best
  first, computed from the user's history alone (the last item is the one to predict); about
  one user in seven has no list, as when a retriever only serves active users.

The log has structure to find: each user shops mostly in one category, and many items have a
follow-up (a shampoo's conditioner) that users tend to buy next, so popularity, co-occurrence,
the titles and the retriever's score all carry signal and none is the whole answer.
docs/own-data.md walks these files through spdrank; tests/benchmarks/test_own_data.py runs
the same commands on them.
"""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass
from pathlib import Path

CATEGORIES: dict[str, tuple[list[str], list[str]]] = {
    "hair": (["Shampoo", "Conditioner", "Hair Mask", "Hair Oil", "Styling Gel", "Dry Shampoo"],
             ["Argan", "Keratin", "Coconut", "Volume", "Repair", "Curl"]),
    "skin": (["Face Serum", "Night Cream", "Cleanser", "Toner", "Sunscreen", "Eye Cream"],
             ["Vitamin C", "Hyaluronic", "Retinol", "Aloe", "Green Tea", "Rose"]),
    "nails": (["Nail Polish", "Top Coat", "Base Coat", "Cuticle Oil", "Polish Remover",
               "Nail File"],
              ["Ruby", "Matte", "Glitter", "Nude", "Quick Dry", "Strengthening"]),
    "makeup": (["Mascara", "Lipstick", "Foundation", "Eyeliner", "Blush", "Concealer"],
               ["Waterproof", "Velvet", "Longwear", "Sheer", "Bold", "Natural"]),
    "fragrance": (["Eau de Parfum", "Body Mist", "Perfume Oil", "Scented Lotion",
                   "Travel Spray", "Gift Set"],
                  ["Vanilla", "Citrus", "Jasmine", "Oud", "Ocean", "Amber"]),
}
BRANDS = ["Lumen", "Verra", "Oakly", "Mirelle", "Pure Field", "Kato", "Nordveil", "Sola"]

#: Items of the retriever's list per user, and the share of users it has no list for.
LIST_SIZE = 30
NO_LIST_EVERY = 7


@dataclass(frozen=True)
class Item:
    item_id: str
    category: str
    title: str
    brand: str
    #: How likely a user picks it among its category's items (Zipf-like).
    weight: float


def catalogue(rng: random.Random, per_category: int = 24) -> list[Item]:
    """``per_category`` distinct titled items in each category, popular ones first."""
    items: list[Item] = []
    for category, (products, adjectives) in CATEGORIES.items():
        names = sorted(
            {(rng.choice(BRANDS), rng.choice(adjectives), rng.choice(products))
             for _ in range(per_category * 4)}
        )
        rng.shuffle(names)
        for rank, (brand, adjective, product) in enumerate(names[:per_category]):
            items.append(Item(
                item_id=f"I{len(items) + 1:04d}", category=category,
                title=f"{brand} {adjective} {product}", brand=brand, weight=1.0 / (rank + 1),
            ))
    return items


def follow_ups(rng: random.Random, items: list[Item]) -> dict[str, str]:
    """Half the items have a follow-up in their own category: what their buyers take next."""
    out: dict[str, str] = {}
    for item in items:
        same = [other for other in items if other.category == item.category and other != item]
        if rng.random() < 0.5:
            out[item.item_id] = rng.choice(same).item_id
    return out


def user_sequence(
    rng: random.Random, items: list[Item], follow: dict[str, str], length: int
) -> list[str]:
    """One user's items in time order: a favourite category, follow-ups, a few strays."""
    favourite = rng.choices(list(CATEGORIES), weights=[5, 4, 3, 2, 1])[0]
    home = [i for i in items if i.category == favourite]
    seq: list[str] = []
    while len(seq) < length:
        last = seq[-1] if seq else None
        draw = rng.random()
        if last in follow and draw < 0.55:
            pick = follow[last]
        elif draw < 0.85:
            pick = rng.choices(home, weights=[i.weight for i in home])[0].item_id
        else:
            pick = rng.choices(items, weights=[i.weight for i in items])[0].item_id
        if pick not in seq:
            seq.append(pick)
    return seq


def retrieve(
    rng: random.Random,
    items: list[Item],
    follow: dict[str, str],
    popularity: dict[str, int],
    history: list[str],
) -> list[tuple[str, float]]:
    """A retriever's top :data:`LIST_SIZE` for a user, from the history alone: the last
    item's category and follow-up, popularity, and noise (it is an imperfect retriever)."""
    by_id = {i.item_id: i for i in items}
    last = by_id[history[-1]]
    top = max(popularity.values())
    scored = []
    for item in items:
        if item.item_id in history:
            continue
        score = (
            1.0 * (item.category == last.category)
            + 0.8 * (follow.get(last.item_id) == item.item_id)
            + 0.5 * math.log1p(popularity.get(item.item_id, 0)) / math.log1p(top)
            + rng.gauss(0.0, 0.35)
        )
        scored.append((item.item_id, round(score, 3)))
    scored.sort(key=lambda pair: (-pair[1], pair[0]))
    return scored[:LIST_SIZE]


def write_example(out: Path, users: int = 400, seed: int = 0) -> dict[str, Path]:
    """Write the example files into ``out``; their paths by name."""
    rng = random.Random(seed)
    items = catalogue(rng)
    follow = follow_ups(rng, items)
    names = [f"u{u + 1:04d}" for u in range(users)]
    sequences = {name: user_sequence(rng, items, follow, rng.randint(4, 12)) for name in names}
    popularity: dict[str, int] = {}
    for seq in sequences.values():
        for item in seq:
            popularity[item] = popularity.get(item, 0) + 1
    lists = {
        name: retrieve(rng, items, follow, popularity, seq[:-1])
        for k, (name, seq) in enumerate(sequences.items())
        if k % NO_LIST_EVERY != NO_LIST_EVERY - 1
    }
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "inter": out / "log.inter",
        "item": out / "log.item",
        "sequences": out / "sequences.txt",
        "titles": out / "titles.tsv",
        "candidates": out / "candidates.txt",
    }
    inter = _inter_lines(rng, sequences)
    _write(paths["inter"], inter)
    _write(paths["item"], ["item_id:token\ttitle:token_seq\tbrand:token"]
           + [f"{i.item_id}\t{i.title}\t{i.brand}" for i in items])
    # Users in the order of their first interaction, as a reader of log.inter meets them, so
    # both forms make byte-identical slate files.
    first_seen = dict.fromkeys(line.split("\t")[0] for line in inter[1:])
    _write(paths["sequences"], [" ".join([name, *sequences[name]]) for name in first_seen])
    _write(paths["titles"], ["item_id\ttitle"] + [f"{i.item_id}\t{i.title}" for i in items])
    _write(paths["candidates"], [
        " ".join([name, *(f"{item}:{score:g}" for item, score in ranked)])
        for name, ranked in lists.items()
    ])
    return paths


def _inter_lines(rng: random.Random, sequences: dict[str, list[str]]) -> list[str]:
    """One line per interaction, every user's in time order, all users' interleaved by time."""
    events = []
    for name, seq in sequences.items():
        time = 1_600_000_000 + rng.randint(0, 30 * 86_400)
        for item in seq:
            time += rng.randint(3_600, 20 * 86_400)
            events.append((time, name, item, rng.choice((3.0, 4.0, 5.0))))
    events.sort()
    header = "user_id:token\titem_id:token\trating:float\ttimestamp:float"
    return [header] + [f"{u}\t{i}\t{r:g}\t{t}" for t, u, i, r in events]


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="directory to write into")
    parser.add_argument("--users", type=int, default=400, help="users in the log (default 400)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    for name, path in write_example(args.out, args.users, args.seed).items():
        lines = sum(1 for _ in path.open(encoding="utf-8"))
        print(f"{name:>10}: {path} ({lines:,} lines)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
