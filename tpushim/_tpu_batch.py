"""The global batch against a TPU's cores: the one text for a batch size the cores do not divide.

TensorFlow-free: the estimator logs it when it pads each batch (:mod:`tpushim._estimator`), and
the preflight warns with it on every TensorFlow, 2.16 and later included (where the estimator
module does not import).
"""


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
    padded = -(-size // shards) * shards
    return (
        f"global batch size {size} does not divide among {shards} TPU cores: each of its batches "
        f"is padded to {padded} rows, weighted 0 ({padded - size} of {padded}, "
        f"{(padded - size) / padded:.1%} of every step's work, wasted)",
        f"use a multiple of {shards} ({batch_choices(size, shards)}) to waste nothing: set "
        f"tpushim.patch(batch_size=...) or TPUSHIM_BATCH_SIZE, or batch the input by it",
    )
