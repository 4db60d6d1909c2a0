"""Training throughput: steady-state steps/s (and examples/s) of the stock estimator, the stock
estimator again (the noise floor: stock against itself), tpushim auto mode (no TPU: must be
stock), tpushim cpu mode and a hand-written TPUEstimator(use_tpu=False) model_fn (TPUConfig's
default iterations_per_loop=2, and again with tpushim's 100), on a tiny MLP and an MNIST-sized
CNN (synthetic data). Graph building, session start and the final checkpoint are excluded: a hook
times steps W+1 .. W+M inside one ``train()`` call; one discarded warm-up run per model first.
Ratios are the median of each round's ratio to stock. Goals: auto >= 0.99x stock, cpu >= 0.9x.

The tiny MLP is run a second time compiled without metrics, stock against cpu mode only: stock's
train step also runs the compiled metrics' update ops (results train() never reads), tpushim's
does not, which is what makes cpu mode faster than stock on a model this small.
"""

import benchlib
from benchlib import SEED, median

SECTION = "train throughput"


class Contender:
    """A way to get an estimator and its input_fn for a ModelCase.

    ``make(case, model_dir)`` returns ``(estimator, input_fn)``. ``expect``: a goal as a
    (min ratio to stock, text) pair, or None.
    """

    def __init__(self, name, make, expect=None):
        self.name, self.make, self.expect = name, make, expect


def hand_model_fn(case):
    """A minimal hand-written TPUEstimator model_fn: Keras layers, the Keras loss, a tf1 optimizer."""
    tf = benchlib.tf()

    def model_fn(features, labels, mode, params):
        probs = case.apply_layers(features)
        loss = tf.keras.losses.SparseCategoricalCrossentropy()(labels, probs)
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(case.lr)
        if params.get("use_tpu"):
            optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
        train_op = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
        return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode=mode, loss=loss, train_op=train_op)

    return model_fn


def _hand_written(iterations_per_loop=None):
    def make(case, model_dir):
        tpu = benchlib.tf().compat.v1.estimator.tpu
        tpu_config = tpu.TPUConfig(iterations_per_loop=iterations_per_loop or 2)  # 2: the default
        est = tpu.TPUEstimator(
            model_fn=hand_model_fn(case),
            use_tpu=False,
            train_batch_size=case.batch,
            eval_batch_size=case.batch,
            predict_batch_size=case.batch,
            config=tpu.RunConfig(tf_random_seed=SEED, model_dir=model_dir, tpu_config=tpu_config),
        )
        return est, case.params_input_fn()

    return make


STOCK, STOCK_AGAIN = "stock estimator", "stock estimator again"

#: The first is the baseline; a scratch script can append a prototype and call bench.main().
CONTENDERS = [
    Contender(STOCK, benchlib.converted(None)),
    Contender(STOCK_AGAIN, benchlib.converted(None)),
    Contender("tpushim auto (no TPU)", benchlib.converted("auto"), (0.99, ">= 0.99x")),
    Contender("tpushim cpu mode", benchlib.converted("cpu"), (0.90, ">= 0.90x")),
    Contender("hand-written TPUEstimator(use_tpu=False)", _hand_written()),
    # TPUEstimator logs examples/sec every ceil(log_step_count_steps / iterations_per_loop)
    # session.run()s -- on CPU, steps. tpushim's iterations_per_loop is 100 (TPUEstimator's own
    # default is 2): this row shows what that alone costs a hand-written TPUEstimator.
    Contender("hand-written TPUEstimator, iterations_per_loop=100", _hand_written(100)),
]


def cases(quick):
    return [
        benchlib.mlp(quick),
        benchlib.cnn(quick),
        benchlib.mlp(quick, metrics=(), only=(STOCK, STOCK_AGAIN, "tpushim cpu mode")),
    ]


def measure_training(contender, case, scratch):
    est, input_fn = contender.make(case, scratch.new())
    timer = benchlib.StepTimer(case.warmup, case.measure)
    est.train(input_fn, steps=case.warmup + case.measure, hooks=[timer.hook])
    return timer.steps_per_sec(), type(est).__name__


def run(table, opts, report):
    """The ``train`` section."""
    reps = benchlib.rounds(opts, full=7, quick=2)
    report["train"] = {}
    with benchlib.ScratchDir("tpushim-bench-train-") as scratch:
        for case in cases(opts.quick):
            contenders = [c for c in CONTENDERS if case.only is None or c.name in case.only]
            kinds = {}

            def measure(contender):
                rate, kinds[contender.name] = measure_training(contender, case, scratch)
                return rate

            measure(contenders[0])  # warm-up, discarded: first-run costs
            rates = benchlib.interleaved([(c.name, c) for c in contenders], reps, measure)
            paired = benchlib.Paired(rates, STOCK)
            noise = paired.ratios(STOCK_AGAIN)
            metrics = ", ".join(case.metrics) or "no metrics"
            label = f"{case.name} ({metrics}), batch {case.batch}, {case.measure} steps x{reps}"
            for contender in contenders:
                rate = median(rates[contender.name])
                goal, ok = "", None
                ratio = paired.ratio(contender.name)
                if contender.expect:
                    goal, ok = contender.expect[1], ratio >= contender.expect[0]
                table.add(
                    SECTION,
                    label,
                    f"{contender.name} [{kinds[contender.name]}]",
                    f"{rate:.0f} steps/s = {rate * case.batch:.0f} ex/s",
                    f"{ratio:.3f}x",
                    goal,
                    ok,
                    spread=paired.spread(contender.name),
                    noise=(min(noise), max(noise)),
                )
            report["train"][label] = rates
