"""``python -m tpushim [options] SCRIPT [ARGS...] | -m MODULE [ARGS...] | info | demo``.

See ``python -m tpushim --help``; the runner lives in :mod:`tpushim._runner`.
"""

import sys

from tpushim._runner import main

if __name__ == "__main__":
    sys.exit(main())
