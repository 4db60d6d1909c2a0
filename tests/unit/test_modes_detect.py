"""Modes, precedence, strict parsing, TPU detection from each source, and the conversion log line."""

import os
import re
import socket
import time

import docquotes
import pytest
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import

keras_lib = tpuestimator_import("tensorflow_estimator.python.estimator", "keras_lib")
tpu_config = tpuestimator_import("tensorflow_estimator.python.estimator.tpu", "tpu_config")

import tpushim
from tpushim import _detect, _settings, _versions

TPUShimEstimator = tpuestimator_import("tpushim._estimator", "TPUShimEstimator")
_faketpu = tpuestimator_import("tpushim._preflight.faketpu")


def free_port():
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_auto_without_tpu_is_stock(tmp_path, tpushim_log):
    tpushim.patch()
    est = tfcases.convert(tmp_path)
    if _versions.uses_own_estimator():  # no estimators there: tpushim's, as stock 2.15's
        assert type(est) is tf.estimator.Estimator  # tpushim's tf.estimator while patched
        assert (
            "model_to_estimator -> tpushim's EstimatorV2 on TensorFlow >= 2.16 (no TPU configured; "
            "stock 2.15's path)"
        ) in tpushim_log.text
        return
    assert type(est) is tf.estimator.Estimator
    assert (
        "-> stock EstimatorV2 (no TPU configured; TPUSHIM_MODE=cpu runs the TPU path on CPU)"
        in tpushim_log.text
    )
    # The line as the settings and conversion pages quote it.
    for page in (("docs", "reference", "settings.md"), ("docs", "reference", "conversion.md")):
        quoted = [
            line
            for block in docquotes.blocks(docquotes.page(*page))
            for line in block.splitlines()
            if line.startswith("model_to_estimator -> stock EstimatorV2 (no TPU configured")
        ]
        assert len(quoted) == 1 and quoted[0] in tpushim_log.text, (page, quoted)


@pytest.mark.tpuestimator
def test_cpu_mode_log_line(tmp_path, tpushim_log):
    tpushim.patch(mode="cpu", batch_size=16, iterations_per_loop=20)
    est = tfcases.convert(tmp_path)
    assert isinstance(est, TPUShimEstimator)
    assert (
        "model_to_estimator -> TPUEstimator(use_tpu=False, global batch 16, iterations_per_loop 20)"
        " [mode cpu from argument: the TPU code path on CPU]"
    ) in tpushim_log.text


@pytest.mark.tpuestimator
def test_off_mode_and_kill_switch_beats_argument(tmp_path, monkeypatch):
    tpushim.patch(mode="off")
    assert type(tfcases.convert(tmp_path / "a")) is tf.estimator.Estimator
    monkeypatch.setenv("TPUSHIM_MODE", "off")
    tpushim.patch(mode="cpu")
    assert tpushim.status()["mode"] == "off"
    assert tpushim.status()["mode_source"] == "TPUSHIM_MODE=off"
    assert type(tfcases.convert(tmp_path / "b")) is tf.estimator.Estimator
    # Flipped after patch(), without editing code: still wins at call time.
    monkeypatch.delenv("TPUSHIM_MODE")
    assert isinstance(tfcases.convert(tmp_path / "c"), TPUShimEstimator)
    monkeypatch.setenv("TPUSHIM_MODE", "OFF")
    assert type(tfcases.convert(tmp_path / "d")) is tf.estimator.Estimator


def test_argument_beats_environment_beats_default(monkeypatch):
    monkeypatch.setenv("TPUSHIM_MODE", "cpu")
    monkeypatch.setenv("TPUSHIM_BATCH_SIZE", "64")
    settings = _settings.resolve([{"batch_size": 32}])
    assert (settings.mode, settings.sources["mode"]) == ("cpu", "TPUSHIM_MODE")
    assert (settings.batch_size, settings.sources["batch_size"]) == (32, "argument")
    assert (settings.iterations_per_loop, settings.sources["iterations_per_loop"]) == (
        None,
        "default",
    )
    monkeypatch.setenv("TPUSHIM_MODE", "tpu")
    assert _settings.resolve([{"mode": "auto"}]).mode == "auto"


