"""Where a legacy script runs today: one table of the platforms (what to install on each, which
engine runs there and why, what is proven), and which of them this machine is, told from the
environment alone.

The one source of docs/how-to/platforms.md's table and README's "Where to run" table
(``python -m tpushim._platforms`` prints both), of the platform ``tpushim info`` names, and of the
install the refusal of a TPU this TensorFlow cannot drive names (:func:`tpushim._detect.
check_tpu_support`). TensorFlow-free and cheap: :func:`detect` reads environment variables and
device files only (no network, nothing that can hang).

What each fact rests on (public sources, read December 2026):
  - ``COLAB_RELEASE_TAG``: set in every Colab runtime. Kaggle's ``kagglehub`` tells Colab by it
    (https://github.com/Kaggle/kagglehub/blob/main/src/kagglehub/env.py,
    ``is_in_colab_notebook``).
  - ``COLAB_TPU_ADDR``: the ``IP:8470`` address of the TPU node behind Colab's former TPU
    runtime; JAX's old Colab helper connected to it
    (https://github.com/jax-ml/jax/blob/jax-v0.3.25/jax/tools/colab_tpu.py). Colab moved its
    TPUs from TPU nodes to TPU VMs in 2024 (https://github.com/googlecolab/colabtools/issues/4481);
    today's TPU runtime is a v5e-1 without TensorFlow
    (https://github.com/googlecolab/colabtools/issues/5164).
  - ``KAGGLE_KERNEL_RUN_TYPE``: set in every Kaggle notebook and script (kagglehub's
    ``is_in_kaggle_notebook``, same file; Kaggle's image reads it too:
    https://github.com/Kaggle/docker-python/blob/main/patches/kaggle_module_resolver.py).
    ``KAGGLE_URL_BASE``: read by Kaggle's image
    (https://github.com/Kaggle/docker-python/blob/main/patches/kaggle_web_client.py) and present
    in a Kaggle TPU session's environment (https://github.com/huggingface/accelerate/issues/2893).
  - ``ISTPUVM``: Kaggle's TPU image sets ``ISTPUVM=1`` (``ENV`` in
    https://github.com/Kaggle/docker-python/blob/main/tpu/Dockerfile) and Kaggle's own code tells
    a TPU session by it (``patches/kaggle_datasets.py``, ``tests/common.py`` there). The same
    image: Python 3.12, ``tensorflow-cpu`` 2.20.0 and ``jax[tpu]`` (``tpu/config.txt``,
    ``tpu/requirements.in``, whose ``tensorflow-tpu`` waits for "a compatible libtpu"); its TPU
    is a v5e-8 (https://github.com/Kaggle/kaggle-cli/pull/1198).
  - ``TPU_ACCELERATOR_TYPE`` (``v4-8``, ``v5litepod-8``): the accelerator type, where the
    environment carries it (GKE's TPU pods; torch_xla reads it before asking the metadata server:
    https://github.com/pytorch/xla/blob/master/torch_xla/_internal/tpu.py). No public source
    shows Colab's or Kaggle's TPU runtime setting it: there the device files (or ``ISTPUVM``) tell
    the TPU, and its generation stays unknown.
  - The TPU's device files: ``/dev/accel*`` on v2 - v4 (``open(/dev/accel0)`` in TPU errors on a
    v4-8, https://github.com/jax-ml/jax/issues/21761, and on Kaggle's former v3-8, the accelerate
    issue above), ``/dev/vfio/N`` on v5e, v5p and v6e (``Couldn't open iommu group /dev/vfio/0``:
    https://github.com/vllm-project/tpu-inference/pull/2257,
    https://github.com/google/gvisor/issues/11545); the TPU generations table
    (:mod:`tpushim._tpus`) holds them.
"""

import os
import sys

from tpushim import _tpus

#: A package spelt as platforms.md says it (the page says what it stands for).
TPUSHIM = "tpushim"


class Platform:
    """One place a legacy script runs (a row of the table).

    Attributes:
      key: a short name (``colab-tpu``), what :func:`detect` answers.
      where: the platform, as the docs name it.
      install: the exact install line(s), or a sentence where pip is not the answer.
      engine: which engine runs a conversion there, in a few words.
      runs: why, and what else runs there.
      proven: what is proven for it, and where.
      page: its how-to page under docs/ (README links to it), or None.
    """

    __slots__ = ("engine", "install", "key", "page", "proven", "runs", "where")

    def __init__(self, key, where, install, engine, runs, proven, page=None):
        self.key, self.where, self.install, self.engine = key, where, install, engine
        self.runs, self.proven, self.page = runs, proven, page

    def __repr__(self):
        return f"Platform({self.key!r})"


