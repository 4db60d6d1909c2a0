"""Prints the shell commands of README.md's "Two commands" section, one a line, in order.

.ci/run runs exactly these, verbatim, in a fresh venv; tests/tools/test_docs.py checks what they are.
"""

import pathlib
import re
import sys

SECTION = "## Two commands for a fresh machine"


def commands(readme):
    """The lines of the ```bash blocks between SECTION and the next ``## `` heading."""
    text = readme.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return [
        line.strip()
        for block in re.findall(r"```bash\n(.*?)```", text, re.S)
        for line in block.splitlines()
        if line.strip()
    ]


if __name__ == "__main__":
    root = pathlib.Path(__file__).resolve().parent.parent
    path = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else root / "README.md"
    print("\n".join(commands(path.read_text(encoding="utf-8"))))
