"""tpushim packaging. The version is read from tpushim/version.py without importing the package."""

import os
import re

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def read_version():
    with open(os.path.join(HERE, "tpushim", "version.py"), encoding="utf-8") as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def read_readme():
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        return f.read()


setup(
    name="tpushim",
    version=read_version(),
    description="Legacy Keras -> Estimator scripts train on a Cloud TPU with one added line.",
    long_description=read_readme(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["tpushim", "tpushim.*"]),
    python_requires=">=3.9",
    # wrapt 1.11 has FunctionWrapper, post-import hooks and @wrapt.decorator as tpushim uses them.
    install_requires=["wrapt>=1.11"],
    extras_require={
        # TensorFlow is the user's own (a TPU VM's, Colab's, tensorflow or tensorflow-cpu); these
        # make it one command. < 2.16: TensorFlow 2.16 removed estimators.
        "tensorflow": ["tensorflow>=2.9,<2.16"],
        "cpu": ["tensorflow-cpu>=2.9,<2.16"],
        "test": ["pytest>=7", "ipython>=7", "nbclient>=0.5", "nbformat>=5", "ipykernel>=6"],
        "notebooks": ["nbclient>=0.5", "nbformat>=5", "ipykernel>=6", "matplotlib>=3"],
    },
    license="Apache-2.0",
    classifiers=[
        "Programming Language :: Python :: 3",
        "License :: OSI Approved :: Apache Software License",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
