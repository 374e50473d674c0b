"""Every method's heads: shapes, padding, permutation equivariance, features, old checkpoints."""

import pytest
import torch

from spdrank.methods.first.head import FirstHead
from spdrank.methods.head_config import HeadConfig
from spdrank.methods.scalar.head import ScalarHead
from spdrank.methods.spd.history_settings import HistorySettings
from spdrank.methods.spd.method import SPDMethod

#: SPD's heads that read the candidates alone; the history head has its own tests below.
MATRIX_HEADS = sorted(k for k in SPDMethod.kinds if k not in SPDMethod.history_kinds)


def build_head(
    hidden: int, cfg: HeadConfig, features: int = 0, units: bool = False
) -> torch.nn.Module:
    """The head of ``cfg.kind`` over ``hidden`` states (0: none), as its method builds it;
    ``units``: several states per item (the tokens or words readout)."""
    if cfg.kind == "scalar":
        return ScalarHead(hidden, cfg, features)
    return SPDMethod().head(cfg, hidden, features, units)


@pytest.mark.parametrize("kind", MATRIX_HEADS)
def test_shape_and_padding_independence(kind):
    torch.manual_seed(0)
    head = build_head(24, HeadConfig(kind=kind, positions=12, width=16, heads=2)).eval()
    a = torch.randn(1, 5, 24)
    alone = head(a, torch.ones(1, 5, dtype=torch.bool))
    assert alone.shape == (1, 5, 12)
    # The same slate padded to 9 items next to a longer slate in one batch.
    batch = torch.randn(2, 9, 24) * 100  # loud garbage in the padding
    batch[0, :5] = a[0]
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[0, :5] = True
    mask[1, :] = True
    padded = head(batch, mask)
    torch.testing.assert_close(padded[0, :5], alone[0], rtol=1e-5, atol=1e-5)
    assert (padded[0, 5:] == 0).all()


@pytest.mark.parametrize("kind", MATRIX_HEADS)
def test_items_are_permutation_equivariant(kind):
    torch.manual_seed(1)
    head = build_head(8, HeadConfig(kind=kind, positions=6, width=16, heads=2)).eval()
    h = torch.randn(1, 6, 8)
    mask = torch.ones(1, 6, dtype=torch.bool)
    perm = torch.randperm(6)
    torch.testing.assert_close(head(h[:, perm], mask), head(h, mask)[:, perm], rtol=1e-5, atol=1e-5)


