"""tpushim's one logger, and the stderr it writes to when the application configured no logging.

What tpushim changed is news a user must see -- a conversion to a TPU path (tpu or cpu mode), and
on TensorFlow >= 2.16 ``tf.keras`` made Keras 2 and every conversion taking tpushim's own
estimator -- so its one line reaches stderr even in a script that never configured logging, the
way ``logging.lastResort`` shows a warning, unless ``quiet`` (``patch(quiet=True)``,
``TPUSHIM_QUIET=1``, the runner's ``-q``). The stock path of TensorFlow <= 2.15 (no TPU, mode
auto) stays silent: patching changes nothing visible where nothing changes. Where logging is
configured, the line goes through it at INFO, and nothing is printed besides. Every line printed
here has one format, ``tpushim: ...`` (:func:`line`). Imported when there is something to log
(logging costs milliseconds of start-up).

absl's log functions run a bare ``logging.basicConfig()`` when the root logger has no handler, and
TensorFlow calls them (its checkpoint code does, inside a conversion): a root configured so, and
nothing else, is not the application's configuration (:func:`configured`). Where TensorFlow did
that, tpushim's lines are still its own, once, and not absl's ``INFO:tpushim:...`` besides.
"""

import logging
import sys
import threading  # logging imports it already

logger = logging.getLogger("tpushim")
_lock = threading.Lock()


def line(message):
    """``message`` as tpushim prints it on stderr: ``tpushim: message`` (a message that starts
    with the word already, ``tpushim set ...``, as it is)."""
    return message if message.startswith("tpushim") else f"tpushim: {message}"


def _absl_default(handler):
    """Whether ``handler`` is what a bare ``logging.basicConfig()`` puts on the root logger."""
    formatter = handler.formatter
    return (
        type(handler) is logging.StreamHandler
        and handler.level == logging.NOTSET
        and not handler.filters
        and handler.stream in (sys.stderr, sys.__stderr__)
        and formatter is not None
        and type(formatter) is logging.Formatter
        and getattr(formatter, "_fmt", None) == logging.BASIC_FORMAT
    )


def configured():
    """Whether the application configured logging: the root logger has a handler, and not only
    the one a bare ``basicConfig()`` (absl's, at TensorFlow's first absl log line) leaves on a root
    still at WARNING."""
    root = logging.getLogger()
    handlers = root.handlers
    if not handlers:
        return False
    return not (len(handlers) == 1 and root.level == logging.WARNING and _absl_default(handlers[0]))


class ConsoleHandler(logging.Handler):
    """Writes tpushim's log lines to stderr while the application has configured no logging.

    While it is on, the ``tpushim`` logger does not propagate: this handler passes each record on
    to the root logger's handlers itself once the application configured logging (so the lines
    reach it in its format, and nothing is printed twice), and otherwise prints it, also where
    only absl's default handler is on the root (which would print it a second time, as
    ``INFO:tpushim:...``).

    Attributes:
      threshold: the lowest level it prints (its own level stays NOTSET: what it passes on is
        every record the logger lets through, as propagation would).
    """

    def __init__(self, threshold=logging.INFO):
        super().__init__(logging.NOTSET)
        self.threshold = threshold

    def format(self, record):
        return line(super().format(record))

    def emit(self, record):
        if configured():
            for handler in logging.getLogger().handlers:  # what propagation would do
                if record.levelno >= handler.level:
                    handler.handle(record)
            return
        if record.levelno < self.threshold:
            return
        try:
            # sys.stderr at emit time: notebooks and test runners replace it after start-up.
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


_propagated = []  # the logger's propagate before show(): hide() puts it back


def show(level=None):
    """Shows tpushim's lines on stderr; idempotent. Returns the handler.

    Args:
      level: None shows INFO and above, keeping a level the application gave the ``tpushim``
        logger; a ``logging`` level or its name (``"DEBUG"``: ``-v``, ``TPUSHIM_LOG_LEVEL``) sets
        both the handler's threshold and the logger's level.
    """
    with _lock:  # two threads showing at once add one handler, not two
        handler = next((h for h in logger.handlers if isinstance(h, ConsoleHandler)), None)
        if handler is None:
            handler = ConsoleHandler()
            logger.addHandler(handler)
            _propagated[:] = [logger.propagate]
            logger.propagate = False  # the handler passes records on (see ConsoleHandler)
        if level is None:
            if logger.level == logging.NOTSET:
                logger.setLevel(logging.INFO)
        else:
            logger.setLevel(level)
            handler.threshold = logger.level  # a name made a number
    return handler


def hide():
    """Removes what :func:`show` added."""
    with _lock:
        shown = [h for h in logger.handlers if isinstance(h, ConsoleHandler)]
        for handler in shown:
            logger.removeHandler(handler)
        if shown:
            logger.propagate = _propagated.pop() if _propagated else True


def _shown(level):
    """Whether a record of the ``tpushim`` logger at ``level`` reaches a handler that takes it."""
    if not logger.isEnabledFor(level):
        return False
    current = logger
    while current is not None:
        if any(level >= h.level for h in current.handlers):
            return True
        current = current.parent if current.propagate else None
    return False


def news(message, quiet):
    """Logs ``message`` at INFO; also prints it on stderr (:func:`line`) where the application
    configured no logging and no handler shows it, unless ``quiet``."""
    logger.info(message)
    if not quiet and not _shown(logging.INFO) and not configured():
        sys.stderr.write(line(message) + "\n")
        sys.stderr.flush()


def conversion(description, quiet):
    """:func:`news` of ``model_to_estimator -> description``."""
    news(f"model_to_estimator -> {description}", quiet)