@pytest.mark.parametrize(
    "var,value,expected",
    [
        (
            "TPUSHIM_MODE",
            "gpu",
            "TPUSHIM_MODE='gpu' is not a valid tpushim mode; choose one of auto, cpu, tpu, off",
        ),
        ("TPUSHIM_BATCH_SIZE", "12x", "TPUSHIM_BATCH_SIZE='12x' is not a positive integer"),
        (
            "TPUSHIM_BATCH_SIZE",
            "0",
            "TPUSHIM_BATCH_SIZE must be a positive integer (e.g. 128); got 0",
        ),
        (
            "TPUSHIM_ITERATIONS_PER_LOOP",
            "-3",
            "TPUSHIM_ITERATIONS_PER_LOOP='-3' is not a positive integer",
        ),
        ("TPUSHIM_TPU", "http://10.0.0.1:8470", "must start with grpc://"),
        # Digits str.isdigit() takes and int() refuses: a clear error, not a raw ValueError.
        ("TPUSHIM_BATCH_SIZE", "\u00b2", "TPUSHIM_BATCH_SIZE='\u00b2' is not a positive integer"),
        # Larger than TensorFlow's integers: refused here, not overflowing inside TensorFlow.
        ("TPUSHIM_BATCH_SIZE", "99999999999999999999", "must be at most 2147483647"),
        ("TPUSHIM_ITERATIONS_PER_LOOP", "2147483648", "must be at most 2147483647"),
        ("TPUSHIM_TPU", "grpc://host:notaport", "is not a TPU address: give grpc://HOST:PORT"),
        ("TPUSHIM_TPU", "grpc://10.0.0.2", "is not a TPU address: give grpc://HOST:PORT"),
        ("TPUSHIM_TPU", "grpc://:8470", "is not a TPU address: give grpc://HOST:PORT"),
        ("TPUSHIM_TPU", "grpc://10.0.0.2:70000", "port number from 1 to 65535"),
    ],
)
def test_garbage_environment_raises_before_patching(monkeypatch, var, value, expected):
    monkeypatch.setenv(var, value)
    with pytest.raises(tpushim.ConfigurationError) as info:
        tpushim.patch()
    assert expected in str(info.value)
    assert not tpushim.is_patched()
    assert not tpushim._patch.is_ours(keras_lib.model_to_estimator)


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        ({"mode": "fast"}, "mode='fast' is not a valid tpushim mode"),
        ({"mode": 3}, "mode must be a string"),
        ({"batch_size": 0}, "batch_size must be a positive integer"),
        ({"batch_size": True}, "batch_size must be a positive integer"),
        ({"iterations_per_loop": 2.5}, "iterations_per_loop must be a positive integer"),
        ({"tpu": 42}, "tpu must be a TPU name"),
        ({"batch_size": 2**31}, "batch_size=2147483648 is too large"),
        ({"batch_size": 8.0}, "batch_size must be a positive integer"),
        ({"tpu": "grpc://host:notaport"}, "tpu='grpc://host:notaport' is not a TPU address"),
    ],
)
def test_garbage_arguments_raise(kwargs, expected):
    with pytest.raises(tpushim.ConfigurationError) as info:
        tpushim.patch(**kwargs)
    assert expected in str(info.value)
    assert not tpushim.is_patched()
    with pytest.raises(tpushim.ConfigurationError, match=re.escape(expected)):
        tpushim.patched(**kwargs)


@pytest.mark.tpuestimator
def test_numpy_integers_are_integers(tmp_path, tpushim_log):
    import numpy as np

    for value in (np.int64(8), np.int32(8), np.uint16(8)):
        tpushim.patch(mode="cpu", batch_size=value, iterations_per_loop=value)
        settings = tpushim._patch.current_settings()
        assert settings.batch_size == 8 and type(settings.batch_size) is int
        assert settings.iterations_per_loop == 8 and type(settings.iterations_per_loop) is int
    with tpushim.patched(batch_size=np.int64(16)):
        assert tpushim._patch.current_settings().batch_size == 16
    est = tfcases.convert(tmp_path)
    assert est.config.tpu_config.iterations_per_loop == 8
    assert "global batch 8, iterations_per_loop 8" in tpushim_log.text
    with pytest.raises(tpushim.ConfigurationError, match="got 0"):
        tpushim.patch(batch_size=np.int64(0))