def _learned_positions(head, target, *inputs):
    """Train ``head`` to score item i highest at position ``target[i]``; each item's best
    position afterwards. A head whose scores ignored the position would score every position
    of an item alike and could not learn a target other than its ties' order."""
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
    head.train()
    for _ in range(60):
        loss = torch.nn.functional.cross_entropy(head(*inputs)[0], target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return head.eval()(*inputs)[0].argmax(dim=1).tolist()


@pytest.mark.parametrize("kind", MATRIX_HEADS)
def test_scores_depend_on_position(kind):
    torch.manual_seed(0)
    head = build_head(8, HeadConfig(kind=kind, positions=6, width=16, heads=2, dropout=0.0))
    target = torch.tensor([5, 3, 1, 0, 2, 4])
    h, mask = torch.randn(1, 6, 8), torch.ones(1, 6, dtype=torch.bool)
    assert _learned_positions(head, target, h, mask) == target.tolist()


def test_spd_builds_only_its_own_heads():
    with pytest.raises(ValueError, match=r"'scalar' is no SPD head: choose one of \['attn', "):
        SPDMethod().head(HeadConfig(kind="scalar"), 8)


def test_scalar_head_gives_one_score_per_item_independent_of_padding():
    head = build_head(8, HeadConfig(kind="scalar", width=16)).eval()
    h = torch.randn(1, 3, 8)
    alone = head(h, torch.ones(1, 3, dtype=torch.bool))
    assert alone.shape == (1, 3) and not head.matrix
    padded = torch.cat([h, torch.randn(1, 2, 8)], 1)
    mask = torch.tensor([[True, True, True, False, False]])
    torch.testing.assert_close(head(padded, mask)[0, :3], alone[0])


# -- upstream features -----------------------------------------------------------------------

ALL_HEADS = [*MATRIX_HEADS, "scalar"]


@pytest.mark.parametrize("kind", ALL_HEADS)
@pytest.mark.parametrize("hidden", [24, 0])  # 0: features alone, no hidden states
def test_features_are_read_and_padding_still_cannot_leak(kind, hidden):
    torch.manual_seed(0)
    head = build_head(hidden, HeadConfig(kind=kind, positions=12, width=16, heads=2), 3).eval()
    h = torch.randn(1, 5, 24) if hidden else None
    f = torch.randn(1, 5, 3)
    mask = torch.ones(1, 5, dtype=torch.bool)
    alone = head(h, mask, f)
    assert alone.shape == ((1, 5, 12) if head.matrix else (1, 5))
    assert not torch.allclose(head(h, mask, f + torch.randn(1, 5, 3)), alone)  # features matter
    # Padded next to a longer slate, with loud garbage in the padded states and features.
    hb = torch.randn(2, 8, 24) * 100 if hidden else None
    fb = torch.randn(2, 8, 3) * 100
    if hidden:
        hb[0, :5] = h[0]
    fb[0, :5] = f[0]
    mb = torch.ones(2, 8, dtype=torch.bool)
    mb[0, 5:] = False
    padded = head(hb, mb, fb)
    torch.testing.assert_close(padded[0, :5], alone[0], rtol=1e-5, atol=1e-5)
    assert (padded[0, 5:] == 0).all()


def test_a_head_needs_some_input():
    with pytest.raises(ValueError, match="needs hidden states or features"):
        build_head(0, HeadConfig(kind="attn"), 0)
    head = build_head(8, HeadConfig(kind="linear", positions=4), 2)
    with pytest.raises(ValueError, match="reads features, but none were given"):
        head(torch.randn(1, 3, 8), torch.ones(1, 3, dtype=torch.bool))


def test_first_head_adds_a_linear_map_of_the_features_to_the_letter_logits():
    head = FirstHead([5, 7, 9], features=2)
    logits = torch.randn(1, 12)
    f = torch.randn(1, 3, 2)
    mask = torch.ones(1, 3, dtype=torch.bool)
    expected = logits[:, [5, 7, 9]] + head.features(f).squeeze(-1)
    torch.testing.assert_close(head(logits, mask, f), expected)
    assert torch.equal(FirstHead([5, 7, 9])(logits, mask), logits[:, [5, 7, 9]])


@pytest.mark.parametrize(
    "kind,old_names",
    [
        ("linear", {"proj.0.": "norm.", "proj.1.": "out."}),
        ("scalar", {"proj.0.": "mlp.0.", "proj.1.": "mlp.1.", "out.1.": "mlp.3."}),
    ],
)
def test_weights_under_earlier_layer_names_are_refused_saying_what_to_do(
    tmp_path, kind, old_names
):
    """A head's weights are read only under its layers' names: the linear and scalar heads'
    earlier names are refused, naming the file and what to do, not mapped."""
    from safetensors.torch import save_file

    from spdrank.model.checkpoint import load_head

    cfg = HeadConfig(kind=kind, positions=6, width=16)
    old = {}
    for key, value in build_head(8, cfg).state_dict().items():
        prefix = next(p for p in old_names if key.startswith(p))
        old[old_names[prefix] + key[len(prefix):]] = value.contiguous()
    path = tmp_path / "head.safetensors"
    save_file(old, str(path))
    with pytest.raises(ValueError, match=rf"^{path}: the weights do not fit the head .*"
                       r"norm\./out\. and mlp\.\*.*train the model again with this version$"):
        load_head(build_head(8, cfg), path)


# -- the history head ------------------------------------------------------------------------


def _history_head(features: int = 0):
    torch.manual_seed(0)
    cfg = HeadConfig(kind="history", positions=12, width=16, heads=2, dropout=0.0)
    return build_head(24, cfg, features).eval()


def test_history_head_padding_of_items_and_history_cannot_leak():
    head = _history_head(features=2)
    h, f = torch.randn(1, 5, 24), torch.randn(1, 5, 2)
    hist = torch.randn(1, 3, 24)
    alone = head(h, torch.ones(1, 5, dtype=torch.bool), f, hist, torch.ones(1, 3, dtype=torch.bool))
    assert alone.shape == (1, 5, 12)
    hb, fb, histb = torch.randn(2, 8, 24) * 100, torch.randn(2, 8, 2) * 100, torch.randn(2, 6, 24) * 100
    hb[0, :5], fb[0, :5], histb[0, :3] = h[0], f[0], hist[0]
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[0, 5:] = False
    hmask = torch.ones(2, 6, dtype=torch.bool)
    hmask[0, 3:] = False
    padded = head(hb, mask, fb, histb, hmask)
    torch.testing.assert_close(padded[0, :5], alone[0], rtol=1e-5, atol=1e-5)
    assert (padded[0, 5:] == 0).all()


def test_history_head_reads_the_history_and_is_equivariant_in_the_items():
    head = _history_head()
    h, hist = torch.randn(1, 6, 24), torch.randn(1, 4, 24)
    mask, hmask = torch.ones(1, 6, dtype=torch.bool), torch.ones(1, 4, dtype=torch.bool)
    m = head(h, mask, None, hist, hmask)
    assert not torch.allclose(head(h, mask, None, torch.randn(1, 4, 24), hmask), m)
    perm = torch.randperm(6)
    torch.testing.assert_close(head(h[:, perm], mask, None, hist, hmask), m[:, perm], rtol=1e-5, atol=1e-5)
    target = torch.tensor([5, 3, 1, 0, 2, 4])
    assert _learned_positions(head, target, h, mask, None, hist, hmask) == target.tolist()


def test_history_head_matches_candidates_with_the_closest_history_item():
    head = _history_head()
    history = torch.randn(1, 3, 24)
    cands = torch.cat([history[:, 1:2], torch.randn(1, 1, 24)], dim=1)  # a copy, a stranger
    hmask = torch.tensor([[True, True, False]])  # the third history item is padding
    stats = head.match(cands, history, hmask)
    q = torch.nn.functional.normalize(head.match_query(cands), dim=-1)
    k = torch.nn.functional.normalize(head.match_key(history), dim=-1)
    sims = q @ k.transpose(1, 2)
    torch.testing.assert_close(stats[0, :, 0], sims[0, :, :2].max(-1).values)
    torch.testing.assert_close(stats[0, :, 1], sims[0, :, :2].mean(-1))
    torch.testing.assert_close(stats[0, :, 2], sims[0, :, 1])  # the most recent real item


def test_history_head_ranks_a_slate_without_history():
    head = _history_head()
    empty = torch.zeros(2, 1, 24)
    out = head(torch.randn(2, 4, 24), torch.ones(2, 4, dtype=torch.bool), None, empty,
               torch.zeros(2, 1, dtype=torch.bool))
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match="needs a backbone"):
        build_head(0, HeadConfig(kind="history"), 2)
    with pytest.raises(ValueError, match="history items' states"):
        head(torch.randn(1, 4, 24), torch.ones(1, 4, dtype=torch.bool))


