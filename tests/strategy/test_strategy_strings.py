"""Strings and lookups on the strategy engine (tpushim/_host_part.py, #33): a string key passed
through to an output (its string label weighed 0), a ``StringLookup`` on a string input, and
feature columns in a ``DenseFeatures`` layer (vocabulary list and file, hash bucket, embedding,
indicator) run on the host, in the input pipeline; the replicated step, compiled with XLA, sees
numbers only. Weights, every evaluate() key and predictions equal stock's within 1e-5 (a short
last batch of 4 in 52 rows), and predict() gives the keys back as stock does, row by row. The
weight-free layers between the raw inputs and a ``DenseFeatures`` layer (Lambdas, a TF op) run
on the host with its columns. A lookup of a trainable layer's output cannot move and is refused,
naming the layer."""

import numpy as np
import pytest
import tfcases

pytestmark = pytest.mark.slow

CITIES = ["oslo", "lima", "pune", "kobe"]


def _data():
    rng = np.random.RandomState(3)
    n = tfcases.N
    x = {
        "values": rng.rand(n, 3).astype("float32"),
        "key": np.array([[f"row-{i}"] for i in range(n)]),
        "city": np.array([[c] for c in rng.choice(CITIES, n)]),
        "town": np.array([[f"town-{i}"] for i in rng.randint(0, 9, n)]),
    }
    y = (x["values"].sum(1, keepdims=True) > 1.5).astype("float32")
    return x, y


def _keys_model():
    import tensorflow as tf

    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    values = tf.keras.Input((3,), name="values")
    key = tf.keras.Input((1,), dtype=tf.string, name="key")
    city = tf.keras.Input((1,), dtype=tf.string, name="city")
    ids = tf.keras.layers.StringLookup(vocabulary=CITIES, name="city_id")(city)
    vec = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(5, 2)(ids))
    hidden = tf.keras.layers.Dense(4, activation="tanh")(
        tf.keras.layers.Concatenate()([values, vec])
    )
    prob = tf.keras.layers.Dense(1, activation="sigmoid", name="prob")(hidden)
    key_out = tf.keras.layers.Lambda(tf.identity, name="key_out")(key)
    model = tf.keras.Model([values, key, city], {"prob": prob, "key_out": key_out})
    model.compile(
        tf.keras.optimizers.legacy.Adam(0.05),
        loss={"prob": "binary_crossentropy", "key_out": lambda y_true, y_pred: tf.constant(0.0)},
        loss_weights={"prob": 1.0, "key_out": 0.0},
        metrics={"prob": ["accuracy"]},
    )
    return model


def _columns_model(vocabulary_file):
    import tensorflow as tf

    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    fc = tf.feature_column
    city = fc.categorical_column_with_vocabulary_list("city", CITIES)
    town_file = fc.categorical_column_with_vocabulary_file("town", vocabulary_file)
    city_hash = fc.categorical_column_with_hash_bucket("city", 7)
    columns = [
        fc.numeric_column("values", shape=(3,)),
        fc.indicator_column(city),
        fc.embedding_column(town_file, 2),
        fc.embedding_column(city_hash, 3, combiner="sqrtn"),
    ]
    inputs = {
        "values": tf.keras.Input((3,), name="values"),
        "city": tf.keras.Input((1,), dtype=tf.string, name="city"),
        "town": tf.keras.Input((1,), dtype=tf.string, name="town"),
    }
    hidden = tf.keras.layers.DenseFeatures(columns)(inputs)
    prob = tf.keras.layers.Dense(1, activation="sigmoid", name="prob")(hidden)
    model = tf.keras.Model(inputs, prob)
    model.compile(tf.keras.optimizers.legacy.Adam(0.05), "binary_crossentropy", ["accuracy"])
    return model


def _run(model_dir, patch, build, keys):
    x, y = _data()
    config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
    estimator = tfcases.convert(model_dir, build, patch=patch, config=config)
    features = dict(x) if keys else {k: x[k] for k in ("values", "city", "town")}
    labels = {"prob": y, "key_out": x["key"]} if keys else y
    estimator.train(tfcases.dataset_input_fn(features, labels), steps=7)
    metrics = estimator.evaluate(tfcases.dataset_input_fn(features, labels))
    predictions = list(estimator.predict(tfcases.dataset_input_fn(features)))
    keys_out = [p.pop("key_out") for p in predictions] if keys else None
    return (estimator, metrics, predictions, tfcases.checkpoint_values(model_dir)), keys_out


