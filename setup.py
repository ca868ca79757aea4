"""Package discovery for the folder -> import-name mapping in pyproject.toml.

``envs/`` installs as ``agentrl_envs`` and ``tools/`` as ``agentrl_tools``; everything else is
declared in pyproject.toml.
"""

from setuptools import find_packages, setup

FOLDERS = {"agentrl": "agentrl", "agentrl_envs": "envs", "agentrl_tools": "tools"}

packages = []
for import_name, folder in FOLDERS.items():
    packages.append(import_name)
    packages += [f"{import_name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages)