@pytest.mark.parametrize(
    "var,value",
    [
        ("TPUSHIM_BATCH_SIZE", "abc"),
        ("TPUSHIM_BATCH_SIZE", "\u00b2"),
        ("TPUSHIM_ITERATIONS_PER_LOOP", "-1"),
        ("TPUSHIM_TPU", "grpc://host:notaport"),
        ("TPUSHIM_QUIET", "maybe"),
        ("TPUSHIM_POD_INPUT", "some"),
        ("TPUSHIM_LOG_LEVEL", "loud"),
    ],
)
def test_kill_switch_parses_nothing_else(tmp_path, monkeypatch, var, value):
    """TPUSHIM_MODE=off is flipped to get stock's run whatever else is set: nothing raises."""
    monkeypatch.setenv("TPUSHIM_MODE", "Off")
    monkeypatch.setenv(var, value)
    tpushim.patch()
    tpushim.patch(batch_size="abc", tpu="grpc://host:notaport")  # arguments neither
    assert tpushim.status()["mode_source"] == "TPUSHIM_MODE=off"
    with tpushim.patched(batch_size=0):
        assert type(tfcases.convert(tmp_path)) is tf.estimator.Estimator
    monkeypatch.delenv("TPUSHIM_MODE")  # the switch off: the same value is refused
    with pytest.raises(tpushim.ConfigurationError):
        tpushim.patch()


# --- detection -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "var,value,target",
    [
        ("TPUSHIM_TPU", "grpc://127.0.0.1:8470", "grpc://127.0.0.1:8470"),
        ("TPU_NAME", "my-tpu", "my-tpu"),
        ("KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "grpc://127.0.0.1:8470", None),
        ("TPU_CONFIG", '{"project": "p", "zone": "z", "tpu_node_name": "t"}', None),
        ("COLAB_TPU_ADDR", "127.0.0.1:8470", "grpc://127.0.0.1:8470"),
    ],
)
def test_detection_from_environment(monkeypatch, var, value, target):
    monkeypatch.setenv(var, value)
    spec = _detect.find_tpu(_settings.resolve())
    assert spec is not None
    assert (spec.target, spec.source) == (target, var)


def test_detection_order_argument_first(monkeypatch):
    monkeypatch.setenv("TPU_NAME", "from-env")
    spec = _detect.find_tpu(_settings.resolve([{"tpu": "grpc://127.0.0.1:1"}]))
    assert (spec.target, spec.source) == ("grpc://127.0.0.1:1", "tpu= argument")


def test_detection_from_tpu_vm_device_files(monkeypatch, tmp_path):
    (tmp_path / "accel0").write_text("")
    libtpu = tmp_path / "libtpu.so"
    monkeypatch.setattr(_detect, "DEVICE_GLOBS", (str(tmp_path / "accel*"),))
    monkeypatch.setattr(_detect, "LIBTPU_FILES", ())
    assert _detect.find_tpu(_settings.resolve()) is None  # device files but no libtpu: not a TPU VM
    libtpu.write_text("")
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(libtpu))
    spec = _detect.find_tpu(_settings.resolve())
    assert (spec.target, spec.source) == ("local", f"TPU VM ({tmp_path / 'accel0'})")


@pytest.mark.tpuestimator
def test_detection_from_run_config_cluster():
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="grpc://127.0.0.1:1")
    config = tpu_config.RunConfig(cluster=resolver)
    spec = _detect.find_tpu(_settings.resolve(), config)
    assert spec.target is resolver and spec.source == "config.cluster"
    assert _detect.find_tpu(_settings.resolve(), tf.estimator.RunConfig()) is None


@pytest.mark.tpuestimator
def test_detection_from_run_config_master(tmp_path, tpushim_log):
    with _faketpu.faked_tpu_system() as tpu:  # the conversion asks the TPU for its devices
        config = tpu_config.RunConfig(master=tpu.master)
        spec = _detect.find_tpu(_settings.resolve(), config)
        assert (spec.target, spec.source) == (tpu.master, "config.master")
        tpushim.patch()
        est = tfcases.convert(tmp_path, config=config)
    assert est.config.master == tpu.master
    assert "-> TPUEstimator(use_tpu=True, tpu=from config," in tpushim_log.text


