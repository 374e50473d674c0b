"""The lexical retriever score the Beauty builder adds: TF-IDF cosine with the history's titles."""

import math

import pytest

from spdrank.core.slates import load_slates
from spdrank.datasets.build import build_from_files
from spdrank.datasets.options import BuildOptions
from spdrank.datasets.title_similarity import TitleSimilarity, tokens

CATALOGUE = [
    "Maybelline Great Lash Mascara, Black",
    "Maybelline Fit Me Foundation, Light",
    "OPI Nail Lacquer, Big Apple Red",
    "Neutrogena Oil-Free Acne Wash, 6 Ounce",
    "Burt's Bees Lip Balm, 0.15 Ounce",
]


def test_tokens_are_lower_cased_runs_of_letters_and_digits():
    assert tokens("Burt's Bees Lip Balm, 0.15 Ounce") == [
        "burt", "s", "bees", "lip", "balm", "0", "15", "ounce",
    ]
    assert tokens("Crème_Brûlée 2-in-1") == ["crème", "brûlée", "2", "in", "1"]
    assert tokens("  ,;  ") == []


def test_identical_titles_score_one_and_disjoint_titles_zero():
    sim = TitleSimilarity(CATALOGUE)
    assert sim(["OPI Nail Lacquer, Big Apple Red"], ["OPI Nail Lacquer, Big Apple Red"]) == [1.0]
    assert sim(["OPI Nail Lacquer, Big Apple Red"], ["Burt's Bees Lip Balm"]) == [0.0]
    assert sim([], ["OPI Nail Lacquer"]) == [0.0]  # no history: nothing to be close to
    assert sim(["Maybelline Great Lash Mascara"], [""]) == [0.0]  # no tokens at all


def test_the_closest_history_title_counts_and_brands_count_more_than_common_words():
    sim = TitleSimilarity(CATALOGUE)
    history = ["Neutrogena Oil-Free Acne Wash, 6 Ounce", "Maybelline Great Lash Mascara, Black"]
    brand, unit, none = sim(history, [
        "Maybelline Fit Me Foundation, Light",  # the brand of one history item
        "Burt's Bees Lip Balm, 0.15 Ounce",     # only "ounce", in two catalogue titles
        "OPI Nail Lacquer, Big Apple Red",
    ])
    assert brand > unit > none == 0.0
    # Order does not matter, and the largest of the cosines is kept (not their sum).
    assert sim(history[::-1], ["Maybelline Fit Me Foundation, Light"]) == [brand]
    assert sim(history[1:], ["Maybelline Fit Me Foundation, Light"]) == [brand]


def test_the_score_is_the_tf_idf_cosine_by_hand():
    sim = TitleSimilarity(["a b", "a c", "d"])  # n = 3; df: a 2, b 1, c 1, d 1
    idf = {t: math.log(4 / (1 + df)) + 1 for t, df in {"a": 2, "b": 1, "c": 1}.items()}
    ab = [idf["a"], idf["b"]]
    ac = [idf["a"], idf["c"]]
    expected = idf["a"] ** 2 / (math.hypot(*ab) * math.hypot(*ac))
    assert sim(["a b"], ["a c"]) == [pytest.approx(expected, abs=1e-6)]
    # A token no catalogue title has weighs as if in none of them.
    assert sim(["a z"], ["z"])[0] == pytest.approx(
        (math.log(4) + 1) / math.hypot(idf["a"], math.log(4) + 1), abs=1e-6
    )


def test_any_tokenizer_gives_the_terms():
    # Case-sensitive terms, as a language model's tokens are: "Nail" and "nail" differ.
    sim = TitleSimilarity(["Nail Polish", "nail file"], tokenize=str.split)
    assert sim(["Nail Polish"], ["nail file"]) == [0.0]
    assert TitleSimilarity(["Nail Polish", "nail file"])(["Nail Polish"], ["nail file"])[0] > 0.0


def test_the_builder_adds_it_from_the_titles_of_the_history_and_candidates(tmp_path):
    seqs = tmp_path / "seq.txt"
    seqs.write_text("".join(f"u{u} a b c\n" for u in range(4)) + "u4 a d\n", encoding="utf-8")
    titles = tmp_path / "titles.tsv"
    rows = {"a": "Maybelline Mascara", "b": "OPI Nail Lacquer", "c": "Maybelline Foundation",
            "d": "Burt's Bees Lip Balm"}
    titles.write_text(
        "item_id\ttitle\n" + "".join(f"{i}\t{t}\n" for i, t in rows.items()), encoding="utf-8"
    )
    cands = tmp_path / "c.txt"
    cands.write_text("".join(f"u{u} c d b\n" for u in range(5)), encoding="utf-8")
    result = build_from_files(
        seqs, titles, tmp_path / "out",
        BuildOptions(candidates=3, history=2, features=True, eval_fraction=0.4),
        candidate_file=cands, progress=False,
    )
    sim = TitleSimilarity(rows.values())
    slates = load_slates(result.train_path) + load_slates(result.eval_path)
    assert sorted(s.query.qid for s in slates) == ["u0", "u1", "u2", "u3", "u4"]
    assert len(load_slates(result.eval_path)) == 2
    for slate in slates:
        history = [rows[i] for i in slate.query.history]
        expected = sim(history, [rows[c.docid] for c in slate.candidates])
        assert [c.features["title_similarity"] for c in slate.candidates] == expected
        by_id = {c.docid: c.features["title_similarity"] for c in slate.candidates}
        assert "a" in slate.query.history  # Maybelline mascara in every user's history
        assert by_id["c"] > 0.0 and by_id["d"] == 0.0
