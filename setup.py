"""The one build step pyproject.toml cannot declare: ``tpushim-autopatch.pth`` into site-packages.

Everything else (name, version, dependencies, extras) is in pyproject.toml; setuptools reads both.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.develop import develop

# TPUSHIM_AUTOPATCH=1: site executes .pth lines that start with "import" at every interpreter
# start. This one reads the variable with string methods only (its value is never evaluated) and,
# only when it is on, runs tpushim/_autopatch.py by path -- not as tpushim._autopatch: the package's
# dependencies may sit in a site dir that site has not added yet. start() never raises.
AUTOPATCH_PTH = "tpushim-autopatch.pth"
AUTOPATCH_LINE = (
    'import os; os.environ.get("TPUSHIM_AUTOPATCH", "").strip().lower() not in '
    '("", "0", "false", "no", "off") and __import__("runpy").run_path(os.path.join(os.path.dirname('
    '__import__("importlib.util").util.find_spec("tpushim").origin), "_autopatch.py"))["start"]()\n'
)


def write_autopatch_pth(directory):
    path = os.path.join(directory, AUTOPATCH_PTH)
    os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(AUTOPATCH_LINE)
    return path


class BuildPyWithPth(build_py):
    """build_py that also puts tpushim-autopatch.pth at the top of the build (site-packages)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            # An editable wheel (pip install -e, setuptools >= 64) installs its unpacked root, not
            # build_lib; while building one, setuptools points install_lib at that root.
            write_autopatch_pth(self.get_finalized_command("install").install_lib)
        else:
            write_autopatch_pth(self.build_lib)

    def get_outputs(self, *args, **kwargs):
        outputs = super().get_outputs(*args, **kwargs)
        if getattr(self, "editable_mode", False):
            return outputs
        return outputs + [os.path.join(self.build_lib, AUTOPATCH_PTH)]


class DevelopWithPth(develop):
    """Legacy ``setup.py develop`` (older pip and setuptools < 80): the .pth into site-packages."""

    def run(self):
        super().run()
        install_dir = getattr(self, "install_dir", None)  # setuptools >= 80 delegates to pip
        if install_dir and getattr(self, "egg_link", None):
            pth = os.path.join(install_dir, AUTOPATCH_PTH)
            if getattr(self, "uninstall", False):
                if os.path.exists(pth):
                    os.remove(pth)
            else:
                write_autopatch_pth(install_dir)


setup(cmdclass={"build_py": BuildPyWithPth, "develop": DevelopWithPth})