def test_nothing_configured_finds_nothing():
    assert _detect.find_tpu(_settings.resolve()) is None


class RecordingListener(tfcases.LoopbackListener):
    """A loopback port that records connections: each waits, never accepted, in its backlog."""

    def new_connections(self):
        """How many connections were made to it since the last call."""
        self.sock.setblocking(False)
        count = 0
        while True:
            try:
                connection, _ = self.sock.accept()
            except BlockingIOError:
                return count
            connection.close()
            count += 1


@pytest.mark.tpuestimator
def test_tpu_name_address_gives_tpu_estimator_once_the_tpu_answers(
    monkeypatch, tmp_path, tpushim_log
):
    with _faketpu.faked_tpu_system() as tpu:  # answers TensorFlow's TPU system query
        monkeypatch.setenv("TPU_NAME", tpu.master)
        tpushim.patch()
        est = tfcases.convert(tmp_path, config=tf.estimator.RunConfig(save_checkpoints_steps=50))
    assert isinstance(est, tf.compat.v1.estimator.tpu.TPUEstimator)
    assert f"-> TPUEstimator(use_tpu=True, tpu={tpu.master}," in tpushim_log.text
    assert est.config.master == tpu.master
    assert est.config.tpu_config.iterations_per_loop == 50  # bounded by the checkpoint interval
    assert (
        est.config.tpu_config.per_host_input_for_training
        == tpu_config.InputPipelineConfig.PER_HOST_V2
    )
    assert "[TPU from TPU_NAME]" in tpushim_log.text


class AnsweringListener(tfcases.LoopbackListener):
    """A loopback port that accepts connections and answers each with ``answer`` (bytes; None:
    never answers, the connection held open). Its thread and connections end with the block."""

    def __init__(self, answer=None):
        self.answer = answer
        self.connections = []

    def __enter__(self):
        import threading

        super().__enter__()
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        return self

    def _serve(self):
        while not self.stop.is_set():
            try:
                connection, _ = self.sock.accept()
            except OSError:  # the accept timed out, or the socket was closed
                continue
            self.connections.append(connection)
            if self.answer is not None:
                try:
                    connection.settimeout(1)
                    connection.recv(65536)
                    connection.sendall(self.answer)
                except OSError:
                    pass

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)
        for connection in self.connections:
            connection.close()
        super().__exit__(*exc)


HTTP_404 = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


@pytest.mark.slow  # waits for the device query's deadline
@pytest.mark.parametrize(
    "answer,deadline", [(None, None), (HTTP_404, 3)], ids=["never-answers", "http-404"]
)
@pytest.mark.tpuestimator
def test_an_address_that_is_not_a_tpu_fails_the_conversion_before_anything_is_written(
    monkeypatch, tmp_path, answer, deadline
):
    """An address that accepts a connection is not yet a TPU: TensorFlow would wait 5 minutes
    (12 times) for its answer, then build. The conversion asks it for its devices, bounded."""
    if deadline is not None:  # the same query and bound as the default's, sooner
        monkeypatch.setattr(_detect, "QUERY_TIMEOUT_S", deadline)
    model_dir = tmp_path / "model"
    with AnsweringListener(answer) as listener:
        monkeypatch.setenv("TPUSHIM_TPU", listener.address)
        tpushim.patch()
        start = time.monotonic()
        with pytest.raises(tpushim.NoTPUError) as info:
            tfcases.convert(model_dir)
        took = time.monotonic() - start
        assert listener.connections  # it was asked
    message = str(info.value)
    assert took < 20, took
    assert f"TPU {listener.address} (from TPUSHIM_TPU)" in message
    assert "did not answer as a TPU within" in message
    assert "tried: a TCP connection (accepted), then TensorFlow's device query" in message
    assert "TPUSHIM_MODE=cpu" in message and "TPUSHIM_MODE=off" in message
    assert not model_dir.exists() or not os.listdir(model_dir)  # no keras/ warm start


