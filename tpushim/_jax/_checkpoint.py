"""The JAX engine's checkpoints, written by stock's own Saver in stock's training graph.

The conversion builds stock's training graph of the model once (the clone keras_lib trains,
its optimizer's slots and hyperparameters, the global step as the optimizer's iterations, and
the Saver stock's Keras estimator saves with: :func:`tpushim._tfprivate.checkpoint.stock_training_graph`).
A checkpoint is written by loading the engine's values into that graph's variables and running
its Saver: stock's format (object-based for ``checkpoint_format='checkpoint'``, name-based for
``'saver'``), stock's variable and slot names (``hidden/kernel``,
``training/SGD/hidden/kernel/momentum``, ``global_step``), stock's ``checkpoint`` state file and
``.meta``. The hyperparameters keep the values the optimizer's config gave them.

The checkpoints kept are stock's: a name-based Saver (the Estimator's default one) keeps
``keep_checkpoint_max`` and one every ``keep_checkpoint_every_n_hours``; keras_lib's object-based
one keeps 5, whatever the RunConfig says (its Saver's defaults). A new Saver per ``train()``
call, as stock builds one per call's graph, continuing the rotation over the checkpoints the
model_dir's ``checkpoint`` state lists.

The engine's values are matched with stock's names by their object-graph path, which the user's
model and stock's clone share (``layer_with_weights-0/kernel``; a slot at
``.../.OPTIMIZER_SLOT/optimizer/<slot>``). A checkpoint is read by what it holds, either format:
a run continues from a model_dir stock or another engine wrote.
"""

import os

import numpy as np
import tensorflow as tf

from tpushim import _stock_graphs, _tfprivate

_SLOT = "/.OPTIMIZER_SLOT/optimizer/"
_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"
_STEP_PATHS = ("estimator_global_step", "optimizer/iter")
#: tf.compat.v1.train.AdamOptimizer's non-slot variables -> its attribute holding their beta
_POWERS = {"beta1_power": "_beta1", "beta2_power": "_beta2"}
#: an optimizer's non-slot variables the engine updates (legacy Nadam's momentum schedule's
#: product), kept in its state under the same name
_SCALARS = ("momentum_cache",)


def _name(variable):
    return variable.name.split(":")[0]


