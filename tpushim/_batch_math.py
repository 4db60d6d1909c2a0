"""The batch arithmetic, in one place: global batches against a TPU's cores (or a strategy's
replicas), the batches a number of rows makes, the steps an evaluation runs over them, and the one
text for a global batch the cores do not divide.

Pure Python, no TensorFlow: the TPUEstimator path (:mod:`tpushim._estimator`,
:mod:`tpushim._batching`, :mod:`tpushim._input_fn`), the strategy engine
(:mod:`tpushim._strategy`) and the preflight (on every TensorFlow, 2.16 and later included, where
the TPUEstimator path does not import) all use it, and its tests run in milliseconds.
"""


def ceil_div(a, b):
    """``a / b`` rounded up, in integers (``-(-a // b)``: exact where ``math.ceil(a / b)`` is
    not, for counts beyond 2**53)."""
    return -(-a // b)


def padded_batch(size, shards):
    """The global batch a TPU (or a strategy) runs for stock's global batch ``size`` on
    ``shards`` cores (replicas): the next multiple of ``shards``, the rows beyond ``size``
    padding weighted 0. ``size`` itself where ``shards`` divides it (or is 0 / None)."""
    if not shards:
        return size
    return ceil_div(size, shards) * shards


def per_shard(global_batch, shards):
    """Each core's (replica's) rows of a global batch padded to a multiple of ``shards``."""
    return ceil_div(global_batch, shards)


def batches_of(rows, size, drop_remainder=False):
    """The batches ``batch(size, drop_remainder)`` makes of ``rows`` rows (the last one short
    unless dropped)."""
    return rows // size if drop_remainder else ceil_div(rows, size)


def eval_batches_held(examples, batches, declared, global_batch):
    """The evaluation steps a finite input of ``examples`` rows fills with global batches of
    ``global_batch``: its own ``batches`` when it is batched by that size (a short one padded),
    else ``ceil(examples / global_batch)`` (re-batched); at least one.

    Args:
      examples: the rows the input holds.
      batches: the batches it makes, as batched (None where unknown).
      declared: the batch size its graph declares (None where it does not say).
      global_batch: the global batch of the call.
    """
    held = batches if declared == global_batch else ceil_div(examples, global_batch)
    return max(1, held)


def batch_choices(size, shards):
    """The multiples of ``shards`` nearest to ``size``, e.g. '96 or 104'."""
    lower = (size // shards) * shards
    return " or ".join(str(c) for c in (lower, lower + shards) if c > 0)


def indivisible_batch(size, shards):
    """The one text for a global batch size that does not divide among a TPU's shards (one per
    core): the estimator logs it when it pads each batch, the preflight warns with it.

    Args:
      size: the global batch size.
      shards: the TPU's shards (cores).
    Returns:
      ``(problem, fix)``: what happens and what it costs; the nearest sizes that waste nothing
      and where to set one.
    """
    padded = padded_batch(size, shards)
    return (
        f"global batch size {size} does not divide among {shards} TPU cores: each of its batches "
        f"is padded to {padded} rows, weighted 0 ({padded - size} of {padded}, "
        f"{(padded - size) / padded:.1%} of every step's work, wasted)",
        f"use a multiple of {shards} ({batch_choices(size, shards)}) to waste nothing: set "
        f"tpushim.patch(batch_size=...) or TPUSHIM_BATCH_SIZE, or batch the input by it",
    )


def distributed_batch(key, strategy, replicas, shards=None):
    """The one text for a ``RunConfig(train_distribute=...)`` (or ``eval_distribute``) strategy
    on a TPU, which does not use it: stock gives each of the strategy's replicas a batch of its
    own from the input_fn, a TPU splits the input_fn's batch over its cores. The conversion logs
    it, the preflight warns with it.

    Args:
      key: ``"train_distribute"`` or ``"eval_distribute"``.
      strategy: the strategy's class name (``MirroredStrategy``).
      replicas: its replicas here (``num_replicas_in_sync``).
      shards: the TPU's cores, where known.
    Returns:
      ``(problem, fix)``: the batch arithmetic on each side; the input_fn's batch that keeps the
      global batch, or each replica's, and how to stop the warning.
    """
    cores = f"the {shards} TPU cores" if shards else "the TPU's cores"
    here = f" ({replicas} x its batch here)" if replicas > 1 else ""
    per_core = f"{shards} x its batch" if shards else "the cores x its batch"
    return (
        f"RunConfig({key}={strategy}) gives each of its replicas a batch of its own from the "
        f"input_fn: a step over N replicas (GPUs) reads N x the input_fn's batch{here}. A TPU "
        f"does not use the strategy: the input_fn's batch is the global batch, split over "
        f"{cores}, so a script written for N GPUs trains with 1/N of its global batch",
        f"to keep the global batch of a run over N replicas, have the input_fn return N x its "
        f"batch (to keep each replica's batch on every core, {per_core}); then leave {key} out "
        f"of RunConfig, which also ends this warning",
    )


def distribute_strategies(config):
    """``(key, strategy class name, replicas)`` for each of ``train_distribute`` and
    ``eval_distribute`` a RunConfig sets (read by attribute: any RunConfig, or None)."""
    found = []
    for key in ("train_distribute", "eval_distribute"):
        strategy = getattr(config, key, None)
        if strategy is not None:
            replicas = getattr(strategy, "num_replicas_in_sync", 1)
            found.append((key, type(strategy).__name__, replicas))
    return found
