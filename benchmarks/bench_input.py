"""Legacy input (``--only input``): cpu mode against stock, and stock against itself (the noise
floor), interleaved. The first step's latency (from the ``train()`` call to the end of step 1,
graph building and tpushim's input inspection included) on TFRecords with ``shuffle(10000)`` and
``batch(B)`` without drop_remainder, goal <= 1.05x; steady-state steps/s of
``make_one_shot_iterator(...).get_next()`` tensors and of ``numpy_input_fn`` (both fed by tpushim
as a Dataset), goal >= 0.98x.
"""

import os
import time

import benchlib
from benchlib import median

SECTION = "legacy input"
STOCK, STOCK_AGAIN, SHIM = "stock estimator", "stock estimator again", "tpushim cpu mode"


class _FirstStepTimer:
    """Seconds from ``start()`` (just before ``train()``) to the end of the first training step."""

    def __init__(self):
        tf = benchlib.tf()
        timer = self

        class Hook(tf.compat.v1.train.SessionRunHook):
            def after_run(hook, run_context, run_values):
                del run_context, run_values
                if timer.first is None:
                    timer.first = time.perf_counter()

        self.hook, self.first, self.started = Hook(), None, None

    def start(self):
        self.started = time.perf_counter()

    def seconds(self):
        return self.first - self.started


def _write_tfrecords(path, case):
    tf = benchlib.tf()
    x, y = case.data()
    with tf.io.TFRecordWriter(path) as writer:
        for features, label in zip(x, y):
            writer.write(
                tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "x": tf.train.Feature(
                                float_list=tf.train.FloatList(value=features.ravel())
                            ),
                            "y": tf.train.Feature(int64_list=tf.train.Int64List(value=label)),
                        }
                    )
                ).SerializeToString()
            )


def _tfrecord_input_fn(path, case):
    """The issue's pipeline: TFRecords, shuffle(10000), batch(B) without drop_remainder."""
    tf = benchlib.tf()
    spec = {
        "x": tf.io.FixedLenFeature(list(case.input_shape), tf.float32),
        "y": tf.io.FixedLenFeature([1], tf.int64),
    }

    def input_fn():
        ds = tf.data.TFRecordDataset(path).map(lambda r: tf.io.parse_single_example(r, spec))
        ds = ds.map(lambda e: (e["x"], e["y"])).shuffle(10000).repeat().batch(case.batch)
        return ds

    return input_fn


def _iterator_input_fn(case):
    tf = benchlib.tf()
    x, y = case.data()
    return lambda: tf.compat.v1.data.make_one_shot_iterator(
        tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(case.batch)
    ).get_next()


def _numpy_input_fn(case):
    tf = benchlib.tf()
    x, y = case.data()
    return tf.compat.v1.estimator.inputs.numpy_input_fn(
        x, y, batch_size=case.batch, shuffle=False, num_epochs=None
    )


def run(table, opts, report):
    """The ``input`` section."""
    reps = benchlib.rounds(opts, full=7, quick=3)
    case = benchlib.mlp(opts.quick)
    report["input"] = {}
    contenders = [(STOCK, None), (STOCK_AGAIN, None), (SHIM, "cpu")]
    with benchlib.ScratchDir("tpushim-bench-input-") as scratch:
        records = os.path.join(scratch.path, "train.tfrecord")
        _write_tfrecords(records, case)

        def first_step(mode):
            est, _ = benchlib.converted(mode)(case, scratch.new())
            timer = _FirstStepTimer()
            timer.start()
            est.train(_tfrecord_input_fn(records, case), steps=1, hooks=[timer.hook])
            return timer.seconds()

        def steady(mode, make_input):
            est, _ = benchlib.converted(mode)(case, scratch.new())
            timer = benchlib.StepTimer(case.warmup, case.measure)
            est.train(make_input(case), steps=case.warmup + case.measure, hooks=[timer.hook])
            return timer.steps_per_sec()

        rows = [
            (
                "first step, TFRecords + shuffle(10000) + batch(B)",
                first_step,
                "s",
                lambda r: r <= 1.05,
                "<= 1.05x",
            )
        ]
        for name, make_input in (
            ("iterator tensors", _iterator_input_fn),
            ("numpy_input_fn", _numpy_input_fn),
        ):
            rows.append(
                (
                    f"steps/s, {name}",
                    lambda mode, m=make_input: steady(mode, m),
                    "steps/s",
                    lambda r: r >= 0.98,
                    ">= 0.98x",
                )
            )
        first_step(None)  # warm-up, discarded
        for label, measure, unit, meets, goal in rows:
            values = benchlib.interleaved(contenders, reps, measure)
            paired = benchlib.Paired(values, STOCK)
            noise = paired.ratios(STOCK_AGAIN)
            for name, mode in contenders:
                ratio = paired.ratio(name)
                table.add(
                    SECTION,
                    f"{label}, {case.name}, batch {case.batch} x{reps}",
                    name,
                    f"{median(values[name]):{'.3f' if unit == 's' else '.0f'}} {unit}",
                    f"{ratio:.3f}x",
                    goal if mode else "",
                    meets(ratio) if mode else None,
                    spread=paired.spread(name),
                    noise=(min(noise), max(noise)),
                )
            report["input"][label] = values
