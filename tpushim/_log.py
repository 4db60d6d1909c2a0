"""tpushim's one logger, and the stderr it writes to when the application configured no logging.

A conversion to a TPUEstimator (tpu or cpu mode) is news a user must see, so its one line reaches
stderr even in a script that never configured logging -- the way ``logging.lastResort`` shows a
warning -- unless ``quiet`` (``patch(quiet=True)``, ``TPUSHIM_QUIET=1``, the runner's ``-q``). The
stock path (no TPU, mode auto) stays silent: patching changes nothing visible where nothing changes.
Where logging is configured, the line goes through it at INFO, and nothing is printed besides.
Imported when there is something to log (logging costs milliseconds of start-up).
"""

import logging
import sys
import threading  # logging imports it already

logger = logging.getLogger("tpushim")
_lock = threading.Lock()


class ConsoleHandler(logging.Handler):
    """Writes tpushim's log lines to stderr while the application has configured no logging.

    Once the application configures the root logger (``logging.basicConfig`` & co.), tpushim's
    lines reach it by propagation in its format, and this handler steps aside so no line is
    printed twice.
    """

    def filter(self, record):
        return not logging.getLogger().handlers and super().filter(record)

    def format(self, record):
        message = super().format(record)
        return message if message.startswith("tpushim") else f"tpushim: {message}"

    def emit(self, record):
        try:
            # sys.stderr at emit time: notebooks and test runners replace it after start-up.
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def show(level=None):
    """Shows tpushim's lines on stderr; idempotent. Returns the handler.

    Args:
      level: None shows INFO and above, keeping a level the application gave the ``tpushim``
        logger; a ``logging`` level or its name (``"DEBUG"``: ``-v``, ``TPUSHIM_LOG_LEVEL``) sets
        both the handler's and the logger's level.
    """
    with _lock:  # two threads showing at once add one handler, not two
        handler = next((h for h in logger.handlers if isinstance(h, ConsoleHandler)), None)
        if handler is None:
            handler = ConsoleHandler(logging.INFO)
            logger.addHandler(handler)
        if level is None:
            if logger.level == logging.NOTSET:
                logger.setLevel(logging.INFO)
        else:
            handler.setLevel(level)
            logger.setLevel(level)
    return handler


def hide():
    """Removes what :func:`show` added."""
    with _lock:
        for handler in [h for h in logger.handlers if isinstance(h, ConsoleHandler)]:
            logger.removeHandler(handler)


def conversion(description, quiet):
    """Logs ``model_to_estimator -> description``; also prints it on stderr when no handler would
    (nothing configured, no :class:`ConsoleHandler`), unless ``quiet``."""
    logger.info("model_to_estimator -> %s", description)
    if not quiet and not logger.hasHandlers():
        sys.stderr.write(f"tpushim: model_to_estimator -> {description}\n")
        sys.stderr.flush()
