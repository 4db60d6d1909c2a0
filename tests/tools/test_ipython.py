"""``%load_ext tpushim`` and ``%tpushim`` in a real IPython shell."""

import procs
import pytest
import tfcases
from IPython.core.error import UsageError

import tpushim
from tpushim import _console, _ipython, _settings, _versions

SESSION = """\
import tensorflow as tf
tf.get_logger().setLevel("ERROR")
m2e = tf.keras.estimator.model_to_estimator
from tensorflow.keras.estimator import model_to_estimator
from tensorflow_estimator.python.estimator.keras_lib import model_to_estimator as private_m2e
%load_ext tpushim
print("== status")
%tpushim
print("== cpu")
%tpushim --mode cpu
def compiled():  # a model converts once (stock or not): each conversion gets its own
    model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))])
    model.compile(optimizer=tf.keras.optimizers.legacy.SGD(0.1), loss="mse")
    return model
print("CONVERTED", isinstance(m2e(keras_model=compiled()), tf.compat.v1.estimator.tpu.TPUEstimator))
print("PRIVATE", isinstance(private_m2e(keras_model=compiled()), tf.compat.v1.estimator.tpu.TPUEstimator))
print("== off")
%tpushim --off
print("STOCK", isinstance(m2e(keras_model=compiled()), tf.compat.v1.estimator.tpu.TPUEstimator))
%unload_ext tpushim
print("MAGIC LEFT", "tpushim" in get_ipython().magics_manager.magics["line"])
"""