_SUITE = (
    "every legacy script of the test suite gives stock 2.15's numbers, in both modes; "
    "`tpushim check` works"
)
_TPUESTIMATOR_PROOF = (
    "CPU only: TPUEstimator's whole TPU graph for faked 8-core systems of 1, 2 and 4 hosts, "
    "and 8 cores emulated with numbers"
)
_STRATEGY_PROOF = (
    "CPU only: the strategy engine on 8 logical CPU devices, its step compiled with XLA, and on "
    "2 and 4 emulated hosts; never ran on a TPU"
)
#: The TPU build of TensorFlow stops at 2.20 on the package registry.
TPU_BUILD_LAST = "2.20"
#: Where pip finds the TPU build's libtpu (tensorflow/tensorflow#96203, Google's Colab recipe).
LIBTPU_INDEX = "https://storage.googleapis.com/libtpu-tf-releases/index.html"

#: Every platform, as platforms.md lists them.
PLATFORMS = (
    Platform(
        "laptop",
        "A laptop or GPU machine, Python ≤ 3.11",
        f'`pip install "{TPUSHIM}[cpu] @ git+…"` (TensorFlow 2.15, `numpy<2`)',
        "stock's estimator",
        "exactly as without tpushim; `--mode cpu` runs the TPU code path (TPUEstimator) on the CPU",
        _SUITE,
    ),
    Platform(
        "laptop-py312",
        "A laptop or GPU machine, Python 3.12 – 3.13",
        f'`pip install "{TPUSHIM}[cpu] @ git+…"` (TensorFlow 2.21, tf-keras 2.21)',
        "tpushim's estimator API",
        "TensorFlow ≥ 2.16 has no estimator: tpushim's gives stock 2.15's numbers; `--mode cpu` "
        "runs the strategy engine on CPU/GPU",
        _SUITE,
    ),
    Platform(
        "colab",
        "Colab CPU/GPU (Python 3.12, TensorFlow 2.19 preinstalled)",
        f'`pip install "tf-keras~=2.19.0" {TPUSHIM}` (the notebooks\' first cell does it)',
        "tpushim's estimator API",
        "as the row above, on Colab's TensorFlow",
        "as above (tested on TensorFlow 2.21, and 2.19 with tf-keras)",
        "how-to/colab.md",
    ),
    Platform(
        "kaggle",
        "Kaggle CPU/GPU (Python 3.12, `tensorflow-cpu` 2.20)",
        f'`pip install --no-deps "tf-keras~=2.20.0"`, then `pip install {TPUSHIM}` (with its '
        "dependencies tf-keras brings the full `tensorflow` beside `tensorflow-cpu`)",
        "tpushim's estimator API",
        "as on Colab",
        "as above",
    ),
    Platform(
        "colab-tpu",
        "Colab's TPU runtime (a v5e-1, PJRT, no TensorFlow installed)",
        f'`pip install "tensorflow=={TPU_BUILD_LAST}.*" "tensorflow-tpu=={TPU_BUILD_LAST}.*" '
        f'"tf-keras~={TPU_BUILD_LAST}.0" {TPUSHIM} -f {LIBTPU_INDEX}` (`tensorflow-tpu` stops '
        f"at {TPU_BUILD_LAST})",
        "the strategy engine",
        "`TPUStrategy`, TensorFlow's TPU path on TensorFlow ≥ 2.16; where this TensorFlow cannot "
        "drive the TPU the conversion says so and names this install. Without `tensorflow-tpu`, "
        "the JAX engine (as on Kaggle's TPU) runs the step in JAX",
        _STRATEGY_PROOF,
        "how-to/colab.md",
    ),
    Platform(
        "kaggle-tpu",
        "Kaggle's TPU (a v5e-8, `tensorflow-cpu` and JAX)",
        f'`pip install --no-deps "tf-keras~=2.20.0" tf2jax dm-tree`, then `pip install {TPUSHIM}` '
        "(JAX and libtpu are the image's; TensorFlow's TPU build cannot share this image with JAX)",
        "the JAX engine",
        "TensorFlow keeps the script's graph, input_fn and checkpoints on the CPU; the Keras "
        "model's step runs in JAX on the TPU's chips. `engine=auto` picks it where a TPU device "
        "file, libtpu, jax and tf2jax are installed and no `tensorflow-tpu` is; many models are "
        "still refused, naming why (the engines page)",
        "CPU only: the JAX engine on 8 XLA CPU devices gives stock 2.15's numbers on the demo and "
        "resumes stock's checkpoints; never ran on a TPU",
    ),
    Platform(
        "tpu-vm",
        "Cloud TPU VM, v2, v3 or v4, StreamExecutor image (`tpu-vm-tf-2.15.1-se`, "
        "`tpu-vm-tf-2.14.1`, …)",
        f"`pip install {TPUSHIM}` (keep the image's TensorFlow: `[cpu]` would add one without TPU "
        "support)",
        "TPUEstimator",
        "the image's TensorFlow ≤ 2.15 drives the TPU through it",
        _TPUESTIMATOR_PROOF,
        "how-to/tpu-vm.md",
    ),
    Platform(
        "tpu-vm-pjrt",
        "Cloud TPU VM, v5e, v5p or v6e (`tpu-vm-tf-2.15.0-pjrt` and later: PJRT only)",
        "as above",
        "the strategy engine",
        "TPUEstimator cannot run on PJRT; `engine=auto` picks the strategy engine where "
        "`PJRT_DEVICE=TPU` or `TF_PLUGGABLE_DEVICE_LIBRARY_PATH` names libtpu, else set "
        "`TPUSHIM_ENGINE=strategy`",
        _STRATEGY_PROOF,
        "reference/tpus.md",
    ),
    Platform(
        "tpu-node",
        "A TPU node (a TPU over the network, `grpc://IP:8470`; older Colab TPU runtimes)",
        f"any supported TensorFlow ≤ 2.15 on the client, and `pip install {TPUSHIM}`",
        "TPUEstimator",
        "an address that does not answer as a TPU fails at conversion within 20 s",
        _TPUESTIMATOR_PROOF,
        "how-to/tpu-node.md",
    ),
)