class StockCheckpoints:
    """Stock's checkpoints of one converted model.

    Args:
      keras_model: the user's compiled Keras model (its optimizer stock's legacy one).
      custom_objects: as given to ``model_to_estimator``.
      object_based: the format ``checkpoint_format`` asked for.
      features: a subclassed model's: the input's feature specs, on which stock's graph builds
        its clone.
      built: a subclassed model's: the engine's built copy of it
        (:mod:`tpushim._jax._subclassed`), whose weights (their object paths) are the engine's.
    """

    def __init__(self, keras_model, custom_objects, object_based, features=None, built=None):
        # a clone stock does not make here; its seeds counted: stock's model_fn draws as many
        # in each train(), evaluate() and predict() (its clone), :meth:`draw_stocks_seeds`
        with _tfprivate.keras.keras_random_state_kept(counted=True) as kept:
            names, _, graph, meta, _, metrics, _ = _tfprivate.checkpoint.stock_training_graph(
                keras_model, custom_objects, features, object_based
            )
        self.stock_draws = kept.draws
        self.graph, self.meta, self.metric_names = graph, meta, metrics
        self.object_based = object_based
        owner = keras_model if built is None else built
        weights = {id(v): _name(v) for v in owner.weights}
        by_path = {
            path: weights[id(v)]
            for path, v in _tfprivate.checkpoint.checkpoint_variables(owner).items()
            if id(v) in weights
        }
        #: stock's name -> (object path, what it holds): ("weight", var), ("slot", slot, var),
        #: ("step",), ("scalar", name); the hyperparameters are left out (their config values).
        self.sources = {}
        for path, name in names.items():
            if path in by_path:
                self.sources[name] = (path, ("weight", by_path[path]))
            elif _SLOT in path and path.split(_SLOT)[0] in by_path:
                owner, slot = path.split(_SLOT)
                # (a tf.compat.v1.train optimizer's slots: Keras's TFOptimizer's "optimizer/m")
                slot = slot.rsplit("/", 1)[-1]
                self.sources[name] = (path, ("slot", slot, by_path[owner]))
            elif path in _STEP_PATHS:
                self.sources[name] = (path, ("step",))
            elif path.startswith("optimizer/") and path.rsplit("/", 1)[-1] in _SCALARS:
                self.sources[name] = (path, ("scalar", path.rsplit("/", 1)[-1]))
            elif path.rsplit("/", 1)[-1] in _POWERS and path.startswith("optimizer/"):
                beta = _POWERS[path.rsplit("/", 1)[-1]]
                value = getattr(getattr(keras_model.optimizer, "optimizer", None), beta, None)
                if value is not None:  # tf.compat.v1.train.AdamOptimizer's beta powers
                    self.sources[name] = (path, ("power", float(value)))
        self._session = self._saver = None

    def draw_stocks_seeds(self):
        """The Keras seeds stock's model_fn draws as it clones the model (in each call's graph;
        the engine makes no clone there), drawn from the program's random state: a model the
        program makes next starts from stock's initial weights."""
        _tfprivate.keras.draw_keras_seeds(self.stock_draws)

    def saver_def(self, config):
        """The SaverDef stock saves this model's checkpoints with under ``config`` (a RunConfig):
        the Estimator's default name-based Saver takes ``keep_checkpoint_max`` and
        ``keep_checkpoint_every_n_hours`` from it; keras_lib's object-based Saver keeps its
        defaults (5 kept, one every 10,000 hours)."""
        saver_def = type(self.meta.saver_def)()
        saver_def.CopyFrom(self.meta.saver_def)
        if not self.object_based:
            saver_def.max_to_keep = config.keep_checkpoint_max or 0  # None or 0: keep all
            saver_def.keep_checkpoint_every_n_hours = config.keep_checkpoint_every_n_hours
        return saver_def

    def begin(self, config):
        """A ``train()`` call begins: stock's Saver for it (see the module)."""
        self._open()
        with self.graph.as_default():
            self._saver = tf.compat.v1.train.Saver(saver_def=self.saver_def(config))
            self._saver.build()  # its clock for keep_checkpoint_every_n_hours starts here
            state = tf.train.get_checkpoint_state(config.model_dir)
            if state is not None:  # stock's rotation continues over the run's earlier ones
                # (once, as stock's session restoring them: their files' times are seconds)
                self._saver.recover_last_checkpoints(list(state.all_model_checkpoint_paths))

    def _open(self):
        if self._session is None:
            with self.graph.as_default():
                self._session = tf.compat.v1.Session(graph=self.graph)
                self._variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
                self._session.run(tf.compat.v1.global_variables_initializer())
        return self._session

    def write(self, model_dir, step, weights, slots):
        """Saves ``weights`` (variable name -> value), ``slots`` (slot -> {variable name:
        value}) and the global ``step`` as stock's ``model_dir/model.ckpt-<step>``; returns its
        path. Older checkpoints beyond the Saver's ``max_to_keep`` are rotated as stock's."""
        session, loads, feeds = self._open(), [], {}
        with self.graph.as_default():
            for name, (_, source) in self.sources.items():
                if source[0] == "weight":
                    value = weights.get(source[1])
                elif source[0] == "slot":
                    value = slots.get(source[1], {}).get(source[2])
                elif source[0] == "scalar":
                    value = slots.get(source[1])
                elif source[0] == "power":  # beta ** (steps + 1), as its updates leave it
                    value = np.float32(source[1]) ** np.float32(int(step) + 1)
                else:
                    value = step
                if value is not None:
                    variable = self._variables[name]
                    # (as Variable.load: its initializer run, its value fed)
                    loads.append(variable.initializer)
                    feeds[variable.initializer.inputs[1]] = np.asarray(value).astype(
                        variable.dtype.as_numpy_dtype
                    )
            # every value loaded in one run (one per variable costs seconds on a large graph)
            session.run(loads, feed_dict=feeds)
            return self._saver.save(
                session, os.path.join(model_dir, "model.ckpt"), global_step=int(step)
            )

    def read(self, path):
        """``(step, weights, slots)`` from the checkpoint at ``path``, in either format."""
        reader = tf.train.load_checkpoint(path)
        object_based = reader.has_tensor(_stock_graphs.OBJECT_GRAPH_KEY)

        def value_of(name, obj_path):
            key = obj_path + _VALUE if object_based else name
            return reader.get_tensor(key) if reader.has_tensor(key) else None

        step, weights, slots, missing = self.assigned(value_of)
        if missing:
            raise tf.errors.NotFoundError(
                None,
                None,
                f"Restoring from checkpoint {path} failed: it has no value for "
                f"{', '.join(sorted(missing))} (names in stock's training graph). Was it written "
                "for another model or optimizer? Train in a new model_dir, or restore the "
                "checkpoint this model_dir was trained with.",
            )
        return step, weights, slots

    def assigned(self, value_of):
        """``(step, weights, slots, missing)``: the engine's values of ``value_of(stock name,
        object path)`` (None: it has none) for each of stock's variables, and the names of those
        with none (a slot or an optimizer's scalar is not missed: a warm start's checkpoint may
        hold none)."""
        step, weights, slots, missing = 0, {}, {}, []
        for name, (obj_path, source) in self.sources.items():
            if source[0] == "power":  # the step's: computed from the global step
                continue
            value = value_of(name, obj_path)
            if value is None:
                if source[0] not in ("slot", "scalar"):  # a warm start's may hold none
                    missing.append(name)
                continue
            if source[0] == "weight":
                weights[source[1]] = value
            elif source[0] == "slot":
                slots.setdefault(source[1], {})[source[2]] = value
            elif source[0] == "scalar":
                slots[source[1]] = value
            else:
                step = int(value)
        return step, weights, slots, missing
