"""``python -m tpushim [options] SCRIPT [ARGS...] | -m MODULE [ARGS...] | info | demo | check``.

See ``python -m tpushim --help``; the command line lives in :mod:`tpushim._cli`.
"""

import sys

from tpushim._cli import main

if __name__ == "__main__":
    sys.exit(main())
