"""Package discovery for the folder -> import-name mapping in pyproject.toml.

``envs/`` installs as ``agentrl_envs`` and ``tools/`` as ``agentrl_tools``; everything else is
declared in pyproject.toml. Folders that hold only package data (the viewer's static files, the
shipped checkpoints, Harbor task folders) are listed as namespace packages, as setuptools asks:
otherwise every build warns that it would ignore them.
"""

from setuptools import find_namespace_packages, setup

FOLDERS = {"agentrl": "agentrl", "agentrl_envs": "envs", "agentrl_tools": "tools"}

packages = []
for import_name, folder in FOLDERS.items():
    packages.append(import_name)
    packages += [f"{import_name}.{sub}" for sub in find_namespace_packages(folder, exclude=["*__pycache__*"])]

setup(packages=packages)
