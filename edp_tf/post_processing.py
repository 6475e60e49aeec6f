"""Stage 5 of the private step: functions of the mechanism's release, in order.

Why a stage of its own: what acts on the release (the replicas' sum taken early, a projection onto
public directions) is post-processing, free in epsilon, and each piece must see the release
whole, never one replica's share. The chain is decided once before tracing, from what the step
combines; PrivateModel runs it between the normaliser and the optimizer.
"""
from __future__ import annotations

from typing import Callable, List, Optional

from edp_tf import replica_sum


def chain(replicas: int, selected_rows: bool, projection: Optional[Callable],
          optimizer) -> List[Callable]:
    """The release's post-processing, in order. With several replicas and sparse tables or a
    projection the step takes the replicas' sum itself (the selected rows as a small dense
    block; a projection acts on the release, not a share) and hands each replica its share back
    for the optimizer's own sum (edp_tf/replica_sum.py). Selected rows cannot be shared out:
    there the optimizer is told not to sum again (`replica_sum.already_summed`)."""
    sums = (selected_rows or projection is not None) and replicas > 1
    stages = [replica_sum.sum_over_replicas] if sums else []
    if projection is not None:
        stages.append(projection)
    if sums and selected_rows:
        if not hasattr(optimizer, "_all_reduce_sum_gradients"):  # else: summed twice
            raise NotImplementedError(
                "sparse_embeddings on several replicas needs Keras' TensorFlow optimizer "
                "(its _all_reduce_sum_gradients); this Keras has none")
        optimizer._all_reduce_sum_gradients = replica_sum.already_summed
    elif sums:
        stages.append(replica_sum.as_shares)
    return stages