def _token_head(match: str = "maxsim"):
    torch.manual_seed(0)
    cfg = HeadConfig(kind="history", positions=12, width=16, heads=2, dropout=0.0,
                     history=HistorySettings(match=match))
    return build_head(24, cfg, units=True).eval()


def test_tfidf_match_is_a_weighted_sum_over_pairs_of_units_through_the_kernel():
    head = _token_head("tfidf")
    h, hist = torch.randn(1, 2, 4, 24), torch.randn(1, 3, 4, 24)
    item_tokens, history_tokens = torch.tensor([[3, 1]]), torch.tensor([[2, 4, 1]])
    hmask = torch.tensor([[True, True, False]])
    stats = head.match_tfidf(h, item_tokens, hist, history_tokens, hmask)
    norm = torch.nn.functional.normalize
    sharp = head.log_sharpness.exp()

    def weights(units):
        w = torch.nn.functional.softplus(head.token_weight(units).squeeze(-1)) + 1e-6
        return w / w.norm()

    per_item = torch.zeros(2, 2)
    for i in range(2):
        units = h[0, i, : item_tokens[0, i]]
        for j in range(2):
            other = hist[0, j, : history_tokens[0, j]]
            cos = norm(head.match_query(units), dim=-1) @ norm(head.match_query(other), dim=-1).T
            kernel = torch.exp(sharp * (cos - 1))
            per_item[i, j] = weights(units) @ kernel @ weights(other)
    torch.testing.assert_close(stats[0, :, 0], per_item.max(-1).values)
    torch.testing.assert_close(stats[0, :, 1], per_item.mean(-1))
    torch.testing.assert_close(stats[0, :, 2], per_item[:, 1])


