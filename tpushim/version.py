"""The one place tpushim's version, and the TensorFlow releases it supports, are written.

Plain literals and no imports: pyproject.toml (the version; its extras repeat the ranges, and
tests/unit/test_versions.py keeps them in step), the version guard in tpushim/_versions.py,
``python -m tpushim info`` and .ci/run read them from here without importing TensorFlow.
"""

__version__ = "0.1.0"

#: The TensorFlow minor releases with tf.estimator (tensorflow_estimator) that tpushim supports:
#: exactly the ones .ci/run tests on Python 3.11, each in its own environment
#: (.ci/constraints-X.Y.txt). Python 3.11 has tensorflow-cpu wheels from 2.12 on.
TESTED_TF = ("2.12", "2.13", "2.14", "2.15")

#: TensorFlow 2.16 removed tf.estimator and Keras 2's model_to_estimator. From this release on,
#: tpushim brings the estimator API legacy scripts call (tpushim/_estimator_api) on TensorFlow's own
#: tf.compat.v1 graphs and sessions, with tf_keras as tf.keras.
ESTIMATOR_API_TF = "2.16"

#: The newest supported minor release (the one .ci/run tests on Python 3.12, with tf-keras of the
#: same minor); 2.16-2.20 take the same path.
NEWEST_TF = "2.21"


def _pair(text):
    return tuple(int(p) for p in text.split("."))


def tf_range():
    """``(lowest, first unsupported)`` minor releases as int pairs: ``((2, 12), (2, 22))``."""
    high = _pair(NEWEST_TF)
    return _pair(TESTED_TF[0]), (high[0], high[1] + 1)


def estimator_api_tf():
    """The first release tpushim's own estimator API runs on, as an int pair: ``(2, 16)``."""
    return _pair(ESTIMATOR_API_TF)


def tf_specifier():
    """The pip version specifier of the whole supported range: ``">=2.12,<2.22"``."""
    low, high = tf_range()
    return f">={low[0]}.{low[1]},<{high[0]}.{high[1]}"


def estimator_tf_specifier():
    """The releases with tensorflow_estimator (Python <= 3.11): ``">=2.12,<2.16"``."""
    low, high = _pair(TESTED_TF[0]), estimator_api_tf()
    return f">={low[0]}.{low[1]},<{high[0]}.{high[1]}"


def tf_span():
    """The supported range as people read it: ``"2.12-2.21"``."""
    return f"{TESTED_TF[0]}-{NEWEST_TF}"
