"""One table of the TPU generations: what each is called, how a machine shows it, which TensorFlow
runtime drives it, its cores and chips, and which of tpushim's engines runs it.

The one source of these facts: detection (:mod:`tpushim._detect`'s device files), the default
number of cores (:data:`tpushim._settings.DEFAULT_CORES`), the preflight's faked TPU system
(:mod:`tpushim._preflight.graph_checks`, :mod:`tpushim._preflight.faketpu`) and the table of
docs/reference/tpus.md (``python -m tpushim._tpus`` prints it) read it.

Imported by ``import tpushim`` (through ``_settings``): plain classes and tuples, nothing slow.

Sources (public), for every fact below:
  - TensorCores per chip, megacore: Cloud TPU's system architecture pages
    (https://cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e, /tpu7x) and JAX's ``ChipVersion``
    (two TensorCores on v2, v3, v4, v5p and TPU7x, megacore on v4 and v5p; one on v5e and v6e).
  - Runtime and TensorFlow releases: Cloud TPU's software versions
    (https://cloud.google.com/tpu/docs/runtimes): v5e, v5p and v6e take TensorFlow 2.15.0 and
    later, on PJRT only; TPU7x takes no TensorFlow ("TensorFlow is not supported",
    https://docs.cloud.google.com/tpu/docs/tpu7x).
  - Device files: ``/dev/accel*`` on v2 - v4, ``/dev/vfio/N`` (one IOMMU group per chip) on v5e,
    v5p and v6e (marin-community/marin#4941, yixiaoer/tpux#6, pytorch/xla#9753).
  - PCI device ids (vendor 0x1ae0): JAX's ``jax/_src/hardware_utils.py`` (``_TPU_PCI_DEVICE_IDS``).
  - Chips per host: 4 on v2 - v4 and v5p (a 2 x 2 block); 8 on one v5e or v6e board of 8 chips
    (``v5litepod-8``, ``v6e-8``), 4 per host in their slices of several hosts; 4 per TPU7x VM
    (GKE's Ironwood page).
"""

import os

TPUESTIMATOR = "tpuestimator"
STRATEGY = "strategy"

STREAM_EXECUTOR = "StreamExecutor"
PJRT = "PJRT"


class Generation:
    """One TPU generation (a row of the table).

    Attributes:
      name: how Cloud TPU names it (``v2`` ... ``v6e``, ``TPU7x``).
      aliases: other names it goes by, lower case (``v5litepod``, ``trillium``).
      accelerator_prefix: how its accelerator types start (``v5litepod-`` of ``v5litepod-8``).
      type_counts: what the number of an accelerator type counts: ``TensorCores`` or ``chips``.
      device_glob: the device files a VM of it has (None: not known).
      pci_device_id: its chips' PCI device id (vendor 0x1ae0), or None.
      runtime: the TensorFlow TPU runtime of its images: ``StreamExecutor`` (``PJRT`` on
        ``-pjrt`` images too) or ``PJRT`` only; None where TensorFlow does not run on it.
      pjrt_images: whether ``-pjrt`` images exist for it beside the StreamExecutor ones.
      cores_per_chip: TensorCores per chip.
      megacore: whether TensorFlow sees a chip's two TensorCores as one device.
      chips_per_host: chips on one host of its smallest board.
      slice_chips_per_host: chips on each host of a slice of several hosts.
      board: the accelerator type of that board (one host), and its slices' examples.
      tensorflow: which TensorFlow releases drive it, in words.
      images: its software versions (``gcloud ... --version``), in words.
      engine: tpushim's engine under ``engine=auto`` (None: none).
    """

    __slots__ = (
        "accelerator_prefix",
        "aliases",
        "board",
        "chips_per_host",
        "cores_per_chip",
        "device_glob",
        "engine",
        "images",
        "megacore",
        "name",
        "pci_device_id",
        "pjrt_images",
        "runtime",
        "slice_chips_per_host",
        "slices",
        "tensorflow",
        "type_counts",
    )

    def __init__(self, name, **facts):
        self.name = name
        for key in self.__slots__:
            if key != "name":
                setattr(self, key, facts.pop(key))
        if facts:
            raise TypeError(f"unknown facts for {name}: {sorted(facts)}")

    @property
    def devices_per_chip(self):
        """TPU devices TensorFlow sees per chip: one per TensorCore, one per megacore chip."""
        return 1 if self.megacore else self.cores_per_chip

    @property
    def devices_per_host(self):
        """TPU devices TensorFlow sees on one host of the smallest board (its TPU cores)."""
        return self.chips_per_host * self.devices_per_chip

    @property
    def pjrt_only(self):
        return self.runtime == PJRT

    def __repr__(self):
        return f"Generation({self.name!r})"


