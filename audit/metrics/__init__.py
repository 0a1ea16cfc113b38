"""Array-level metrics: numpy arrays (or per-item score tables) in, an
:class:`audit.result.MetricOutput` out. No model is run here (that is :mod:`audit.measure`), and
no metric is looked up by name here (that is :mod:`audit.registry`).

How a test's sets map onto each association metric, and what the sign of each headline means:
:mod:`audit.metrics.sets`.
"""

from __future__ import annotations

from audit.metrics.cramers_v import contingency_association, cramers_v
from audit.metrics.same import bias_subspace, direct_bias, gweat, same, same_directions, same_scores
from audit.metrics.weat import (
    as_vectors,
    cosine_matrix,
    unit_rows,
    weat,
    weat_bootstrap_ci,
    weat_effect_size,
    weat_scores,
    weat_statistic,
)
from audit.metrics.wefe_family import ect, mac, ripa, rnd, rnsb

__all__ = [
    "weat", "weat_scores", "weat_statistic", "weat_effect_size", "weat_bootstrap_ci",
    "same", "same_directions", "same_scores", "gweat", "bias_subspace", "direct_bias",
    "rnd", "rnsb", "mac", "ect", "ripa", "cramers_v", "contingency_association",
    "as_vectors", "unit_rows", "cosine_matrix",
]