@pytest.mark.tpuestimator
def test_a_tensorflow_server_without_tpu_devices_is_not_a_tpu(monkeypatch, tmp_path):
    # A real TensorFlow worker (job tpu_worker, as on a TPU node) that has only a CPU.
    port = free_port()
    tf.distribute.Server(
        tf.train.ClusterSpec({"tpu_worker": [f"127.0.0.1:{port}"]}),
        job_name="tpu_worker",
        task_index=0,
    )
    tpushim.patch(tpu=f"grpc://127.0.0.1:{port}")
    start = time.monotonic()
    with pytest.raises(tpushim.NoTPUError) as info:
        tfcases.convert(tmp_path / "model")
    assert time.monotonic() - start < 10
    assert (
        f"grpc://127.0.0.1:{port} (from tpu= argument) answered TensorFlow's device query, but "
        "has no TPU devices (it has: CPU)"
    ) in str(info.value)
    assert not (tmp_path / "model").exists()


@pytest.mark.tpuestimator
def test_tpu_mode_without_tpu_fails_fast_with_how_to(tmp_path):
    tpushim.patch(mode="tpu")
    start = time.monotonic()
    with pytest.raises(tpushim.NoTPUError) as info:
        tfcases.convert(tmp_path)
    assert time.monotonic() - start < 5
    assert "TPUSHIM_TPU" in str(info.value) and "TPUSHIM_MODE=cpu" in str(info.value)
    assert not (tmp_path / "keras").exists()  # nothing written


@pytest.fixture
def silent_metadata_server(monkeypatch):
    """A loopback 'metadata server' that accepts connections and never answers."""
    with RecordingListener() as server:
        host = server.address[len("grpc://") :]
        monkeypatch.setenv("GCE_METADATA_HOST", host)
        monkeypatch.setenv("GCE_METADATA_IP", host)
        yield server


def test_bare_name_lookup_is_bounded(silent_metadata_server):
    start = time.monotonic()
    with pytest.raises(tpushim.NoTPUError, match="within 1 s"):
        _detect.cluster_resolver(_detect.TPUSpec("my-tpu", "TPU_NAME"), timeout_s=1)
    assert time.monotonic() - start < 3


@pytest.mark.parametrize("mode", ["auto", "tpu"])
@pytest.mark.tpuestimator
def test_unreachable_bare_name_is_a_clear_error_not_a_hang(
    silent_metadata_server, monkeypatch, tmp_path, mode
):
    monkeypatch.setenv("TPU_NAME", "my-tpu")
    monkeypatch.setattr(_detect, "RESOLVE_TIMEOUT_S", 1.5)
    tpushim.patch(mode=mode)
    start = time.monotonic()
    with pytest.raises(tpushim.NoTPUError) as info:
        tfcases.convert(tmp_path)
    assert time.monotonic() - start < 5
    assert "'my-tpu' (from TPU_NAME)" in str(info.value) and "grpc://" in str(info.value)
    assert not (tmp_path / "keras").exists()  # nothing written


@pytest.mark.parametrize("mode", ["auto", "tpu", "cpu"])
@pytest.mark.tpuestimator
def test_unreachable_tpu_address_is_a_clear_error_within_seconds_in_every_mode(
    monkeypatch, tmp_path, mode
):
    monkeypatch.setenv("TPU_NAME", f"grpc://127.0.0.1:{free_port()}")  # nothing listens there
    tpushim.patch(mode=mode)
    if mode == "cpu":  # cpu mode never uses the TPU: it trains on CPU
        x, y = tfcases.data()
        tfcases.convert(tmp_path).train(tfcases.dataset_input_fn(x, y), steps=1)
        return
    start = time.monotonic()
    with pytest.raises(tpushim.NoTPUError) as info:  # at the conversion, before it writes
        tfcases.convert(tmp_path)
    assert "is not reachable" in str(info.value) and "(from TPU_NAME)" in str(info.value)
    assert time.monotonic() - start < 10
    assert os.listdir(tmp_path) == []


def _uncompiled():
    tf.keras.backend.clear_session()
    return tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))])