_SE_IMAGES = (
    "`tpu-vm-tf-2.15.1-se`, `tpu-vm-tf-2.14.1` (2.12 – 2.14: no suffix); slices: "
    "`tpu-vm-tf-2.15.1-pod-se`, `tpu-vm-tf-2.14.1-pod`"
)
_SE_TENSORFLOW = "2.12 – 2.15, from its images (pip's TensorFlow has no TPU support)"
_PJRT_TENSORFLOW = "2.15.0 and later"
_PJRT_IMAGES = "`tpu-vm-tf-2.15.0-pjrt` and later; slices: `tpu-vm-tf-2.15.0-pod-pjrt`"

#: Every TPU generation, oldest first.
GENERATIONS = (
    Generation(
        "v2",
        aliases=("v2",),
        accelerator_prefix="v2-",
        type_counts="TensorCores",
        device_glob="/dev/accel*",
        pci_device_id=None,  # JAX's table lists none for v2
        runtime=STREAM_EXECUTOR,
        pjrt_images=True,
        cores_per_chip=2,
        megacore=False,
        chips_per_host=4,
        slice_chips_per_host=4,
        board="v2-8",
        slices="v2-32",
        tensorflow=_SE_TENSORFLOW,
        images=_SE_IMAGES,
        engine=TPUESTIMATOR,
    ),
    Generation(
        "v3",
        aliases=("v3",),
        accelerator_prefix="v3-",
        type_counts="TensorCores",
        device_glob="/dev/accel*",
        pci_device_id="0x0027",
        runtime=STREAM_EXECUTOR,
        pjrt_images=True,
        cores_per_chip=2,
        megacore=False,
        chips_per_host=4,
        slice_chips_per_host=4,
        board="v3-8",
        slices="v3-32",
        tensorflow=_SE_TENSORFLOW,
        images=_SE_IMAGES,
        engine=TPUESTIMATOR,
    ),
    Generation(
        "v4",
        aliases=("v4",),
        accelerator_prefix="v4-",
        type_counts="TensorCores",
        device_glob="/dev/accel*",
        pci_device_id="0x005e",
        runtime=STREAM_EXECUTOR,
        pjrt_images=True,
        cores_per_chip=2,
        megacore=True,
        chips_per_host=4,
        slice_chips_per_host=4,
        board="v4-8",
        slices="v4-16",
        tensorflow=_SE_TENSORFLOW,
        images=(
            "as v2: from TensorFlow 2.10.1 on, v4 uses the v2/v3 images (before it: "
            "`tpu-vm-tf-2.10.0-v4`, `-pod-v4`)"
        ),
        engine=TPUESTIMATOR,
    ),
    Generation(
        "v5e",
        aliases=("v5e", "v5litepod", "v5lite"),
        accelerator_prefix="v5litepod-",
        type_counts="chips",
        device_glob="/dev/vfio/[0-9]*",
        pci_device_id="0x0063",
        runtime=PJRT,
        pjrt_images=True,
        cores_per_chip=1,
        megacore=False,
        chips_per_host=8,
        slice_chips_per_host=4,
        board="v5litepod-8",
        slices="v5litepod-1`, `-4`; slices `v5litepod-16",
        tensorflow=_PJRT_TENSORFLOW,
        images=_PJRT_IMAGES,
        engine=STRATEGY,
    ),
    Generation(
        "v5p",
        aliases=("v5p",),
        accelerator_prefix="v5p-",
        type_counts="TensorCores",
        device_glob="/dev/vfio/[0-9]*",
        pci_device_id="0x0062",
        runtime=PJRT,
        pjrt_images=True,
        cores_per_chip=2,
        megacore=True,
        chips_per_host=4,
        slice_chips_per_host=4,
        board="v5p-8",
        slices="v5p-16",
        tensorflow=_PJRT_TENSORFLOW,
        images=_PJRT_IMAGES,
        engine=STRATEGY,
    ),
    Generation(
        "v6e",
        aliases=("v6e", "trillium"),
        accelerator_prefix="v6e-",
        type_counts="chips",
        device_glob="/dev/vfio/[0-9]*",
        pci_device_id="0x006f",
        runtime=PJRT,
        pjrt_images=True,
        cores_per_chip=1,
        megacore=False,
        chips_per_host=8,
        slice_chips_per_host=4,
        board="v6e-8",
        slices="v6e-1`, `-4`; slices `v6e-16",
        tensorflow=_PJRT_TENSORFLOW,
        images=_PJRT_IMAGES,
        engine=STRATEGY,
    ),
    Generation(
        "TPU7x",
        aliases=("tpu7x", "ironwood"),
        accelerator_prefix="tpu7x-",
        type_counts=None,  # not verified here
        device_glob=None,  # not verified here
        pci_device_id="0x0076",
        runtime=None,
        pjrt_images=False,
        cores_per_chip=2,
        megacore=False,  # not verified here; TensorFlow does not run on it
        chips_per_host=4,
        slice_chips_per_host=4,
        board=None,
        slices=None,
        tensorflow="no TensorFlow: Cloud TPU runs JAX and PyTorch on it",
        images="none",
        engine=None,
    ),
)

