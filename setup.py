"""Packaging map: the repository keeps callbacks/, loggers/ and strategies/ at its root (the project layout), and
the distribution installs them as trainer.callbacks, trainer.loggers and trainer.strategies, so no top-level
name of ours can collide with a user's file or another project (everything else is in pyproject.toml). The one other
top-level name, trainwright (the distribution's), is an alias of trainer for projects with a trainer.py of their own."""
from setuptools import find_packages, setup

SIBLINGS = ("callbacks", "loggers", "strategies")

packages = find_packages(include=["trainer", "trainer.*"]) + ["trainwright"]  # the second import name, an alias
package_dir = {}
for sibling in SIBLINGS:
    for package in find_packages(include=[sibling, sibling + ".*"]):
        packages.append("trainer." + package)
    package_dir["trainer." + sibling] = sibling

setup(packages=packages, package_dir=package_dir, package_data={"trainer": ["py.typed"]})
