"""``%load_ext tpushim`` and the ``%tpushim`` line magic (IPython, Jupyter, Colab).

Loading patches (honouring ``TPUSHIM_*``; a ``tpushim.patch(...)`` made before is kept as it is),
shows tpushim's conversion lines in cell output, and registers ``%tpushim``. Names bound to a
``model_to_estimator`` function before the extension loaded are reported with whether they will
convert: on TensorFlow <= 2.15 every public spelling calls ``keras_lib.model_to_estimator`` at
call time, which is what tpushim wraps, so they do. A name bound to a function tpushim wraps, before
it wrapped it (the private ``keras_lib.model_to_estimator`` on 2.15; every spelling on 2.16+, where
tf_keras's own function raises NotImplementedError), is rebound to tpushim's wrapper, and a line
says so: the wrapper passes calls through unchanged once unpatched.
"""

import sys

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from tpushim import _console, _settings
from tpushim._errors import ConfigurationError
from tpushim._patch import is_ours, is_patched, patch, targets, unpatch
from tpushim._status import status
from tpushim._versions import guard_warning_silenced

MAGIC_NAME = "tpushim"
_NAMES = ("model_to_estimator", "model_to_estimator_v2")


def _setting_options(magic):
    """``--mode`` & co.: the options (and help) ``python -m tpushim`` takes, from one table."""
    # magic_arguments lists the argument applied last first: reversed keeps the table's order.
    for flag, kwargs in reversed(_settings.OPTIONS):
        magic = argument(flag, **kwargs)(magic)
    return magic


@magic_arguments(name=MAGIC_NAME)
@argument(
    "action",
    nargs="?",
    choices=("status", "patch", "unpatch"),
    default="status",
    help="status (default): show what tpushim does now; patch: patch with the options "
    "given; unpatch: restore the stock model_to_estimator.",
)
@_setting_options
@argument("--off", action="store_true", help="the same as `%%tpushim unpatch`.")
def tpushim_magic(line):
    """Shows tpushim's status, or patches with new options, or unpatches.

    ``%tpushim --mode cpu`` is ``tpushim.patch(mode="cpu")``: options not given take their
    ``TPUSHIM_*`` value or default, exactly as in ``tpushim.patch(...)``. ``TPUSHIM_MODE=off`` in
    the environment still wins over every option.
    """
    args = parse_argstring(tpushim_magic, line)
    options = {
        name: getattr(args, name) for name in _settings.ENV_VARS if getattr(args, name) is not None
    }
    if args.off or args.action == "unpatch":
        if options:
            raise UsageError("%tpushim unpatch takes no options")
        was = is_patched()
        unpatch()
        print(
            "tpushim unpatched: model_to_estimator is the stock one again in this kernel"
            if was
            else "tpushim was not patched: model_to_estimator is the stock one"
        )
        print(f"(%{MAGIC_NAME} patch patches again; %{MAGIC_NAME} shows the status)")
        return
    elif options or args.action == "patch":
        try:
            with guard_warning_silenced():  # the status below shows its message, once
                patch(**options)
        except ConfigurationError as e:
            raise UsageError(str(e)) from None
    try:
        state = status()
        if is_patched():
            _console.show_conversions(quiet=state["quiet"])  # %tpushim --quiet
    except ConfigurationError as e:
        raise UsageError(str(e)) from None
    print(_console.format_status(state, surface="notebook"))


def _is_model_to_estimator(value):
    if is_ours(value):
        return True
    module = getattr(value, "__module__", None) or ""
    return (
        callable(value)
        and getattr(value, "__name__", None) in _NAMES
        and module.split(".")[0] in ("keras", "tensorflow", "tensorflow_estimator", "tf_keras")
    )


def bound_names(user_ns):
    """``{name: function}`` of the user's names bound to a model_to_estimator function."""
    found = {}
    for name, value in list(user_ns.items()):
        if name.startswith("_"):  # IPython's output history (_, __, _1, ...) repeats user values
            continue
        try:
            if _is_model_to_estimator(value):
                found[name] = value
        except Exception:
            continue  # an object whose attribute access raises is not model_to_estimator
    return found


def wrapper_of(value):
    """tpushim's wrapper of ``value`` when ``value`` is a model_to_estimator function tpushim wraps
    now (bound before it was wrapped, it bypasses the wrapper), else None."""
    for module_name, attribute, kind in targets():
        current = getattr(sys.modules.get(module_name), attribute, None)
        if kind == "convert" and is_ours(current) and value is current.__wrapped__:
            return current
    return None


def will_convert(value):
    """(True or False, why) for a function the user bound before patching."""
    if not is_patched():
        return False, "tpushim is not patched in this kernel"
    if is_ours(value):
        return True, "it is tpushim's wrapper itself"
    if wrapper_of(value) is not None:
        return False, (
            "it is the very function tpushim wraps, bound before the patch; bind it again now, "
            "or use tf.keras.estimator.model_to_estimator"
        )
    return True, (
        "it calls keras_lib.model_to_estimator at call time, and tpushim wraps that "
        "function: every spelling converts, whenever it was bound"
    )


def _describe(value):
    wrapped = getattr(value, "__wrapped__", value)
    return f"{getattr(wrapped, '__module__', '?')}.{getattr(wrapped, '__qualname__', '?')}"


def load_ipython_extension(ipython):
    """``%load_ext tpushim``: patches (honouring ``TPUSHIM_*``) and adds the ``%tpushim`` magic."""
    ipython.register_magic_function(tpushim_magic, magic_kind="line", magic_name=MAGIC_NAME)
    try:
        if not is_patched():  # keep a tpushim.patch(...) the notebook already made
            with guard_warning_silenced():  # its message is printed below, once
                patch()
        state = status()
        _console.show_conversions(quiet=state["quiet"])  # TPUSHIM_QUIET, patch(quiet=True)
    except ConfigurationError as e:
        print(f"tpushim: not patched: {e}\nFix the variable, then run %tpushim patch.")
        return
    print(
        f"tpushim {state['versions']['tpushim']} "
        + ("patched" if state["patched"] else "NOT patched")
        + f": model_to_estimator returns {_console.outcome(state, 'notebook')}. "
        + f"%{MAGIC_NAME} shows the status and takes options."
    )
    if state.get("unsupported"):
        print(f"tpushim: {state['unsupported']}")
    for name, value in bound_names(ipython.user_ns).items():
        wrapper = wrapper_of(value) if state["patched"] else None
        if wrapper is not None:  # the notebook's own name would bypass the patch: point it at it
            ipython.user_ns[name] = wrapper
            print(
                f"tpushim: `{name}` was bound to {_describe(value)} before %load_ext tpushim; "
                f"tpushim rebound it to its wrapper of that function, so it converts "
                f"(%{MAGIC_NAME} unpatch makes it stock's again)."
            )
            continue
        converts, why = will_convert(value)
        print(
            f"tpushim: `{name}` was bound to {_describe(value)} before %load_ext tpushim; it "
            + ("will still convert: " if converts else "will NOT convert: ")
            + why
            + "."
        )


def unload_ipython_extension(ipython):
    """``%unload_ext tpushim``: unpatches, and removes the ``%tpushim`` magic."""
    unpatch()
    _console.hide_conversions()
    ipython.magics_manager.magics["line"].pop(MAGIC_NAME, None)