#: The generation the preflight's faked TPU system is shaped as (TPUEstimator's generations
#: share its host: 4 chips, 2 TensorCores each, 8 TPU cores).
FAKED = GENERATIONS[1]

#: The chips of one host laid out on the TPU mesh (x, y), by chips per host: a v2/v3/v4 host's
#: 4 chips in a 2 x 2 block (torch_xla's TPU environment on a v4: CHIPS_PER_HOST_BOUNDS 2,2,1).
HOST_BLOCKS = {4: (2, 2), 2: (1, 2)}

#: TPU cores a batch is checked against when no TPU says: the smallest board of the faked
#: generation (a v2-8 or v3-8).
DEFAULT_CORES = FAKED.devices_per_host

#: Every device file a TPU VM may have, in the table's order (tests point detection elsewhere).
DEVICE_GLOBS = tuple(dict.fromkeys(g.device_glob for g in GENERATIONS if g.device_glob))


def by_name(name):
    """The generation called ``name`` (a name or alias, any case), or None."""
    key = str(name or "").strip().lower()
    for generation in GENERATIONS:
        if key == generation.name.lower() or key in generation.aliases:
            return generation
    return None


def of_accelerator_type(accelerator_type):
    """The generation of an accelerator type (``v5litepod-8``, ``v4-16``, ``v6e-1``), or None."""
    text = str(accelerator_type or "").strip().lower()
    for generation in GENERATIONS:
        if text.startswith(generation.accelerator_prefix):
            return generation
    return None


def of_device_file(path):
    """The generations a device file is found on (``/dev/accel0``: v2 - v4), oldest first."""
    import fnmatch  # not at start-up

    return tuple(
        g for g in GENERATIONS if g.device_glob and fnmatch.fnmatch(str(path), g.device_glob)
    )


def boards_with(devices):
    """The smallest boards TensorFlow sees ``devices`` TPU cores on (``v2-8``, ``v3-8``)."""
    return tuple(
        g.board for g in GENERATIONS if g.board and g.runtime and g.devices_per_host == devices
    )


def in_words(names):
    """``a, b or c``."""
    names = list(names)
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