@pytest.mark.slow  # a TensorFlow subprocess that trains
@pytest.mark.tpuestimator
def test_extension_in_a_real_ipython_session(tmp_path):
    script = tmp_path / "session.ipy"
    script.write_text(SESSION)
    proc = procs.python(
        ["-m", "IPython", "--quick", "--no-banner", "--colors=NoColor", script],
        env={"IPYTHONDIR": str(tmp_path / "ipython")},
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    loaded, status, cpu, off = (
        out.split("== status")[0],
        out.split("== status")[1].split("== cpu")[0],
        out.split("== cpu")[1].split("== off")[0],
        out.split("== off")[1],
    )
    assert f"tpushim {tpushim.__version__} patched: model_to_estimator returns" in loaded
    keras_package = (
        "keras.src" if tfcases.KERAS_VERSION >= (2, 13) else "keras"
    )  # 2.12: no keras.src
    for name in ("m2e", "model_to_estimator"):
        assert (
            f"`{name}` was bound to {keras_package}.estimator.model_to_estimator_v2 before "
            f"%load_ext tpushim; it will still convert"
        ) in loaded, name
    assert (
        (  # the function tpushim wraps, bound before: the notebook's name is pointed at the wrapper
            "`private_m2e` was bound to tensorflow_estimator.python.estimator.keras_lib."
            "model_to_estimator before %load_ext tpushim; tpushim rebound it to its wrapper"
        )
        in loaded
    )
    assert "patched:     yes" in status and "mode:        auto (from default)" in status
    assert (
        "mode:        cpu (from argument)" in cpu
        and "CONVERTED True" in cpu
        and "PRIVATE True" in cpu
    )
    assert "tpushim: model_to_estimator -> TPUEstimator(use_tpu=False" in proc.stderr
    assert "tpushim unpatched: model_to_estimator is the stock one again" in off
    assert "STOCK False" in off
    assert "MAGIC LEFT False" in off


@pytest.fixture
def shell(ipython_shell):
    """conftest's IPython shell, with tpushim's extension unloaded afterwards."""
    yield ipython_shell
    if "tpushim" in ipython_shell.extension_manager.loaded:
        ipython_shell.run_line_magic("unload_ext", "tpushim")
    _console.hide_conversions()


def test_magic_options_and_errors(shell, capsys):
    shell.run_line_magic("load_ext", "tpushim")
    assert "patched" in capsys.readouterr().out
    shell.run_line_magic("tpushim", "--mode cpu --batch-size 64 --iterations-per-loop 10")
    status = tpushim.status()
    assert (status["mode"], status["batch_size"], status["iterations_per_loop"]) == ("cpu", 64, 10)
    assert "batch size:  64" in capsys.readouterr().out
    with pytest.raises(UsageError, match="not a valid tpushim mode"):
        shell.run_line_magic("tpushim", "--mode sideways")
    with pytest.raises(UsageError, match="positive integer"):
        shell.run_line_magic("tpushim", "--batch-size 0")
    with pytest.raises(UsageError, match="not a pod input path"):
        shell.run_line_magic("tpushim", "--pod-input sharded")
    assert tpushim.status()["mode"] == "cpu"  # a rejected option changes nothing
    shell.run_line_magic("tpushim", "--mode cpu --pod-input exact")
    assert tpushim._patch.current_settings().pod_input == "exact"
    shell.run_line_magic("tpushim", "unpatch")
    assert not tpushim.is_patched()
    shell.run_line_magic("tpushim", "patch --tpu grpc://127.0.0.1:8470")
    assert tpushim.is_patched() and tpushim.status()["tpu"] == "grpc://127.0.0.1:8470"
    assert "TPU:         grpc://127.0.0.1:8470 (from tpu= argument)" in capsys.readouterr().out


def test_load_keeps_an_earlier_patch_and_honours_the_environment(shell, capsys, monkeypatch):
    tpushim.patch(mode="cpu")
    shell.run_line_magic("load_ext", "tpushim")
    assert (
        "the strategy engine (tf.distribute.MirroredStrategy over this machine's devices)"
        if _versions.uses_own_estimator()  # the TPU path there
        else "TPUEstimator(use_tpu=False)"
    ) in capsys.readouterr().out
    assert tpushim.status()["mode_source"] == "argument"
    shell.run_line_magic("unload_ext", "tpushim")
    assert not tpushim.is_patched()

    monkeypatch.setenv("TPUSHIM_MODE", "off")
    shell.run_line_magic("load_ext", "tpushim")
    assert (
        "tpushim's estimator (TensorFlow >= 2.16 has none; stock 2.15's path and numbers)"
        if _versions.uses_own_estimator()  # no stock estimator there: tpushim's takes its place
        else "the stock estimator (mode off, from TPUSHIM_MODE=off)"
    ) in capsys.readouterr().out
    shell.run_line_magic("unload_ext", "tpushim")

    monkeypatch.setenv("TPUSHIM_MODE", "fast")
    shell.run_line_magic("load_ext", "tpushim")
    assert "not patched: TPUSHIM_MODE='fast'" in capsys.readouterr().out
    assert "tpushim" in shell.magics_manager.magics["line"]  # so the user can fix it from here


def test_only_model_to_estimator_functions_are_reported():
    def model_to_estimator():  # the user's own function of that name
        return None

    namespace = {"model_to_estimator": model_to_estimator, "_": print, "x": 3, "tpushim": tpushim}
    assert _ipython.bound_names(namespace) == {}


def test_unsupported_tensorflow_said_once_per_command(shell, monkeypatch, capsys):
    import warnings

    import tensorflow as tf

    monkeypatch.setattr(tf, "__version__", "2.22.0")  # above the range (2.16-2.21: the engine)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shell.run_line_magic("load_ext", "tpushim")
        loaded = capsys.readouterr().out
        shell.run_line_magic("tpushim", "patch")
        patched = capsys.readouterr().out
    assert not [
        w for w in caught if "tpushim does not support" in str(w.message)
    ]  # printed instead
    for out in (loaded, patched):
        assert out.count("tpushim does not support TensorFlow 2.22.0 with Keras") == 1, out
    assert "NOT SUPPORTED" in patched and not tpushim.is_patched()


def test_magic_takes_the_command_line_options_with_the_same_help():
    help_text = " ".join(_ipython.tpushim_magic.__doc__.split())  # what %tpushim? shows
    for flag, kwargs in _settings.OPTIONS:
        assert (f"{flag} {kwargs['metavar']}" if "metavar" in kwargs else flag) in help_text
        assert " ".join(kwargs["help"].split()) in help_text


def test_magic_quiet_hides_the_conversion_lines(shell, capsys):
    import logging

    from tpushim import _log

    def shown():
        return any(
            isinstance(h, _log.ConsoleHandler) for h in logging.getLogger("tpushim").handlers
        )

    shell.run_line_magic("load_ext", "tpushim")
    assert shown()
    shell.run_line_magic("tpushim", "--quiet")
    assert not shown() and tpushim.status()["quiet"] is True
    shell.run_line_magic("tpushim", "--mode cpu")  # a new patch(): quiet back to its default
    assert shown() and tpushim.status()["quiet"] is False
    capsys.readouterr()


#: Whether the hint to try mode cpu is offered: not on TensorFlow >= 2.16 (no TPU path yet, #33).
HINT = not _versions.uses_own_estimator()


def test_magic_hints_are_the_magic_and_unpatch_confirms(shell, capsys):
    shell.run_line_magic("load_ext", "tpushim")
    loaded = capsys.readouterr().out
    # No TPU, mode auto: the hint a notebook user can type, not the command line's. (None on
    # TensorFlow >= 2.16: mode cpu has no TPU path to run there yet, #33.)
    assert ("%tpushim --mode cpu runs the TPU code path on CPU" in loaded) is HINT
    shell.run_line_magic("tpushim", "unpatch")
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "tpushim unpatched: model_to_estimator is the stock one again in this kernel",
        "(%tpushim patch patches again; %tpushim shows the status)",
    ]
    shell.run_line_magic("tpushim", "unpatch")
    assert capsys.readouterr().out.startswith("tpushim was not patched")
    shell.run_line_magic("tpushim", "")
    status = capsys.readouterr().out
    assert "(%tpushim patch patches this kernel)" in status
    assert ("%tpushim --mode cpu runs the TPU code path" in status) is HINT
    assert "python -m tpushim" not in status and " --mode cpu" not in status.replace(
        "%tpushim --", ""
    )
    info = _console.format_status(tpushim.status())  # the command line keeps its own spelling
    assert "(python -m tpushim SCRIPT patches the script it runs)" in info
    assert ("; --mode cpu runs the TPU code path" in info) is HINT