BY_KEY = {p.key: p for p in PLATFORMS}


class Here:
    """This machine's platform, as :func:`detect` tells it.

    Attributes:
      platform: its :class:`Platform`.
      generations: the TPU generations it may be (:class:`tpushim._tpus.Generation`): one from an
        accelerator type, a family from device files, none without a TPU.
      evidence: what told it (variable names, device files), in the order read.
    """

    __slots__ = ("evidence", "generations", "platform")

    def __init__(self, platform, generations, evidence):
        self.platform, self.generations = platform, tuple(generations)
        self.evidence = tuple(evidence)

    @property
    def key(self):
        return self.platform.key

    def describe(self):
        """One line for people: the platform, and what told it."""
        told = ", ".join(self.evidence) or "no platform variable or TPU device file"
        return f"{self.platform.where} (from {told})"

    def as_dict(self):
        return {
            "key": self.key,
            "where": self.platform.where,
            "tpu_generation": _tpus.in_words(g.name for g in self.generations) or None,
            "evidence": list(self.evidence),
        }

    def __repr__(self):
        return f"Here({self.key!r}, {self.generations!r}, {self.evidence!r})"


#: Every environment variable :func:`detect` reads (tests clear them).
PLATFORM_ENV_VARS = (
    "COLAB_RELEASE_TAG",
    "COLAB_TPU_ADDR",
    "KAGGLE_KERNEL_RUN_TYPE",
    "KAGGLE_URL_BASE",
    "ISTPUVM",
    "TPU_ACCELERATOR_TYPE",
)


def _tpu_seen(environ, device_globs):
    """``(generations, evidence)`` of a TPU attached to this machine, or ``((), [])``: one
    generation from its accelerator type, a family from its device files (``/dev/accel*``: v2,
    v3 or v4; ``/dev/vfio/N``: v5e, v5p or v6e)."""
    accelerator = environ.get("TPU_ACCELERATOR_TYPE", "").strip()
    if accelerator:
        generation = _tpus.of_accelerator_type(accelerator)
        return (generation,) if generation else (), [f"TPU_ACCELERATOR_TYPE={accelerator}"]
    import glob  # not at start-up

    for i, pattern in enumerate(device_globs):
        found = sorted(glob.glob(pattern))
        if found:
            # The i-th of the globs looked at stands for the i-th of the table's (tests point
            # them at a folder of fake device files).
            table = _tpus.DEVICE_GLOBS[i] if i < len(_tpus.DEVICE_GLOBS) else None
            family = tuple(g for g in _tpus.GENERATIONS if table and g.device_glob == table)
            return family, [found[0]]
    return (), []