#: The variables :func:`pjrt_runtime` reads (tests unset them: a test machine runs no TPU).
PJRT_VARS = ("PJRT_DEVICE", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH")


def pjrt_runtime(environ=None):
    """What says this is a PJRT TPU runtime, as one phrase, or None.

    Told from the environment alone (no TPU call, no network, no hang): TensorFlow loads the
    TPU's PJRT plugin through ``TF_PLUGGABLE_DEVICE_LIBRARY_PATH`` (the path of ``libtpu.so``);
    ``PJRT_DEVICE=TPU`` names the runtime for every framework on the VM.
    """
    environ = os.environ if environ is None else environ
    if environ.get("PJRT_DEVICE", "").strip().upper() == "TPU":
        return "PJRT_DEVICE=TPU"
    library = environ.get("TF_PLUGGABLE_DEVICE_LIBRARY_PATH", "").strip()
    if library and "libtpu" in os.path.basename(library):
        return f"TF_PLUGGABLE_DEVICE_LIBRARY_PATH={library}"
    return None


# -- docs/reference/tpus.md's table ------------------------------------------------------------

TABLE_HEADER = (
    "| TPU | accelerator type: one board (a pod slice) | TensorCores per chip (TPU devices "
    "TensorFlow sees on one board) | chips per host | TensorFlow runtime | software version "
    "(image) | tpushim's engine (`engine=auto`) | proven where |\n"
    "|---|---|---|---|---|---|---|---|"
)

_PROVEN = {
    TPUESTIMATOR: (
        "CPU only: TPUEstimator's whole TPU graph for a faked 8-core system of 1, 2 and 4 hosts; "
        "8 cores emulated with numbers"
    ),
    STRATEGY: (
        "CPU only: the strategy engine on 8 logical CPU devices (`MirroredStrategy`, "
        "TPUStrategy's data-parallel semantics) and its step compiled with XLA; TPUStrategy "
        "itself never ran"
    ),
}

_ENGINE_WORDS = {
    TPUESTIMATOR: "TPUEstimator",
    STRATEGY: (
        "the strategy engine, where `PJRT_DEVICE=TPU` or `TF_PLUGGABLE_DEVICE_LIBRARY_PATH` names "
        "`libtpu` (else TPUEstimator, which fails there: set `engine=strategy`)"
    ),
    None: "none",
}


def _cells(g):
    """One generation's cells, in :data:`TABLE_HEADER`'s order."""
    label = "v6e (Trillium)" if g.name == "v6e" else g.name
    board = "—" if g.board is None else f"`{g.board}` (`{g.slices}` …)"
    if g.runtime is None:
        cores = f"{g.cores_per_chip}"
    elif g.megacore:
        cores = f"{g.cores_per_chip}, one device per chip (megacore) ({g.devices_per_host})"
    elif g.type_counts == "chips":
        cores = f"{g.cores_per_chip} ({g.devices_per_host} on `{g.board}`)"
    else:
        cores = (
            f"{g.cores_per_chip} ({g.devices_per_host}: {g.chips_per_host} chips × "
            f"{g.cores_per_chip})"
        )
    chips = str(g.chips_per_host)
    if g.slice_chips_per_host != g.chips_per_host:
        chips += f" ({g.slice_chips_per_host} per host in slices)"
    runtime = {
        STREAM_EXECUTOR: "StreamExecutor; PJRT on `-pjrt` images",
        PJRT: "PJRT only",
        None: "none",
    }[g.runtime]
    runtime += f" ({g.tensorflow})" if g.runtime is None else f": TensorFlow {g.tensorflow}"
    engine = _ENGINE_WORDS[g.engine]
    proven = _PROVEN.get(g.engine, "nothing: TensorFlow does not run on it")
    return [label, board, cores, chips, runtime, g.images, engine, proven]


def markdown_table():
    """docs/reference/tpus.md's table of the generations, from :data:`GENERATIONS`: a cell
    that repeats the first row of its runtime reads "as v2" ("as v5e")."""
    firsts = {}
    rows = [TABLE_HEADER]
    for generation in GENERATIONS:
        first = firsts.setdefault(generation.runtime, generation)
        cells, first_cells = _cells(generation), _cells(first)
        if first is not generation:
            for i in range(4, len(cells)):
                if cells[i] == first_cells[i]:
                    cells[i] = f"as {first.name}"
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv=None):
    """``python -m tpushim._tpus``: prints docs/reference/tpus.md's table."""
    print(markdown_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
