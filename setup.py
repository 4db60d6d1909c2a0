"""tpushim packaging. The version and the supported TensorFlow range come from tpushim/version.py,
run by path: the package itself is not imported."""

import os
import runpy

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.command.develop import develop

HERE = os.path.dirname(os.path.abspath(__file__))

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


VERSION = runpy.run_path(os.path.join(HERE, "tpushim", "version.py"))


def read_readme():
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        return f.read()


setup(
    name="tpushim",
    version=VERSION["__version__"],
    description="Legacy Keras -> Estimator scripts train on a Cloud TPU with one added line.",
    long_description=read_readme(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["tpushim", "tpushim.*"]),
    python_requires=">=3.9",
    # wrapt 1.11 has FunctionWrapper, post-import hooks and @wrapt.decorator as tpushim uses them.
    install_requires=["wrapt>=1.11"],
    extras_require={
        # TensorFlow is the user's own (a TPU VM's, Colab's, tensorflow or tensorflow-cpu); these
        # make it one command, in the range version.py declares (TF 2.16 removed estimators).
        "tensorflow": ["tensorflow" + VERSION["tf_specifier"]()],
        "cpu": ["tensorflow-cpu" + VERSION["tf_specifier"]()],
        # matplotlib: tests/test_notebooks.py executes the notebooks, which plot. pandas: the
        # pandas_input_fn tests.
        "test": [
            "pytest>=7",
            "ipython>=7",
            "nbclient>=0.5",
            "nbformat>=5",
            "ipykernel>=6",
            "matplotlib>=3",
            "pandas>=1.3",
        ],
        "notebooks": ["nbclient>=0.5", "nbformat>=5", "ipykernel>=6", "matplotlib>=3"],
    },
    cmdclass={"build_py": BuildPyWithPth, "develop": DevelopWithPth},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
