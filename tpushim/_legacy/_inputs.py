"""numpy_input_fn and pandas_input_fn on tf.data (tf.estimator.inputs on TensorFlow >= 2.16).

Stock fed these through queue runners; a Dataset in the same order gives the same batches where
the order is fixed (``shuffle=False``): examples in order, epochs back to back, full batches while
the input repeats forever and a short last batch when it ends. With ``shuffle=True`` the order is a
different random permutation than stock's queue gave (same distribution, other numbers).
"""

import collections

import numpy as np
import tensorflow as tf

_TARGET = "__target_key__"


def _dataset(columns, batch_size, num_epochs, shuffle, queue_capacity):
    dataset = tf.data.Dataset.from_tensor_slices(columns)
    if shuffle:
        dataset = dataset.shuffle(queue_capacity)
    dataset = dataset.repeat(num_epochs)
    return dataset.batch(batch_size, drop_remainder=num_epochs is None)


def _check_args(batch_size, shuffle, num_epochs):
    if not isinstance(shuffle, bool):
        raise ValueError(
            f"shuffle must be provided and explicitly set as boolean (it is {shuffle})."
        )
    if not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    if num_epochs is not None and num_epochs <= 0:
        raise ValueError(f"num_epochs must be None or positive, got {num_epochs!r}.")


def numpy_input_fn(
    x,
    y=None,
    batch_size=128,
    num_epochs=1,
    shuffle=None,
    queue_capacity=1000,
    num_threads=1,
):
    """tf.estimator.inputs.numpy_input_fn: an input_fn over numpy arrays (or dicts of them)."""
    _check_args(batch_size, shuffle, num_epochs)
    del num_threads  # one ordered reader, as stock's with shuffle=False

    def input_fn():
        if isinstance(x, np.ndarray):
            features = x
            keys = None
        elif isinstance(x, dict):
            features = collections.OrderedDict(sorted(x.items()))
            keys = list(features)
        else:
            raise TypeError(f"x must be a dict or array; got {type(x).__name__}")
        if isinstance(y, dict):
            targets = collections.OrderedDict(sorted(y.items()))
            duplicate = set(targets) & set(keys or ())
            if duplicate:
                raise ValueError(
                    f"{len(duplicate)} duplicate keys are found in both x and y: {duplicate}"
                )
        else:
            targets = y
        lengths = {len(v) for v in (features.values() if keys else [features])}
        if targets is not None:
            lengths |= {
                len(v) for v in (targets.values() if isinstance(targets, dict) else [targets])
            }
        if len(lengths) != 1:
            raise ValueError(
                "Length of tensors in x and y is mismatched. All elements in x and y must have "
                "the same length."
            )
        columns = (features,) if targets is None else (features, targets)
        dataset = _dataset(columns, batch_size, num_epochs, shuffle, queue_capacity)
        batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        return batch[0] if targets is None else (batch[0], batch[1])

    return input_fn


def pandas_input_fn(
    x,
    y=None,
    batch_size=128,
    num_epochs=1,
    shuffle=None,
    queue_capacity=1000,
    num_threads=1,
    target_column="target",
):
    """tf.estimator.inputs.pandas_input_fn: an input_fn over a DataFrame (and a Series)."""
    _check_args(batch_size, shuffle, num_epochs)
    del num_threads
    if y is not None and target_column in x:
        raise ValueError(
            f"Cannot use name {target_column} for target column: DataFrame already has a column "
            "with that name"
        )
    if y is not None and not np.array_equal(x.index, y.index):
        raise ValueError(
            f"Index for x and y are mismatched.\nIndex for x: {x.index}\nIndex for y: {y.index}\n"
        )

    def input_fn():
        features = collections.OrderedDict((k, x[k].values) for k in x.columns)
        columns = (features,) if y is None else (features, np.asarray(y.values))
        dataset = _dataset(columns, batch_size, num_epochs, shuffle, queue_capacity)
        batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        return batch[0] if y is None else (batch[0], batch[1])

    return input_fn
