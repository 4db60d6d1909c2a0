"""TPU train-step graph size: ops of tpushim's TRAIN model_fn (``params['use_tpu']=True``)
replicated over 8 replicas with ``tf.compat.v1.tpu.replicate`` (built on CPU, never run: the
tests' replica harness, ``tests/replicas.py``) against a hand-written minimal TPU model_fn for the
same model: ops in the whole graph, ops inside the replicate cluster, and the cluster's live ops
(those the replicated outputs depend on; dead stateless ops are pruned before XLA compiles, dead
stateful ones are not). Ratios are to the hand-written model_fn that uses the Keras loss object the
model is compiled with; a second one with ``reduce_mean`` shows what the Keras loss machinery
itself costs. Both report the global batch's loss, as a TPU step must to report stock's (one
cross-replica sum of the shards' losses, divided by the shards), and so does tpushim's. Goal: at most 2% or 10 ops more than the hand-written step inside the cluster,
whichever is more: tpushim may add a constant handful of ops (Keras's loss-weight multiply and its
gradient with a tf1 optimizer), never ops that grow with the model. Counts are exact: no rounds,
no noise.
"""

import benchlib

SECTION = "TPU train-step ops"
GOAL = "<= 1.02x or +10 ops (cluster)"


def within_goal(cluster, reference):
    """tpushim's cluster ops against the hand-written step's: see the module's goal."""
    return cluster <= max(1.02 * reference, reference + 10)


def count_replicated_train_step(case, step_fn_factory):
    """(ops in graph, ops in the replicate cluster, live ops in the cluster) for one train step.

    ``step_fn_factory()`` runs outside the graph (e.g. builds the Keras model) and returns
    ``step(features, labels) -> (loss, train_op)``, called inside the replicated computation.
    """
    tf = benchlib.tf()
    replicas = benchlib.import_tests_helper("replicas")
    step = step_fn_factory()

    def computation():
        features = tf.zeros([replicas.PER, *case.input_shape])
        labels = tf.zeros([replicas.PER, 1], tf.int64)
        loss, train_op = step(features, labels)
        with tf.control_dependencies([train_op]):
            return tf.identity(loss)

    graph, outputs = replicas.replicate(computation)
    cluster = replicas.cluster_ops(graph)
    live = replicas.live_ops([t for replica in outputs for t in replica])
    return len(graph.get_operations()), len(cluster), sum(1 for op in cluster if op in live)


def _shim_step(optimizer_name):
    def factory_for(case):
        def factory():
            tf = benchlib.tf()
            replicas = benchlib.import_tests_helper("replicas")
            from tpushim import _model_fn

            optimizer = (
                tf.compat.v1.train.GradientDescentOptimizer(case.lr)
                if optimizer_name == "tf1"
                else tf.keras.optimizers.legacy.SGD(case.lr)
            )
            model_fn = _model_fn.make_model_fn(case.keras_model(optimizer))

            def step(features, labels):
                spec = model_fn(
                    features,
                    labels,
                    tf.estimator.ModeKeys.TRAIN,
                    params={"use_tpu": True, "batch_size": replicas.PER},
                )
                return spec.loss, spec.train_op

            return step

        return factory

    return factory_for


def _hand_step(loss_kind):
    def factory_for(case):
        def factory():
            tf = benchlib.tf()
            tf.keras.backend.clear_session()

            def step(features, labels):
                probs = case.apply_layers(features)
                if loss_kind == "keras":
                    loss = tf.keras.losses.SparseCategoricalCrossentropy()(labels, probs)
                else:
                    loss = tf.reduce_mean(
                        tf.keras.losses.sparse_categorical_crossentropy(labels, probs)
                    )
                optimizer = tf.compat.v1.tpu.CrossShardOptimizer(
                    tf.compat.v1.train.GradientDescentOptimizer(case.lr)
                )
                train_op = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
                reported = tf.compat.v1.tpu.cross_replica_sum(loss) / float(
                    benchlib.import_tests_helper("replicas").REPLICAS
                )
                return reported, train_op

            return step

        return factory

    return factory_for


#: (name, factory_for(case), is_reference). Ratios are to the first reference.
GRAPH_CONTENDERS = [
    ("hand-written: Keras loss object + CrossShardOptimizer(GD)", _hand_step("keras"), True),
    (
        "hand-written: reduce_mean(crossentropy) + CrossShardOptimizer(GD)",
        _hand_step("mean"),
        False,
    ),
    ("tpushim, compiled with tf1 GradientDescentOptimizer", _shim_step("tf1"), False),
    ("tpushim, compiled with Keras legacy SGD", _shim_step("keras"), False),
]


def run(table, opts, report):
    """The ``graph`` section (``--quick``: the MLP only)."""
    report["graph"] = {}
    replicas = benchlib.import_tests_helper("replicas")
    cases = [benchlib.mlp(True)] + ([] if opts.quick else [benchlib.cnn(True)])
    for case in cases:
        counts = {}
        for name, factory_for, _ in GRAPH_CONTENDERS:
            try:
                counts[name] = count_replicated_train_step(case, factory_for(case))
            except Exception as e:
                counts[name] = None
                table.notes.append(f"graph: {name} on {case.name} failed: {type(e).__name__}: {e}")
        ref_name = next(n for n, _, ref in GRAPH_CONTENDERS if ref)
        ref = counts.get(ref_name)
        for name, _, is_ref in GRAPH_CONTENDERS:
            got = counts.get(name)
            if got is None:  # a tpushim step that cannot be built misses its goal
                if name.startswith("tpushim"):
                    table.add(
                        SECTION,
                        f"{case.name}, {replicas.REPLICAS} replicas",
                        name,
                        "failed to build (see notes)",
                        "",
                        GOAL,
                        False,
                    )
                continue
            total, cluster, live = got
            value = f"{total} graph / {cluster} cluster / {live} live"
            ratio, ok = "", None
            if ref and not is_ref:
                ratio = f"{total / ref[0]:.3f} / {cluster / ref[1]:.3f} / {live / ref[2]:.3f}"
                ok = within_goal(cluster, ref[1]) if name.startswith("tpushim") else None
            table.add(
                SECTION,
                f"{case.name}, {replicas.REPLICAS} replicas",
                name,
                value,
                ratio,
                GOAL if name.startswith("tpushim") else "",
                ok,
            )
        report["graph"][case.name] = counts
