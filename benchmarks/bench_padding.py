"""Padding on a TPU host (``--only padding``): the input pipeline one TPU host runs (tpushim's
per-core pieces of every global batch, run on CPU as a host runs it), interleaved.

* A global batch of 100 on 8 cores, each padded to 104 with copies of real rows (weighted 0),
  against a global batch of 104, which divides: steps/s (a step is the 8 cores' pieces), goal
  >= 0.90x;
* a TPU evaluation's input, its filler batches (the last batch again, weight 0) after the end
  included, against the same padded batches alone: steps/s, goal >= 0.90x.

MNIST-sized rows (784 floats), 40 steps per measurement; each contender's pipeline is built
fresh in its own graph.
"""

import time

import benchlib
from benchlib import median

SECTION = "padding"
CORES = 8
ROWS, FEATURES = 2000, 784


def _pipeline(global_batch, tpu_batch, mode, filler):
    """The host pipeline tpushim builds for ``mode``, as a Dataset."""
    tf = benchlib.tf()
    from tpushim import _batching, _padding

    rng = __import__("numpy").random.RandomState(0)
    x = rng.rand(ROWS, FEATURES).astype("float32")
    y = rng.randint(0, 10, (ROWS, 1)).astype("int64")
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if mode == tf.estimator.ModeKeys.TRAIN:
        ds = ds.repeat()
    ds = ds.batch(global_batch)
    if filler:
        return _batching.tpu_batches(
            ds, global_batch, tpu_batch // CORES, mode, tpu_batch=tpu_batch
        )
    padded = _batching.fit_batches(ds, global_batch, mode, padded_to=tpu_batch)
    if not _padding.has_padding(padded):
        padded = padded.map(_padding.pad_batch(tpu_batch))
    return _batching._rebatch(padded, tpu_batch // CORES, drop_remainder=True)


def _steps_per_sec(global_batch, tpu_batch, mode, filler, steps):
    tf = benchlib.tf()
    with tf.Graph().as_default():
        pieces = _pipeline(global_batch, tpu_batch, mode, filler).take(steps * CORES)
        count = pieces.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1)
        with tf.compat.v1.Session() as sess:
            start = time.perf_counter()
            done = sess.run(count)
            seconds = time.perf_counter() - start
    assert done == steps * CORES, done
    return steps / seconds


def run(table, opts, report):
    """The ``padding`` section."""
    tf = benchlib.tf()
    reps = benchlib.rounds(opts, full=9, quick=3)
    train, evaluate = tf.estimator.ModeKeys.TRAIN, tf.estimator.ModeKeys.EVAL
    steps = 40 if not opts.quick else 10
    eval_steps = ROWS // 100  # the evaluation's own batches; its fillers come after
    comparisons = [
        (
            "train, global batch 100 padded to 104 vs 104",
            [
                ("batch 104 (divides)", (104, 104, train, False, steps)),
                ("batch 104 again", (104, 104, train, False, steps)),
                ("batch 100 padded to 104", (100, 104, train, False, steps)),
            ],
        ),
        (
            f"evaluate, {eval_steps} batches of 100 padded to 104, then as many fillers",
            [
                ("without fillers", (100, 104, evaluate, False, eval_steps)),
                ("without fillers again", (100, 104, evaluate, False, eval_steps)),
                ("with fillers", (100, 104, evaluate, True, 2 * eval_steps)),
            ],
        ),
    ]
    report["padding"] = {}
    for label, contenders in comparisons:
        values = benchlib.interleaved(
            contenders, reps, lambda args: _steps_per_sec(*args[:4], steps=args[4])
        )
        baseline, again, contender = (name for name, _ in contenders)
        paired = benchlib.Paired(values, baseline)
        noise = paired.ratios(again)
        for name, _ in contenders:
            ratio = paired.ratio(name)
            judged = name == contender
            table.add(
                SECTION,
                f"{label}, {FEATURES} floats a row x{reps}",
                name,
                f"{median(values[name]):.0f} steps/s",
                f"{ratio:.3f}x",
                ">= 0.90x" if judged else "",
                ratio >= 0.90 if judged else None,
                spread=paired.spread(name),
                noise=(min(noise), max(noise)),
            )
        report["padding"][label] = values