@pytest.mark.parametrize(
    "bad,error,message",
    [
        (lambda p: {"keras_model": _uncompiled()}, ValueError, "Please compile the model"),
        (
            lambda p: {"keras_model": tfcases.with_legacyless_optimizer()},
            tpushim.ConversionError,
            "optimizer HandRolledSGD has no tf.keras.optimizers.legacy equivalent",
        ),
    ],
    ids=["uncompiled", "optimizer-without-legacy-twin"],
)
@pytest.mark.tpuestimator
def test_checks_that_need_no_network_run_before_the_tpu_is_resolved(
    silent_metadata_server, monkeypatch, tmp_path, bad, error, message
):
    """A TPU name is looked up through the metadata server (here a loopback one that records
    connections): a conversion that cannot succeed fails without asking it."""
    monkeypatch.setenv("TPU_NAME", "my-tpu")
    monkeypatch.setattr(_detect, "RESOLVE_TIMEOUT_S", 1.5)
    tpushim.patch(batch_size=100)
    with pytest.raises(error, match=message):
        tf.keras.estimator.model_to_estimator(model_dir=str(tmp_path), **bad(tmp_path))
    assert silent_metadata_server.new_connections() == 0
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # nothing written
    # The listener does see a lookup: a convertible model gets as far as resolving the name.
    with pytest.raises(tpushim.NoTPUError, match="Could not resolve TPU 'my-tpu'"):
        tf.keras.estimator.model_to_estimator(
            keras_model=tfcases.sequential(), model_dir=str(tmp_path)
        )
    assert silent_metadata_server.new_connections() >= 1


@pytest.mark.tpuestimator
def test_tpu_is_probed_once_per_estimator(tmp_path):
    """tpushim asks a grpc:// TPU before the conversion writes anything, not before every call."""
    x, y = tfcases.data()
    with RecordingListener() as listener, _faketpu.faked_tpu_system(listener.address) as tpu:
        tpushim.patch(tpu=tpu.master)
        est = tfcases.convert(tmp_path)
        assert listener.new_connections() == 1  # asked for its devices
        tpu.build(lambda: est.train(tfcases.dataset_input_fn(x, y, repeat=True), steps=1))
        assert listener.new_connections() == 1  # still there (one TCP connection)
        tpu.build(lambda: est.evaluate(tfcases.dataset_input_fn(x, y)))
        tpu.build(lambda: est.predict(tfcases.dataset_input_fn(x)))
        assert listener.new_connections() == 0


@pytest.mark.parametrize("mode", ["auto", "tpu"])
def test_a_local_tpu_this_tensorflow_cannot_drive_is_refused_at_conversion(
    tmp_path, monkeypatch, mode
):
    """``TPUSHIM_TPU=local`` (a TPU VM, Colab's or Kaggle's TPU runtime) with pip's TensorFlow,
    which registers no kernel for ConfigureDistributedTPU: the conversion says so before anything
    is written, naming the install that would drive the TPU (and cpu mode), where TensorFlow's
    own "No OpKernel was registered to support Op 'ConfigureDistributedTPU'" came at train(),
    on either engine."""
    from tpushim import NoTPUError

    monkeypatch.setenv("TPUSHIM_TPU", "local")
    tpushim.patch(mode=mode, quiet=True)
    with pytest.raises(NoTPUError) as raised:
        tfcases.convert(tmp_path / "model")
    message = str(raised.value)
    assert "a TPU is configured (TPUSHIM_TPU)" in message
    assert f"TensorFlow {tf.__version__} here cannot drive it" in message
    assert "ConfigureDistributedTPU" in message and "TPUSHIM_MODE=cpu" in message
    assert not (tmp_path / "model").exists()


@pytest.mark.parametrize(
    "version,install",
    [
        ("2.15.1", "--version=tpu-vm-tf-2.15.1-se"),
        ("2.19.0", 'pip install "tensorflow-tpu==2.19.*"'),
        ("2.21.0", "tensorflow-tpu stops at 2.20"),
    ],
)
def test_the_refusal_names_the_install_for_each_release(version, install):
    def registered(op):
        return False  # pip's tensorflow: the op defined, no kernel for it

    with pytest.raises(tpushim.NoTPUError, match=re.escape(install)):
        _detect.check_tpu_support("TPUSHIM_TPU", {}, version, registered)
    # A TensorFlow with TPU support, or a PJRT runtime (started otherwise): no refusal.
    _detect.check_tpu_support("TPUSHIM_TPU", {}, version, lambda op: True)
    _detect.check_tpu_support("TPUSHIM_TPU", {"PJRT_DEVICE": "TPU"}, version, registered)