def detect(environ=None, device_globs=None, python=None):
    """This machine's platform (:class:`Here`), from environment variables and device files.

    Args:
      environ: the environment (``os.environ`` when None).
      device_globs: the TPU device files to look for (default: the TPU generations table's,
        :data:`tpushim._tpus.DEVICE_GLOBS`; :func:`tpushim._detect.platform` passes its own).
      python: ``(major, minor)`` of the Python (this one's when None).
    """
    environ = os.environ if environ is None else environ
    if device_globs is None:
        device_globs = _tpus.DEVICE_GLOBS
    python = tuple(sys.version_info[:2]) if python is None else python
    generations, tpu_evidence = _tpu_seen(environ, device_globs)
    colab = [v for v in ("COLAB_RELEASE_TAG",) if environ.get(v, "").strip()]
    kaggle = [
        v for v in ("KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_URL_BASE") if environ.get(v, "").strip()
    ]
    if environ.get("COLAB_TPU_ADDR", "").strip():
        return Here(BY_KEY["tpu-node"], (), [*colab, "COLAB_TPU_ADDR"])
    if colab:
        key = "colab-tpu" if tpu_evidence else "colab"
        return Here(BY_KEY[key], generations, colab + tpu_evidence)
    if kaggle:
        if not tpu_evidence and environ.get("ISTPUVM", "").strip():
            tpu_evidence = ["ISTPUVM"]  # Kaggle's TPU image says so (its generation: not told)
        key = "kaggle-tpu" if tpu_evidence else "kaggle"
        return Here(BY_KEY[key], generations, kaggle + tpu_evidence)
    if tpu_evidence:
        pjrt = bool(generations) and all(g.pjrt_only for g in generations)
        return Here(BY_KEY["tpu-vm-pjrt" if pjrt else "tpu-vm"], generations, tpu_evidence)
    return Here(BY_KEY["laptop" if python < (3, 12) else "laptop-py312"], (), [])


def tpu_install(here, release):
    """The sentence that says what would train on this machine's TPU, where the platform knows
    better than TensorFlow's release alone, else None (:func:`tpushim._detect.
    check_tpu_support` then names the install of the release).

    Args:
      here: :func:`detect`'s answer.
      release: TensorFlow's ``(major, minor)``.
    """
    if here.key == "kaggle-tpu":
        return (
            "On Kaggle's TPU (a v5e-8) no TensorFlow trains on the TPU: TensorFlow's TPU build "
            "cannot share its image with JAX."
        )
    if here.key == "colab-tpu" and release < (2, 16):
        line = BY_KEY["colab-tpu"].install.split("` (")[0].strip("`")
        return (
            "Colab's TPU runtime (a v5e-1) runs TensorFlow only on PJRT, which TensorFlow 2.15's "
            f"pip builds lack: to train on the TPU, {line}."
        )
    return None


# -- the docs' tables ---------------------------------------------------------------------------

PAGE_HEADER = "| where | install | engine | why, and what else | proven |\n|---|---|---|---|---|"
README_HEADER = "| where | install | engine |\n|---|---|---|"


def markdown_table():
    """docs/how-to/platforms.md's table, from :data:`PLATFORMS`."""
    rows = [PAGE_HEADER]
    for p in PLATFORMS:
        rows.append(f"| {p.where} | {p.install} | {p.engine} | {p.runs} | {p.proven} |")
    return "\n".join(rows)


def readme_table():
    """README's "Where to run" table: the same rows, their install and engine, linked to their
    pages."""
    rows = [README_HEADER]
    for p in PLATFORMS:
        where = f"[{p.where}](docs/{p.page})" if p.page else p.where
        rows.append(f"| {where} | {p.install} | {p.engine} |")
    return "\n".join(rows)


def main(argv=None):
    """``python -m tpushim._platforms [--readme]``: prints platforms.md's table (README's)."""
    argv = sys.argv[1:] if argv is None else argv
    print(readme_table() if "--readme" in argv else markdown_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