def test_tfidf_match_of_an_item_with_itself_is_one():
    head = _token_head("tfidf")
    h = torch.randn(1, 1, 4, 24)
    lengths = torch.tensor([[3]])
    stats = head.match_tfidf(h, lengths, h.clone(), lengths, torch.ones(1, 1, dtype=torch.bool))
    # Kernel 1 on the diagonal, below 1 elsewhere: at least the weights' unit norm.
    assert stats[0, 0, 0] >= 1.0 - 1e-5
    with pytest.raises(ValueError, match="unknown match"):
        HeadConfig.from_dict({"kind": "history", "match": "bm25"})


def test_token_match_is_the_weighted_mean_of_each_tokens_best_cosine():
    head = _token_head()
    h, hist = torch.randn(1, 2, 4, 24), torch.randn(1, 3, 4, 24)
    item_tokens, history_tokens = torch.tensor([[3, 1]]), torch.tensor([[2, 4, 1]])
    hmask = torch.tensor([[True, True, False]])
    stats = head.match_tokens(h, item_tokens, hist, history_tokens, hmask)
    norm = torch.nn.functional.normalize
    per_item = torch.zeros(2, 2)
    for i in range(2):
        tokens = h[0, i, : item_tokens[0, i]]
        w = torch.nn.functional.softplus(head.token_weight(tokens).squeeze(-1)) + 1e-6
        for j in range(2):
            keys = norm(head.match_key(hist[0, j, : history_tokens[0, j]]), dim=-1)
            best = (norm(head.match_query(tokens), dim=-1) @ keys.T).max(-1).values
            per_item[i, j] = (w * best).sum() / w.sum()
    torch.testing.assert_close(stats[0, :, 0], per_item.max(-1).values)
    torch.testing.assert_close(stats[0, :, 1], per_item.mean(-1))
    torch.testing.assert_close(stats[0, :, 2], per_item[:, 1])


@pytest.mark.parametrize("match", ["maxsim", "tfidf"])
def test_token_head_ignores_padded_token_slots_items_and_history(match):
    head = _token_head(match)
    if match == "tfidf":  # the direct path starts at zero: make it count
        torch.nn.init.normal_(head.match_positions.weight)
    h, hist = torch.randn(1, 3, 4, 24), torch.randn(1, 2, 4, 24)
    lengths, hlengths = torch.tensor([[2, 4, 1]]), torch.tensor([[3, 1]])
    mask, hmask = torch.ones(1, 3, dtype=torch.bool), torch.ones(1, 2, dtype=torch.bool)
    alone = head(h, mask, None, hist, hmask, lengths, hlengths)
    loud = h.clone()
    loud[0, 0, 2:] = 100.0  # garbage in candidate 0's padded token slots
    hb = torch.randn(2, 5, 4, 24) * 100
    hb[0, :3] = loud[0]
    histb = torch.randn(2, 4, 4, 24) * 100
    histb[0, :2] = hist[0]
    histb[0, 0, 3:] = -50.0  # and in a history item's
    mb = torch.ones(2, 5, dtype=torch.bool)
    mb[0, 3:] = False
    hmb = torch.ones(2, 4, dtype=torch.bool)
    hmb[0, 2:] = False
    lb, hlb = torch.full((2, 5), 4), torch.full((2, 4), 4)
    lb[0, :3], hlb[0, :2] = lengths[0], hlengths[0]
    padded = head(hb, mb, None, histb, hmb, lb, hlb)
    torch.testing.assert_close(padded[0, :3], alone[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="matches tokens"):
        head(h.mean(2), mask, None, hist.mean(2), hmask)


# -- the head's record in config.json --------------------------------------------------------


@pytest.mark.parametrize(("readout", "units"), [("last", False), ("mean", False), ("words", True)])
def test_config_json_states_units_from_the_readout_and_refuses_a_record_that_disagrees(
    readout, units
):
    from spdrank.backbone.prompt import PromptSettings
    from spdrank.backbone.settings import ConfigError
    from spdrank.model.config import SPDConfig

    config = SPDConfig(head=HeadConfig(kind="history"), prompt=PromptSettings(readout=readout))
    record = config.to_dict()
    assert record["head"]["tokens"] is units
    assert list(record["head"]).index("tokens") == list(record["head"]).index("match") - 1
    assert SPDConfig.from_dict(record).head == config.head
    del record["head"]["tokens"]
    assert SPDConfig.from_dict(record).head == config.head
    record["head"]["tokens"] = not units
    with pytest.raises(ConfigError, match=f"head.tokens is {not units}.*{readout!r}"):
        SPDConfig.from_dict(record)
