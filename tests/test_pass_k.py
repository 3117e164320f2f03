"""pass^k (docs/tau2.md): per item C(c, k) / C(n, k), averaged over items; printed by `ratchet eval` beside the
mean when an item has more than one trial."""

import pandas as pd


def test_pass_hat_k_is_the_chance_that_k_trials_all_succeed():
    from components.runtime.evaluate import pass_hat_k

    rows = (
        [("a", s, ok) for s, ok in enumerate([True, True, False, False])]
        + [("b", s, True) for s in range(4)]
        + [("c", s, False) for s in range(4)]
    )
    scores = pd.DataFrame(rows, columns=["item_id", "seed", "success"])
    per_item = pass_hat_k(scores, per_item=True)
    assert per_item["a"] == {1: 0.5, 2: 1 / 6, 3: 0.0, 4: 0.0}
    assert per_item["b"] == {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0} and per_item["c"][1] == 0.0
    assert pass_hat_k(scores) == {1: 0.5, 2: (1 / 6 + 1) / 3, 3: 1 / 3, 4: 1 / 3}
    # an item with fewer trials counts only up to its own n
    short = pd.concat([scores, pd.DataFrame([("d", 0, True)], columns=scores.columns)])
    assert pass_hat_k(short)[1] == 0.625 and pass_hat_k(short)[2] == (1 / 6 + 1) / 3
    assert pass_hat_k(scores.iloc[:0]) == {}
