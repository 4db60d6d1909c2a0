"""The strategy engine's training step against a hand-written Keras ``fit`` under the same
strategy, in what makes a step cost more than fit's on many replicas (issue 33,
benchmarks/bench_strategy.py): ``python strategy_step_proof.py DIR`` prints one JSON object (its
own process: the 8 logical devices are made before TensorFlow initialises).

Cases:

* ``collectives``: the all-reduce ops (every replica's rendezvous) in the engine's traced
  training loop, its nested functions included, and in Keras's ``train_function`` for the same
  model under the same strategy. Negative control: the engine as it was, the input not carrying
  the global batch's real rows (``_padding.global_rows`` answering None), which the loss then
  counts with an all-reduce of its own.
* ``reads``: whether the loop asks, each step, if a batch is left (``get_next_as_optional``),
  for a repeated Dataset, a finite one (20 rows by 8: a short last batch) and one of unknown
  length (the finite one filtered): it must ask only where TensorFlow does not know the length.
* ``ends``: the finite Dataset and its filtered twin, trained to the input's end by
  ``train(steps=None)`` and by ``train(steps=5)`` (past the end): the same global steps, weights
  and user hook calls (stock's: a last ``before_run`` that meets the end), the filtered twin
  reading as the loop always read.

A helper run by tests/proofs/test_strategy_step.py, not a test module.
"""

import json
import os
import sys

import eight_devices  # noqa: F401  (first: 8 logical CPU devices, before TensorFlow initialises)
import numpy as np
import tensorflow as tf

import tpushim
from tpushim import _padding
from tpushim._strategy import runtime as _strategy_runtime
from tpushim._strategy import step as _strategy_step

ROWS, FEATURES = 20, 4


def model():
    tf.keras.utils.set_random_seed(0)
    m = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(8, activation="relu", input_shape=(FEATURES,)),
            tf.keras.layers.Dense(1),
        ]
    )
    m.compile(tf.keras.optimizers.legacy.SGD(0.05, momentum=0.9), loss="mse")
    return m


def data():
    rng = np.random.RandomState(0)
    x = rng.randn(ROWS, FEATURES).astype(np.float32)
    return x, (x[:, :1] - 0.5 * x[:, 1:2]).astype(np.float32)


def dataset(kind):
    x, y = data()
    made = tf.data.Dataset.from_tensor_slices((x, y))
    if kind == "unknown":
        made = made.filter(lambda *_: True)
    made = made.batch(8)
    return made.repeat() if kind == "repeated" else made


def op_types(graph_def):
    """Every op type in a traced function's graph and the functions it calls, with counts."""
    types = [n.op for n in graph_def.node]
    for function in graph_def.library.function:
        types += [n.op for n in function.node_def]
    return types


def collectives(types):
    return sum(1 for t in types if "Collective" in t or "AllReduce" in t)


class Traced:
    """The engine's training loops, as traced, while active."""

    def __init__(self):
        self.graphs = []

    def __enter__(self):
        self.original = original = _strategy_step._Run.train_function
        graphs = self.graphs

        def train_function(run, *args, **kwargs):
            loop = original(run, *args, **kwargs)

            def traced(iterator, n):
                result = loop(iterator, n)
                graphs.append(loop.get_concrete_function(iterator, n).graph.as_graph_def())
                return result

            return traced

        _strategy_step._Run.train_function = train_function
        return self

    def __exit__(self, *exc):
        _strategy_step._Run.train_function = self.original


class Calls(tf.compat.v1.train.SessionRunHook):
    def __init__(self):
        self.calls = []

    def begin(self):
        self.calls.append("begin")

    def before_run(self, run_context):
        self.calls.append("before_run")

    def after_run(self, run_context, run_values):
        self.calls.append("after_run")

    def end(self, session):
        self.calls.append("end")


def engine(model_dir):
    with tpushim.patched(mode="cpu", engine="strategy", iterations_per_loop=3, quiet=True):
        return tf.keras.estimator.model_to_estimator(keras_model=model(), model_dir=model_dir)


def train(model_dir, kind, steps=None):
    """(loop graphs, hook calls, global step, weights) of one train() on ``kind``'s Dataset."""
    estimator, hook = engine(model_dir), Calls()
    with Traced() as traced:
        estimator.train(lambda: dataset(kind), steps=steps, hooks=[hook])
    reader = tf.train.load_checkpoint(model_dir)
    names = [n for n in reader.get_variable_to_shape_map() if n.startswith("layer_with_weights")]
    weights = {n: reader.get_tensor(n).tolist() for n in sorted(names)}
    step = int(reader.get_tensor("estimator_global_step/.ATTRIBUTES/VARIABLE_VALUE"))
    return traced.graphs, hook.calls, step, weights


def keras_collectives():
    with _strategy_runtime.cpu_strategy().scope():
        fitted = model()
    fitted.compile(fitted.optimizer, loss="mse", steps_per_execution=3)
    fitted.fit(dataset("repeated"), epochs=1, steps_per_epoch=3, verbose=0)
    iterator = iter(fitted.distribute_strategy.experimental_distribute_dataset(dataset("repeated")))
    concrete = fitted.train_function.get_concrete_function(iterator)
    return collectives(op_types(concrete.graph.as_graph_def()))


def main(root):
    result = {"replicas": len(tf.config.list_logical_devices("CPU"))}
    graphs = train(os.path.join(root, "repeated"), "repeated", steps=6)[0]
    original = _padding.global_rows
    _padding.global_rows = lambda features: None  # the negative control: counted by all-reduce
    try:
        control = train(os.path.join(root, "control"), "repeated", steps=6)[0]
    finally:
        _padding.global_rows = original
    result["collectives"] = {
        "engine": collectives(op_types(graphs[0])),
        "control": collectives(op_types(control[0])),
        "keras": keras_collectives(),
    }
    reads, ends = {}, {}
    for kind in ("repeated", "finite", "unknown"):
        for steps in (None, 5):
            if kind == "repeated" and steps is None:
                continue
            graphs, calls, step, weights = train(os.path.join(root, f"{kind}-{steps}"), kind, steps)
            reads[kind] = any("IteratorGetNextAsOptional" in op_types(g) for g in graphs)
            if kind != "repeated":
                ends[f"{kind}-{steps}"] = {"calls": calls, "step": step, "weights": weights}
    result["reads"], result["ends"] = reads, ends
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
