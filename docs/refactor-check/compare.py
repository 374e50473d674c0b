"""Compare two outputs of check.py line by line: how many lines differ, of which kind, whether
any ranking orders its items otherwise, and the largest change of a printed score.

    python docs/refactor-check/compare.py before.txt after.txt
"""

from __future__ import annotations

import ast
import re
import sys
from collections import Counter


def ranking(line: str) -> tuple[list[str], list[float]]:
    """A ``rank SLATE [docids] [scores]`` line's order and its scores."""
    order, scores = line.split(" ", 2)[2].split("] [", 1)
    return ast.literal_eval(order + "]"), [float(v) for v in re.findall(r"'([^']+)'", scores)]


def main(before: str, after: str) -> int:
    old, new = open(before).read().splitlines(), open(after).read().splitlines()
    if len(old) != len(new):
        print(f"the outputs differ in length: {len(old)} and {len(new)} lines")
        return 1
    kinds: Counter[str] = Counter()
    reordered, largest = 0, 0.0
    for a, b in zip(old, new):
        if a == b:
            continue
        kinds[" ".join(a.split()[:2])] += 1
        if a.startswith("rank "):
            (order_a, scores_a), (order_b, scores_b) = ranking(a), ranking(b)
            reordered += order_a != order_b
            largest = max(largest, *(abs(x - y) for x, y in zip(scores_a, scores_b)))
    print(f"{sum(kinds.values())} of {len(old)} lines differ: "
          + (", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) or "none"))
    print(f"rankings ordered otherwise: {reordered}; largest change of a printed score: {largest:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