@pytest.mark.parametrize("case", ["keys and a StringLookup", "feature columns"])
def test_strings_and_lookups_run_on_the_host_as_stock(tmp_path, case):
    from tpushim._strategy import estimator as _strategy_estimator

    keys = case != "feature columns"
    if keys:
        build = _keys_model
    else:
        vocabulary = tmp_path / "towns.txt"
        vocabulary.write_text("\n".join(f"town-{i}" for i in range(6)) + "\n")
        build = lambda: _columns_model(str(vocabulary))
    stock, stock_keys = _run(tmp_path / "stock", {"mode": "off"}, build, keys)
    engine, engine_keys = _run(
        tmp_path / "engine", {"mode": "cpu", "engine": "strategy"}, build, keys
    )
    assert isinstance(engine[0], _strategy_estimator.StrategyEstimator)
    assert len(engine[2]) == tfcases.N
    tfcases.assert_same(stock, engine, 1e-5)
    if keys:  # the keys come back as stock gives them: bytes, one per row, in order
        assert [k.tolist() for k in engine_keys] == [k.tolist() for k in stock_keys]
        assert engine_keys[5].tolist() == [b"row-5"]


def test_a_lookup_of_a_trainable_layers_output_is_refused_naming_it(tmp_path):
    import tensorflow as tf

    from tpushim._errors import ConversionError

    def build():
        tf.keras.backend.clear_session()
        x = tf.keras.Input((3,), name="values")
        score = tf.keras.layers.Dense(1)(x)
        ids = tf.keras.layers.Lambda(lambda t: tf.cast(t > 0, tf.int64), name="sign")(score)
        looked = tf.keras.layers.IntegerLookup(vocabulary=[0, 1], name="sign_id")(ids)
        out = tf.keras.layers.Dense(1, name="out")(tf.cast(looked, tf.float32))
        model = tf.keras.Model(x, out)
        model.compile("sgd", "mse")
        return model

    with pytest.raises(
        ConversionError, match=r"layer 'sign_id' .*from the output of layer 'sign'.*dataset.map"
    ):
        tfcases.convert(tmp_path / "m", build, patch={"mode": "cpu", "engine": "strategy"})
    assert not (tmp_path / "m").exists() or not list((tmp_path / "m").iterdir())


@pytest.mark.parametrize("direct", [False, True], ids=["columns-only", "distance-read-directly"])
def test_weight_free_layers_before_the_columns_run_on_the_host_as_stock(tmp_path, direct):
    """Lambdas scaling coordinates and computing a Euclidean distance from four raw inputs, and
    a TF op, read by feature columns: run on the host with them (the replicas skip them), with
    stock's weights, metrics and predictions. Before, conversion refused the model. ``direct``:
    a Dense layer reads the distance too (fed to the replicas from the host)."""
    from tpushim._strategy import estimator as _strategy_estimator

    x, y = tfcases.taxi_data()

    def run(model_dir, patch):
        config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
        build = lambda: tfcases.taxi_model(direct=direct)
        estimator = tfcases.convert(model_dir, build, patch=patch, config=config)
        estimator.train(tfcases.dataset_input_fn(x, y), steps=7)
        metrics = estimator.evaluate(tfcases.dataset_input_fn(x, y))
        predictions = list(estimator.predict(tfcases.dataset_input_fn(x)))
        return estimator, metrics, predictions, tfcases.checkpoint_values(model_dir)

    stock = run(tmp_path / "stock", {"mode": "off"})
    engine = run(tmp_path / "engine", {"mode": "cpu", "engine": "strategy"})
    assert isinstance(engine[0], _strategy_estimator.StrategyEstimator)
    assert engine[0]._tpushim_plan.host.layers == {
        "euclidean",
        "scale_lat",
        "scale_lon",
        "tf.math.log1p",
    }
    assert len(engine[2]) == tfcases.N
    tfcases.assert_same(stock, engine, 1e-5)
