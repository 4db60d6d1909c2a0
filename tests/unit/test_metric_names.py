"""tpushim/_metric_names.py: stock's names for a model's compiled metrics (pure Python)."""

from tpushim._metric_names import stock_unique_names


def test_a_weighted_metric_named_as_an_unweighted_one_takes_stocks_suffix():
    # Keras's metrics container: accuracy, weighted_accuracy; stock's v1 compile: accuracy_1.
    assert stock_unique_names([(None, ["accuracy", "mae"], ["weighted_accuracy", "mse"])]) == [
        "accuracy",
        "mae",
        "accuracy_1",
        "mse",
    ]


def test_several_outputs_each_prefixed_and_suffixed_as_stocks():
    per_output = [
        ("cls", ["cls_accuracy"], ["cls_weighted_accuracy"]),
        ("reg", ["reg_mae"], ["reg_weighted_mae", "reg_mse"]),
    ]
    assert stock_unique_names(per_output) == [
        "cls_accuracy",
        "cls_accuracy_1",
        "reg_mae",
        "reg_mae_1",
        "reg_mse",
    ]


def test_a_users_own_weighted_name_and_the_losses_names():
    # A name the user chose ("weighted_auc", no "auc" beside it) is kept; a metric named as
    # the loss (or an output's loss) is suffixed, as stock's v1 compile does.
    assert stock_unique_names([(None, ["loss"], ["weighted_auc"])]) == ["loss_1", "weighted_auc"]
    assert stock_unique_names([("a", ["a_loss"], []), ("b", [], [])]) == ["a_loss_1"]
